"""What a launcher that loses a race to another launcher writes: the request taken by
another's transaction, a request lock held by another's contender, the room freed at quota
that an older request of another launcher waits for, a guard another launcher bumped.
Other launchers are played in the same real ZooKeeper; the pool worker's pass is stepped
on a ManualClock."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Callable

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.launcher import lifecycle, plan
from nodepool_k8s.launcher.pool_worker import CONTENDED_RETRY, PoolWorker
from nodepool_k8s.launcher.requests.allocation import Allocator, Slot, create_guarded
from nodepool_k8s.launcher.requests.batch import copy_request
from nodepool_k8s.launcher.requests.handler import HandlerState
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.client import Stat
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.registry import pool_worker_id
from nodepool_k8s.zk.txn import Txn
from tests.helpers import Signal, wait_for
from tests.launcher.requests.conftest import MakeDeps
from tests.launcher.requests.support import InlineLaunches, ReadThroughRequests, WorkerDeps
from tests.launcher.requests.test_pool_worker import MakeWorkerDeps, state, worker_for
from tests.zk.support import drained

PEER = pool_worker_id("fake", "main", "other-host")


class StaleRequests(ReadThroughRequests):
    """A request cache that has not seen the latest writes of some requests yet."""

    def __init__(self, fresh: ReadThroughRequests, stale: list[NodeRequest]) -> None:
        super().__init__(fresh.zk, fresh.store)
        self.stale = {r.id: r for r in stale}

    def get(self, request_id: str) -> NodeRequest | None:
        return self.stale.get(request_id) or super().get(request_id)

    def requests(self) -> list[NodeRequest]:
        return [self.stale.get(r.id, r) for r in super().requests()]


def lock_stat(deps: WorkerDeps, request_id: str) -> Stat | None:
    return deps.zk.exists(paths.request_lock_path(request_id))


def taken_by_peer(deps: WorkerDeps, request_id: str,
                  waiting: plan.Waiting | None = None) -> None:
    """Another launcher locks the request, writes it `pending` (noting why it waits, if
    `waiting`) and keeps the lock."""
    cached = deps.requests.get(request_id)
    assert cached is not None
    fresh = copy_request(cached)
    fresh.state = model.RequestState.PENDING
    if waiting is not None:
        lifecycle.note_waiting(fresh, PEER, waiting)
    assert deps.requests.store_fresh(fresh, release=False) is not None


def test_a_request_another_launcher_took_costs_one_failed_write_however_stale_the_cache(
        make_worker_deps: MakeWorkerDeps) -> None:
    """Our transaction fails on the winner's lock dir; one read shows it `pending`; the
    passes that still see the cache's `requested` copy skip it without writing (they
    used to send the transaction again and contend for the lock)."""
    deps = make_worker_deps()
    worker, launches = worker_for(deps)
    worker.run_once()  # registration and status written before counting
    request_id = deps.submit(["small"])
    stale = deps.requests.get(request_id)
    assert stale is not None
    taken_by_peer(deps, request_id)
    deps.request_cache = StaleRequests(deps.request_cache, [stale])
    before, lock_dir = deps.zk.writes.snapshot()[0], lock_stat(deps, request_id)
    assert lock_dir is not None

    for _ in range(3):
        worker.run_once()

    assert deps.zk.writes.snapshot()[0] - before == 1
    after = lock_stat(deps, request_id)
    assert after is not None and after.cversion == lock_dir.cversion  # no contender came
    assert worker.handlers == {} and launches.in_flight == 0
    assert state(deps, request_id) == model.RequestState.PENDING


def test_a_lock_held_by_another_contender_is_not_contended(
        make_worker_deps: MakeWorkerDeps) -> None:
    """A request still `requested` whose lock another client holds: the lock dir is
    listed, nothing is written, and the pass comes back shortly."""
    deps = make_worker_deps()
    worker, launches = worker_for(deps)
    worker.run_once()
    request_id = deps.submit(["small"])
    elsewhere = deps.requests.lock(request_id)
    assert elsewhere is not None
    before, lock_dir = deps.zk.writes.snapshot()[0], lock_stat(deps, request_id)
    assert lock_dir is not None

    assert worker.run_once() == deps.clock.monotonic() + CONTENDED_RETRY
    assert worker.run_once() == deps.clock.monotonic() + CONTENDED_RETRY

    # The first pass tried the one-transaction lock (it cannot know the dir exists).
    assert deps.zk.writes.snapshot()[0] - before == 1
    after = lock_stat(deps, request_id)
    assert after is not None and after.cversion == lock_dir.cversion
    elsewhere.release()
    worker.run_once()
    assert state(deps, request_id) == model.RequestState.PENDING and launches.in_flight == 1


def free_the_node(deps: WorkerDeps) -> None:
    [node_id] = [n.id for n in deps.node_cache.nodes()]
    got = deps.nodes.lock_and_read(node_id)
    assert got is not None
    assert deps.nodes.delete(got[1], got[0])


def room_freed_while_a_peer_holds(deps: WorkerDeps, peer_priority: str
                                  ) -> tuple[PoolWorker, InlineLaunches, str]:
    """max-servers 1 and a peer launcher in the pool: our first request's node fills the
    quota, our second waits at quota, the peer holds a request of `peer_priority` (older
    or younger than ours) waiting for room; then our first node goes. Returns our worker,
    its launches and the waiting request, before the pass that sees the room."""
    worker, launches, first, second = at_quota_beside_a_paused_peer(deps)
    peers = deps.submit(["small"], priority=peer_priority)
    taken_by_peer(deps, peers, plan.Waiting("WaitingForQuota", "waits for room"))
    launches.run_all()
    assert state(deps, first) == model.RequestState.FULFILLED
    free_the_node(deps)
    return worker, launches, second


def test_at_quota_room_goes_first_to_an_older_request_another_launcher_holds(
        make_worker_deps: MakeWorkerDeps) -> None:
    """Both launchers of the pool see the node go; the one holding the younger request
    lets the older one's launcher create first (each trying would fail all but one on
    the guard), and tries itself after `quota_yield` if the room is still there."""
    deps = make_worker_deps(max_servers=1)
    worker, launches, second = room_freed_while_a_peer_holds(deps, "100")
    guard = deps.zk.exists(paths.provider_guard_path("fake"))
    assert guard is not None

    wait = deps.settings.quota_yield
    assert wait > 0
    assert worker.run_once() == deps.clock.monotonic() + wait
    assert worker.handlers[second].state is HandlerState.AT_QUOTA
    assert deps.node_cache.nodes() == []
    now = deps.zk.exists(paths.provider_guard_path("fake"))
    assert now is not None and now.version == guard.version  # no guarded create sent

    deps.clock.advance(wait)  # the older one's launcher did not use the room: ours does
    worker.run_once()
    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1


def test_with_quota_yield_0_every_waiting_launcher_tries_at_once(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps(max_servers=1)
    deps.settings = deps.settings.replace(quota_yield=0)
    worker, launches, second = room_freed_while_a_peer_holds(deps, "100")

    worker.run_once()
    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1


def test_a_younger_request_of_another_launcher_does_not_hold_ours_back(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps(max_servers=1)
    worker, launches, second = room_freed_while_a_peer_holds(deps, "200")

    worker.run_once()
    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1


def test_the_waiting_note_goes_in_the_transaction_that_creates_the_nodes(
        make_worker_deps: MakeWorkerDeps) -> None:
    """A request that waited at quota drops its note in its guarded create (the request's
    write and the guard's bump share one zxid), not in a write of its own."""
    deps = make_worker_deps(max_servers=1)
    worker, launches = worker_for(deps)
    deps.submit(["small"])
    worker.run_once()
    second = deps.submit(["small"])
    worker.run_once()
    waiting = deps.requests.get(second)
    assert waiting is not None and lifecycle.waiting_note(waiting, worker.id) is not None
    launches.run_all()
    free_the_node(deps)

    worker.run_once()

    assert worker.handlers[second].state is HandlerState.ACTIVE
    got = deps.zk.get(paths.request_path(second))
    assert got is not None
    request = deps.requests.get(second)
    assert request is not None and lifecycle.waiting_note(request, worker.id) is None
    guard = deps.zk.exists(paths.provider_guard_path("fake"))  # bumped by that create only
    assert guard is not None and got[1].mzxid == guard.mzxid
    assert worker.handlers[second].request.version == request.version
    launches.run_all()
    assert state(deps, second) == model.RequestState.FULFILLED


def test_a_guard_another_launcher_bumped_is_read_before_the_commit(
        make_deps: MakeDeps) -> None:
    """Our last commit's listing is reused only while the cache shows no node created
    since by anyone else: otherwise the commit would fail on the guard (a failed write)
    before the decision is made again."""
    deps = make_deps()
    first_request, first_lock = deps.accept(deps.submit(["small"]))
    second_request, second_lock = deps.accept(deps.submit(["small"]))
    log = logging.LoggerAdapter(logging.getLogger("test"), {})
    provider_cfg = deps.config.providers["fake"]
    pool_cfg = provider_cfg.pools["main"]
    first = Allocator(deps, deps.ref, deps.provider,  # type: ignore[arg-type]
                      first_request, first_lock, log)
    assert create_guarded(deps, [(first, [Slot(0, "small")])], provider_cfg, pool_cfg)[0] == 1
    # Another launcher creates a node under the same guard.
    guard = paths.provider_guard_path("fake")
    version = deps.zk.exists(guard)
    assert version is not None
    other = first.new_node("small", pool_cfg)
    txn = Txn()
    txn.set(guard, b"", version=version.version)
    NodeStore.add_create(txn, other)
    txn.commit(deps.zk)
    second = Allocator(deps, deps.ref, deps.provider,  # type: ignore[arg-type]
                       second_request, second_lock, log)
    before = deps.zk.writes.snapshot()[0]

    assert create_guarded(deps, [(second, [Slot(0, "small")])], provider_cfg,
                          pool_cfg)[0] == 1

    assert deps.zk.writes.snapshot()[0] - before == 1  # the commit, no failed one first


def room_freed_for_a_waiting_request(deps: WorkerDeps
                                     ) -> tuple[PoolWorker, InlineLaunches, str]:
    """max-servers 1: our first request's node fills the quota, our second waits at quota
    with its note; then the first node goes. Returns our worker, its launches and the
    waiting request, before the pass that sees the room."""
    worker, launches = worker_for(deps)
    deps.submit(["small"])
    worker.run_once()
    second = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    free_the_node(deps)
    return worker, launches, second


def test_a_request_the_requestor_revised_meanwhile_gets_its_nodes_and_keeps_the_revision(
        make_worker_deps: MakeWorkerDeps) -> None:
    """Zuul revised the waiting request's relative priority: the create that carried the
    note fails on the request's version, the revision is adopted and the nodes are created
    without the note, which goes in a write of its own."""
    deps = make_worker_deps(max_servers=1)
    worker, launches, second = room_freed_for_a_waiting_request(deps)
    got = deps.zk.get(paths.request_path(second))
    assert got is not None
    revised = request_codec.decode(second, got[0], got[1].version)
    revised.relative_priority = 7
    deps.zk.set(paths.request_path(second), request_codec.encode(revised), got[1].version)

    worker.run_once()

    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1
    request = deps.requests.get(second)
    assert request is not None and request.relative_priority == 7
    assert lifecycle.waiting_note(request, worker.id) is None
    launches.run_all()
    done = deps.requests.get(second)
    assert done is not None and done.state == model.RequestState.FULFILLED
    assert done.relative_priority == 7


class NotSeenGone(StaleRequests):
    """A request cache that still shows some deleted requests."""

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.stale or super().__contains__(request_id)


def test_a_waiting_request_the_requestor_deleted_meanwhile_fails_no_pass(
        make_worker_deps: MakeWorkerDeps) -> None:
    """Zuul cancelled the waiting request (deleted it) just before room freed: the create
    that carried its note fails on the request, and the pass decides again without the
    note instead of failing; the handler then finds the request gone, as at any moment."""
    deps = make_worker_deps(max_servers=1)
    worker, launches, second = room_freed_for_a_waiting_request(deps)
    waiting = deps.requests.get(second)
    assert waiting is not None and lifecycle.waiting_note(waiting, worker.id) is not None
    deps.zk.delete(paths.request_path(second))
    # The cache has not seen the deletion yet (its event is on the way).
    deps.request_cache = NotSeenGone(deps.request_cache, [waiting])  # type: ignore[assignment]

    worker.run_once()  # raised NoNodeError out of the pass before
    deps.request_cache = ReadThroughRequests(deps.zk, deps.requests)  # type: ignore[assignment]
    launches.run_all()
    worker.run_once()

    assert second not in worker.handlers or worker.handlers[second].done
    assert all(node.allocated_to != second for node in deps.node_cache.nodes())


def test_a_request_another_session_holds_costs_no_lock_attempt(
        make_worker_deps: MakeWorkerDeps, kazoo_client: KazooClient) -> None:
    """With a request cache that follows the request locks, a request whose lock dir shows
    another's contender is left alone: no transaction, no lock attempt, no listing, no
    retry timer; the lock's release wakes the pool, which then takes it."""
    deps = make_worker_deps()
    cache = RequestCache(deps.zk)
    cache.start()
    try:
        assert cache.wait_synced(10) and cache.follows_locks()
        deps.request_cache = cache
        worker, launches = worker_for(deps)
        worker.run_once()
        changes = Signal().listen(cache)
        request_id = deps.submit(["small"])
        contender = kazoo_client.create(
            f"{paths.request_lock_path(request_id)}/{uuid.uuid4().hex}"
            f"{paths.LOCK_NODE_NAME}", ephemeral=True, sequence=True, makepath=True)
        changes.until(lambda: request_id in cache and cache.is_locked(request_id), 10)
        before = deps.zk.writes.snapshot()[0]
        lock_dir = lock_stat(deps, request_id)
        assert lock_dir is not None

        assert worker.run_once() != deps.clock.monotonic() + CONTENDED_RETRY
        worker.run_once()

        assert deps.zk.writes.snapshot()[0] - before == 0
        after = lock_stat(deps, request_id)
        assert after is not None and after.cversion == lock_dir.cversion
        assert worker.handlers == {} and launches.in_flight == 0
        kazoo_client.delete(contender)
        changes.until(lambda: not cache.is_locked(request_id), 10)
        worker.run_once()
        assert state(deps, request_id) == model.RequestState.PENDING
        assert launches.in_flight == 1
    finally:
        cache.stop()


def waiting_beside_a_paused_peer(deps: WorkerDeps, cache: RequestCache
                                 ) -> tuple[PoolWorker, InlineLaunches, str, str]:
    """`at_quota_beside_a_paused_peer` with `cache` started."""
    assert cache.wait_synced(10) and cache.follows_locks()
    return at_quota_beside_a_paused_peer(deps)


def at_quota_beside_a_paused_peer(deps: WorkerDeps
                                  ) -> tuple[PoolWorker, InlineLaunches, str, str]:
    """max-servers 1 and a paused peer of the pool registered: our first request's node
    fills the quota and our second waits at quota. Returns our worker, its launches and
    the two requests."""
    peer = plan.PoolInfo(PEER, "fake", frozenset({"small", "other"}), 100, True)
    deps.registered_pools = lambda: [peer]  # type: ignore[method-assign]
    worker, launches = worker_for(deps)
    first = deps.submit(["small"])
    worker.run_once()
    second = deps.submit(["small"])
    worker.run_once()
    assert worker.handlers[second].state is HandlerState.AT_QUOTA
    return worker, launches, first, second


def yields_until_the_peer_resumes(deps: WorkerDeps, worker: PoolWorker,
                                  launches: InlineLaunches, cache: RequestCache, first: str,
                                  second: str, unread: Callable[[], bool]) -> None:
    """Our first request's node goes while our second waits at quota and a paused peer
    holds an older request the cache has not read (`unread()` says so): the pass that sees
    the room yields (no guarded create, no read); once the peer's registration no longer
    says paused, ours goes at once, still without reading the older request."""
    launches.run_all()
    assert state(deps, first) == model.RequestState.FULFILLED
    free_the_node(deps)
    deps.request_cache = cache
    drained(cache._mirror)
    reads, guard = cache._mirror.reads, deps.zk.exists(paths.provider_guard_path("fake"))
    assert guard is not None

    wait = deps.settings.quota_yield
    assert worker.run_once() == deps.clock.monotonic() + wait
    assert worker.handlers[second].state is HandlerState.AT_QUOTA
    now = deps.zk.exists(paths.provider_guard_path("fake"))
    assert now is not None and now.version == guard.version  # no guarded create sent
    drained(cache._mirror)
    assert cache._mirror.reads == reads and unread()

    resumed = plan.PoolInfo(PEER, "fake", frozenset({"small", "other"}), 100, False)
    deps.registered_pools = lambda: [resumed]  # type: ignore[method-assign]
    worker.run_once()
    assert worker.handlers[second].state is HandlerState.ACTIVE
    assert launches.in_flight == 1
    drained(cache._mirror)
    assert unread()  # still never read


def test_the_yield_reads_no_request_another_launcher_holds(
        make_worker_deps: MakeWorkerDeps, kazoo_client: KazooClient) -> None:
    """With a request cache that follows the request locks, the older request a paused
    peer holds (locked, `pending` with its `WaitingForQuota` note written under the lock,
    both left unread) holds ours back when room frees, and no request is read for it:
    the peer's registration (paused) and what the cache knows (older, someone else's
    lock, no node yet) answer. Once the peer's registration no longer says paused, ours
    goes at once, again without a read."""
    deps = make_worker_deps(max_servers=1)
    cache = RequestCache(deps.zk)
    cache.start()
    try:
        worker, launches, first, second = waiting_beside_a_paused_peer(deps, cache)
        changes = Signal().listen(cache)
        older = deps.submit(["small"], priority="100")
        changes.until(lambda: older in cache, 10)
        # The peer takes it: its contender, then its `pending` write with the note.
        kazoo_client.create(f"{paths.request_lock_path(older)}/{uuid.uuid4().hex}"
                            f"{paths.LOCK_NODE_NAME}", ephemeral=True, sequence=True,
                            makepath=True)
        changes.until(lambda: cache.held_elsewhere(older), 10)
        fresh = cache.get(older)
        assert fresh is not None
        fresh = copy_request(fresh)
        fresh.state = model.RequestState.PENDING
        lifecycle.note_waiting(fresh, PEER, plan.Waiting("WaitingForQuota", "waits"))
        kazoo_client.set(paths.request_path(older), request_codec.encode(fresh))
        wait_for(lambda: cache.is_stale(older), 10)
        yields_until_the_peer_resumes(deps, worker, launches, cache, first, second,
                                      lambda: cache.is_stale(older))
    finally:
        cache.stop()


def test_an_older_request_never_read_here_still_holds_ours_back(
        make_worker_deps: MakeWorkerDeps, kazoo_client: KazooClient) -> None:
    """The older request a paused peer holds was left to the peer's first look and never
    read here (zk/mirror.py, "First look"): what its id says (older), the cache's lock
    knowledge (someone else's) and the node cache (no node yet) hold ours back when room
    frees, with no read; once the peer's registration no longer says paused, ours goes."""
    deps = make_worker_deps(max_servers=1)
    cache = RequestCache(deps.zk)
    cache.first_look = lambda request_id: 60.0 if request_id.startswith("100-") else 0.0
    cache.start()
    try:
        worker, launches, first, second = waiting_beside_a_paused_peer(deps, cache)
        changes = Signal().listen(cache)
        # Created by Zuul (another session): this process's own creations are echoed.
        older = kazoo_client.create(
            f"{paths.REQUESTS}/100-", json.dumps({"state": "requested", "node_types":
                                                  ["small"], "requestor": "zuul"}).encode(),
            sequence=True).rsplit("/", 1)[1]
        wait_for(lambda: older in cache, 10, message="its creation seen")
        assert cache.get(older) is None and cache.unread() == [older]
        kazoo_client.create(f"{paths.request_lock_path(older)}/{uuid.uuid4().hex}"
                            f"{paths.LOCK_NODE_NAME}", ephemeral=True, sequence=True,
                            makepath=True)
        changes.until(lambda: cache.held_elsewhere(older), 10)
        yields_until_the_peer_resumes(deps, worker, launches, cache, first, second,
                                      lambda: cache.unread() == [older])
    finally:
        cache.stop()


class HeldElsewhere(ReadThroughRequests):
    """A read-through request cache that follows locks, showing the `held` requests in
    someone else's lock dir."""

    def __init__(self, fresh: ReadThroughRequests, held: list[str]) -> None:
        super().__init__(fresh.zk, fresh.store)
        self.held = set(held)

    def follows_locks(self) -> bool:
        return True

    def is_locked(self, request_id: str) -> bool:
        return request_id in self.held

    def held_elsewhere(self, request_id: str) -> bool:
        return request_id in self.held


def test_an_older_request_a_peer_already_builds_for_does_not_hold_ours_back(
        make_worker_deps: MakeWorkerDeps) -> None:
    """With locks followed, a paused peer's older request whose node is already in the
    node cache does not wait for quota: ours takes the room at once."""
    deps = make_worker_deps(max_servers=2)
    deps.registered_pools = lambda: [  # type: ignore[method-assign]
        plan.PoolInfo(PEER, "fake", frozenset({"small", "other"}), 100, True)]
    worker, launches = worker_for(deps)
    first = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    older = deps.submit(["small"], priority="100")
    taken_by_peer(deps, older)
    held = deps.requests.get(older)
    assert held is not None
    peer_node = Allocator(deps, deps.ref, deps.provider,  # type: ignore[arg-type]
                          held, None, logging.LoggerAdapter(logging.getLogger("test"), {})
                          ).new_node("small", deps.config.providers["fake"].pools["main"])
    txn = Txn()
    NodeStore.add_create(txn, peer_node)
    txn.commit(deps.zk)
    second = deps.submit(["small"])
    worker.run_once()
    assert worker.handlers[second].state is HandlerState.AT_QUOTA
    deps.request_cache = HeldElsewhere(deps.request_cache, [older])  # type: ignore[assignment]
    [ours] = [n.id for n in deps.node_cache.nodes() if n.allocated_to == first]
    got = deps.nodes.lock_and_read(ours)
    assert got is not None and deps.nodes.delete(got[1], got[0])

    worker.run_once()

    assert worker.handlers[second].state is HandlerState.ACTIVE and launches.in_flight == 1
