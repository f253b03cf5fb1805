"""A pool that cannot serve the requests it holds hands them back, stepped on a
ManualClock against a real ZooKeeper (the pool worker's pass, launches run by the test).

Aspects:
- its provider's API server cannot be used: no launch starts, the pool registers paused,
  and after `hand-back-after` the request is declined with `HandedBack` (its running
  launch cancelled), so another registered pool takes it; its label is then declined
  (`RecentlyFailed`) while remembered, and served here again once forgotten;
- no other pool could serve it: it stays, saying why (`waiting_reasons`), and goes on
  when the provider is healthy again;
- an operator pauses the pool while a request waits in it at quota: handed back too; the
  request being launched is not;
- the cluster keeps refusing a request's launches for quota: handed back once that has
  lasted `hand-back-after` (across its retries), not before.
"""

from __future__ import annotations

from typing import Callable

from nodepool_k8s.config.model import PoolConfig
from nodepool_k8s.core import model
from nodepool_k8s.core.errors import QuotaExceeded
from nodepool_k8s.core.pool_records import CapacityCondition, ConditionRecord
from nodepool_k8s.driver.base import ProviderHealth
from nodepool_k8s.launcher import lifecycle
from nodepool_k8s.launcher.plan import PoolInfo
from nodepool_k8s.launcher.pool_worker import PoolWorker
from nodepool_k8s.runtime.stats import PROM_HANDED_BACK
from nodepool_k8s.zk.pool_state import PAUSE, PoolState
from tests.launcher.requests.support import InlineLaunches, WorkerDeps
from tests.launcher.requests.test_pool_worker import registered_paused, state, worker_for

MakeWorkerDeps = Callable[..., WorkerDeps]
OTHER = PoolInfo("elsewhere-PoolWorker.far-main-x", "far", frozenset({"small", "other"}),
                 priority=200)
HAND_BACK_AFTER = 10.0  # the default (config/schema.py)


class Cluster:
    """What the pool worker asks a cluster-aware provider; the API health set by the test."""

    def __init__(self) -> None:
        self.health = ProviderHealth(True, "Reachable", "the API server answers")

    def api_health(self) -> ProviderHealth | None:
        return self.health

    def capacity_condition(self, pool: PoolConfig) -> CapacityCondition | None:
        return None

    def credentials_condition(self) -> ConditionRecord | None:
        return None

    def freeze(self) -> None:
        self.health = ProviderHealth(False, "Unreachable", "read timed out", 0.0)


def setup(make_worker_deps: MakeWorkerDeps, others: list[PoolInfo], **options: object
          ) -> tuple[WorkerDeps, PoolWorker, InlineLaunches, Cluster]:
    deps = make_worker_deps(**options)
    cluster = Cluster()
    deps.cluster_aware["fake"] = cluster
    deps.registered_pools = lambda: list(others)  # type: ignore[method-assign]
    worker, launches = worker_for(deps)
    return deps, worker, launches, cluster


def declined_reason(deps: WorkerDeps, request_id: str, pool_id: str) -> str | None:
    request = deps.requests.get(request_id)
    assert request is not None
    return lifecycle.declined_reasons(request).get(pool_id, {}).get("reason")


def waiting_reason(deps: WorkerDeps, request_id: str, pool_id: str) -> str | None:
    request = deps.requests.get(request_id)
    assert request is not None
    note = lifecycle.waiting_note(request, pool_id)
    return note["reason"] if note else None


def handed_back(deps: WorkerDeps, reason: str) -> float:
    return sum(v for (name, labels), v in deps.stats.counters().items()
               if name == PROM_HANDED_BACK and ("reason", reason) in labels)


