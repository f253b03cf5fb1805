"""The pool worker's pass on its own: `run_once` is one pass over the requests in
ZooKeeper, launches finish when the test says so, time moves with the ManualClock."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from nodepool_k8s.core import model
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.launcher import plan
from nodepool_k8s.launcher.pool_worker import CONTENDED_RETRY, PoolWorker
from nodepool_k8s.launcher.requests.handler import HandlerState
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from tests.launcher.requests.support import SETTINGS, InlineLaunches, WorkerDeps

MakeWorkerDeps = Callable[..., WorkerDeps]


def worker_for(deps: WorkerDeps) -> tuple[PoolWorker, InlineLaunches]:
    launches = InlineLaunches()
    worker = PoolWorker(deps, "fake", "main", launches, fqdn="test-host")  # type: ignore[arg-type]
    worker.register()
    return worker, launches


def state(deps: WorkerDeps, request_id: str) -> str:
    request = deps.requests.get(request_id)
    assert request is not None
    return request.state


def registered_paused(worker: PoolWorker) -> bool:
    assert worker.registration is not None and worker.registration.path is not None
    got = worker.engine.zk.get(worker.registration.path)
    assert got is not None
    return bool(json.loads(got[0])["paused"])


def idle(deps: WorkerDeps, worker: PoolWorker, launches: InlineLaunches, label: str) -> str:
    """A ready, unallocated node of `label`: its request was served, then went away."""
    request_id = deps.submit([label])
    worker.run_once()
    launches.run_all()
    [node_id] = [n.id for n in deps.node_cache.nodes() if n.allocated_to == request_id]
    deps.zk.delete(paths.request_path(request_id))
    got = deps.nodes.lock_and_read(node_id)
    assert got is not None
    lock, node = got
    node.set(allocated_to=None)
    deps.nodes.store_and_release(node, lock)
    worker.run_once()
    return node_id


def test_one_pass_accepts_and_launches_every_waiting_request(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps()
    worker, launches = worker_for(deps)
    ids = [deps.submit(["small"]) for _ in range(3)]

    worker.run_once()

    assert [state(deps, i) for i in ids] == [model.RequestState.PENDING] * 3
    assert sorted(worker.handlers) == sorted(ids) and launches.in_flight == 3
    guard = deps.zk.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1  # accepted as one batch
    assert not worker.paused and not registered_paused(worker)

    launches.run_all()  # each launch's return writes its request's final transaction
    assert [state(deps, i) for i in ids] == [model.RequestState.FULFILLED] * 3
    worker.run_once()
    assert worker.handlers == {}


def test_at_quota_the_pool_pauses_and_resumes_when_capacity_frees(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps(max_servers=1)
    worker, launches = worker_for(deps)
    first, second = deps.submit(["small"]), deps.submit(["small"], reuse=False)

    worker.run_once()

    assert worker.handlers[second].state is HandlerState.AT_QUOTA
    assert worker.paused and registered_paused(worker)
    launches.run_all()
    assert state(deps, first) == model.RequestState.FULFILLED
    worker.run_once()
    assert worker.paused and launches.in_flight == 0

    [node_id] = [n.id for n in deps.node_cache.nodes()]
    got = deps.nodes.lock_and_read(node_id)
    assert got is not None
    assert deps.nodes.delete(got[1], got[0])
    worker.run_once()

    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1
    assert not worker.paused and not registered_paused(worker)


def test_a_full_pool_asks_for_the_oldest_idle_node_to_go(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps(max_servers=1)
    worker, launches = worker_for(deps)
    spare = idle(deps, worker, launches, "other")
    deps.submit(["small"])

    worker.run_once()  # accepted, and waiting at the pool's limit
    assert worker.paused and deps.deletions == []

    worker.run_once()  # a pass that starts paused makes room
    assert deps.deletions == [(spare, "making room at quota")]
    worker.run_once()
    assert len(deps.deletions) == 1  # one at a time, every `reclaim_interval`
    deps.clock.advance(SETTINGS.reclaim_interval)
    worker.run_once()
    assert len(deps.deletions) == 2


def test_declines_what_it_can_never_serve(make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps()
    worker, _ = worker_for(deps)
    request_id = deps.submit(["missing"])

    worker.run_once()

    assert state(deps, request_id) == model.RequestState.FAILED  # the only registered pool declined
    request = deps.requests.get(request_id)
    assert request is not None and request.declined_by == [worker.id]
    assert worker.handlers == {}


def test_a_request_locked_elsewhere_is_looked_at_again_shortly(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps()
    worker, launches = worker_for(deps)
    request_id = deps.submit(["small"])
    elsewhere = deps.requests.lock(request_id)
    assert elsewhere is not None

    assert worker.run_once() == deps.clock.monotonic() + CONTENDED_RETRY
    assert state(deps, request_id) == model.RequestState.REQUESTED and worker.handlers == {}

    elsewhere.release()
    worker.run_once()
    assert state(deps, request_id) == model.RequestState.PENDING and launches.in_flight == 1


def test_serves_in_priority_order_as_capacity_frees(make_worker_deps: MakeWorkerDeps) -> None:
    """Precedence, then relative priority (as Zuul last revised it), then age; a request
    waiting at quota goes before anything accepted after it."""
    deps = make_worker_deps(max_servers=1)
    ids = {
        "low": deps.submit(["small"], priority="300"),
        "rel5": deps.submit(["small"], relative_priority=5),
        "rel3": deps.submit(["small"], relative_priority=3),
        "high": deps.submit(["small"], priority="100"),
        "revised": deps.submit(["small"], relative_priority=9),
    }
    # Zuul revises a request's relative priority while nobody holds its lock.
    revised = deps.requests.get(ids["revised"])
    assert revised is not None
    revised.relative_priority = 1
    deps.zk.set(paths.request_path(revised.id), request_codec.encode(revised), revised.version)
    worker, launches = worker_for(deps)
    by_id = {request_id: name for name, request_id in ids.items()}
    order: list[str] = []

    for _ in ids:
        worker.run_once()
        assert launches.run_all() == 1
        [done] = [i for i in ids.values() if by_id[i] not in order
                  and state(deps, i) == model.RequestState.FULFILLED]
        order.append(by_id[done])
        # The build is over: Zuul deletes the request, the node goes.
        deps.zk.delete(paths.request_path(done))
        [node] = [n for n in deps.node_cache.nodes() if n.allocated_to == done]
        got = deps.nodes.lock_and_read(node.id)
        assert got is not None
        assert deps.nodes.delete(got[1], got[0])

    assert order == ["high", "revised", "rel3", "rel5", "low"]


class SlotFreesMidPass(InlineLaunches):
    """A launch that returns while the pass walks the queue: `in_flight` reads as the
    queued launches for the first `busy_reads` reads, then as none."""

    def __init__(self, busy_reads: int) -> None:
        super().__init__()
        self.busy_reads = busy_reads

    @property
    def in_flight(self) -> int:
        if self.busy_reads > 0:
            self.busy_reads -= 1
            return len(self.queued)
        return 0


def test_a_slot_freed_mid_pass_goes_to_the_oldest_request_not_a_later_one(
        make_worker_deps: MakeWorkerDeps) -> None:
    """At max-concurrency the oldest request is held back; a launch that returns while
    the pass is still walking the queue must not hand its slot to a later request."""
    deps = make_worker_deps(max_concurrency=1)
    launches = SlotFreesMidPass(busy_reads=10**6)
    worker = PoolWorker(deps, "fake", "main", launches, fqdn="test-host")  # type: ignore[arg-type]
    worker.register()
    first = deps.submit(["small"])
    worker.run_once()
    assert state(deps, first) == model.RequestState.PENDING and len(launches.queued) == 1
    older, newer = deps.submit(["small"]), deps.submit(["small"])
    # The older request sees the slot taken (both of its checks); then it frees.
    launches.busy_reads = 2
    worker.run_once()

    assert state(deps, newer) == model.RequestState.REQUESTED
    assert state(deps, older) == model.RequestState.REQUESTED
    launches.run_all()
    worker.run_once()
    assert state(deps, older) == model.RequestState.PENDING
    assert state(deps, newer) == model.RequestState.REQUESTED


def test_a_held_back_queue_is_triaged_again_only_when_something_changed(
        make_worker_deps: MakeWorkerDeps, monkeypatch: pytest.MonkeyPatch) -> None:
    """At max-concurrency every waiting request is held back at every pass (a burst makes
    a pass per launch that returns). While nothing about them changed, the passes after
    the first do not triage them again, yet still count them as queued; a request that
    changed, another pool registering, or a label suspended has them decided afresh."""
    deps = make_worker_deps(max_concurrency=1)
    worker, launches = worker_for(deps)
    deps.submit(["small"])
    worker.run_once()  # the one slot taken
    assert len(launches.queued) == 1
    waiting = [deps.submit(["small"]) for _ in range(4)]
    triaged: list[str] = []
    triage = plan.triage

    def counting(request: NodeRequest, *args: Any, **kwargs: Any) -> plan.Decision:
        triaged.append(request.id)
        return triage(request, *args, **kwargs)
    monkeypatch.setattr(plan, "triage", counting)

    for _ in range(3):
        worker.run_once()
        assert worker._held_back_count == 4
    assert sorted(triaged) == sorted(waiting)  # the first of those passes only

    # One request changed (another launcher's pool declined it): that one again.
    request = deps.requests.get(waiting[2])
    assert request is not None
    request.declined_by.append("another-pool")
    deps.requests.store_fresh(request, release=True)
    triaged.clear()
    worker.run_once()
    assert triaged == [waiting[2]] and worker._held_back_count == 4

    # Another pool serving the label registers (not paused): every one again, and none
    # of them counts as queued here any more (that pool would take them).
    other = plan.PoolInfo("other-host-fake-main", "fake", frozenset({"small"}))
    monkeypatch.setattr(deps, "registered_pools", lambda: [other])
    triaged.clear()
    worker.run_once()
    assert sorted(triaged) == sorted(waiting) and worker._held_back_count == 0
    monkeypatch.setattr(deps, "registered_pools", lambda: [])
    worker.run_once()

    # The label is suspended: the held-back requests are declined, not held back again.
    pool_cfg = deps.config.providers["fake"].pools["main"]
    for _ in range(pool_cfg.breaker_threshold):
        worker.breaker.record(pool_cfg.labels["small"], pool_cfg,
                              "LaunchError(ErrImagePull): no such image", deps.clock.time())
    worker.run_once()
    assert all(state(deps, i) == model.RequestState.FAILED for i in waiting)