def test_an_unhealthy_provider_hands_its_requests_to_another_pool(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps, worker, launches, cluster = setup(make_worker_deps, [OTHER])
    launching = deps.submit(["small"])
    worker.run_once()
    assert launches.in_flight == 1  # its launch hangs on the cluster
    cluster.freeze()

    due = worker.run_once()
    assert registered_paused(worker)  # the other pool no longer yields to this one
    assert state(deps, launching) == model.RequestState.PENDING
    assert due == deps.clock.monotonic() + HAND_BACK_AFTER
    held = deps.submit(["small"])
    worker.run_once()
    assert state(deps, held) == model.RequestState.REQUESTED  # not accepted while so
    assert launches.in_flight == 1

    deps.clock.advance(HAND_BACK_AFTER)
    worker.run_once()  # cancels the launch; declines once it returned
    assert state(deps, launching) == model.RequestState.PENDING
    launches.run_all()
    worker.run_once()
    assert state(deps, launching) == model.RequestState.REQUESTED
    assert declined_reason(deps, launching, worker.id) == "HandedBack"
    assert worker.handlers == {}
    assert handed_back(deps, "ProviderUnhealthy") == 1
    [node] = [n for n in deps.node_cache.nodes() if n.id]
    assert node.state == model.NodeState.FAILED  # cleanup deletes it (and its resource)

    # Healthy again: a request of the label handed back goes elsewhere while remembered...
    cluster.health = ProviderHealth(True, "Reachable", "the API server answers")
    fresh = deps.submit(["small"])
    worker.run_once()
    assert declined_reason(deps, fresh, worker.id) == "RecentlyFailed"
    assert declined_reason(deps, held, worker.id) == "RecentlyFailed"
    # ...and is served here again once forgotten (recently-failed-ttl, 120 s by default).
    deps.clock.advance(120.0)
    again = deps.submit(["small"])
    worker.run_once()
    assert state(deps, again) == model.RequestState.PENDING


def test_without_another_pool_the_request_waits_saying_why(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps, worker, launches, cluster = setup(make_worker_deps, [])
    cluster.freeze()
    waiting = deps.submit(["small"])
    worker.run_once()
    assert state(deps, waiting) == model.RequestState.REQUESTED
    assert waiting_reason(deps, waiting, worker.id) == "ProviderUnhealthy"

    deps.clock.advance(10 * HAND_BACK_AFTER)
    worker.run_once()
    assert state(deps, waiting) == model.RequestState.REQUESTED
    assert not (deps.requests.get(waiting) or model.NodeRequest("x")).declined_by
    assert launches.in_flight == 0

    cluster.health = ProviderHealth(True, "Reachable", "the API server answers")
    worker.run_once()
    launches.run_all()
    assert state(deps, waiting) == model.RequestState.FULFILLED


def test_a_paused_pool_hands_back_what_waits_in_it_not_what_it_launches(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps, worker, launches, _ = setup(make_worker_deps, [OTHER], max_servers=1)
    launching = deps.submit(["small"])
    waiting = deps.submit(["small"], reuse=False)
    worker.run_once()
    assert launches.in_flight == 1 and worker.handlers[waiting].paused
    deps.pool_states.states.append(PoolState("fake/main", PAUSE, reason="upgrade",
                                             by="ops"))
    worker.run_once()
    assert state(deps, waiting) == model.RequestState.PENDING
    deps.clock.advance(HAND_BACK_AFTER)
    worker.run_once()
    assert state(deps, waiting) == model.RequestState.REQUESTED
    assert declined_reason(deps, waiting, worker.id) == "HandedBack"
    assert handed_back(deps, "PoolPaused") == 1
    launches.run_all()
    assert state(deps, launching) == model.RequestState.FULFILLED


def test_a_request_the_cluster_keeps_refusing_for_quota_is_handed_back(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps, worker, launches, _ = setup(make_worker_deps, [OTHER])
    deps.provider.fail_next(10, QuotaExceeded("exceeded quota: compute-resources"))
    refused = deps.submit(["small"])
    worker.run_once()
    launches.run_all()  # aborted: the handler backs off for quota-retry (30 s here)
    due = worker.run_once()
    assert worker.handlers[refused].paused
    assert due == deps.clock.monotonic() + HAND_BACK_AFTER
    deps.clock.advance(HAND_BACK_AFTER - 1)
    worker.run_once()
    assert state(deps, refused) == model.RequestState.PENDING
    deps.clock.advance(1)
    worker.run_once()
    assert state(deps, refused) == model.RequestState.REQUESTED
    assert declined_reason(deps, refused, worker.id) == "HandedBack"
    assert handed_back(deps, "LaunchBackoff") == 1
