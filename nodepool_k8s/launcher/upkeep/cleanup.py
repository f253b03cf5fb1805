"""Cleanup: everything that returns resources and requests after someone stopped caring.

Owns, for nodes of this launcher's providers (decisions in `plan.node_cleanup`):
- deleting unlocked nodes in used / in-use / building / failed / deleting / deleted /
  aborted, stale `init` nodes, ready nodes past `max-ready-age` (oldest first, within the
  pool's `expiry` disruption budget: see disruption.py), held nodes past
  min(`hold_expiration`, `max-hold-age`) (through the deleter). A node another live
  launcher built (its `launcher` is a pool registered by another process) is left to that
  launcher for `delete_grace` seconds in its state, so several launchers do not race (lock
  attempts, failed writes) for every used node; when the builder's registration goes (it
  died: its ephemeral component vanished with its session) the node is ours at once. The
  node cache does not read such a node's changes (Zuul's use and release, the builder's
  de-allocation); an entry left unread and unlocked for `delete_grace` is read then
  (`_read_left`), and acted on from that read. Nothing here acts on a stale entry;
- de-allocating ready nodes whose request vanished (cancellation), so they are reused;
- resetting lost requests: `pending` with nobody holding the lock goes back to `requested`
  with `nodes: []` and its nodes de-allocated (their launcher died);
- removing node znodes without data and request-lock dirs older than 8 h with no request
  (`lock_dir_max_age`). Zuul deletes a request but never its lock dir; a launcher of ours
  removes it when it closes the request (zk/requests.py), so the dirs left are those of
  requests deleted while not closed by us (cancelled after someone locked them, served by
  a Nodepool launcher, a close that met another contender in the dir). This worker keeps
  one entry per such dir of the last 8 h (its due time and first-seen age, about 0.2 KiB):
  with every request closed by us, next to nothing; at worst (none closed by us, 100,000
  requests a day) about 33,000 entries, some 7 MiB. A dir that vanishes meanwhile (its
  request's taker or another launcher removed it) is dropped from the table at the next
  listing, and a deletion that finds it gone is no error;
- reporting lock contenders that are not ephemeral (no session will release them), once
  each, and publishing what they lock (`engine.stuck_nodes`, `stuck_requests`);
- the leak sweep (see leaks.py).

Event-driven: node changes (data or lock contenders) mark that node dirty and wake the
worker; a request deletion dirties the nodes allocated to it; a component disappearing
(another launcher died) triggers the lost-request check. A full pass runs at
`cleanup_interval`, and timed work (expiries, retries, sweeps) sets the next deadline. All
steps are idempotent; each is isolated so one failing step does not stop the others.

Time: the passes, retries and sweeps are scheduled on monotonic time. The ages that decide
an expiry (a node's `state_time`, an empty node's or a request-lock dir's mtime, taken by
other machines' clocks) are judged by `clock.StampAges`: wall time when this launcher first
looks, monotonic time after, so a step of the wall clock neither deletes a node early (a
forward step of a day does not expire every hold) nor stalls a deletion (a backward step
of an hour does not keep a node past its `max-ready-age` for an hour).
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Iterable, Protocol

from nodepool_k8s.runtime import logconfig
from nodepool_k8s.core import model
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.runtime.clock import Clock, StampAges
from nodepool_k8s.config.model import Config
from nodepool_k8s.launcher import plan
from nodepool_k8s.launcher.upkeep import disruption
from nodepool_k8s.launcher.upkeep.deleter import NodeDeleter
from nodepool_k8s.launcher.upkeep.leaks import LeakDeps, LeakSweeper
from nodepool_k8s.launcher.worker import PASS_COALESCE, RefusedRequests, Worker
from nodepool_k8s.core.model import Node
from nodepool_k8s.core.transition import transition, transition_request
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk import errors, locks, paths
from nodepool_k8s.zk.cache import CacheEvent, Component, RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.registry import ComponentRegistry
from nodepool_k8s.zk.requests import RequestStore
from nodepool_k8s.zk.txn import Txn

# The earliest a timed cleanup pass follows the previous one (seconds).
MIN_PASS_GAP = 0.5
# Node states in which the launcher itself holds node locks (launching, deleting).
OWN_LOCK_STATES = frozenset({model.NodeState.INIT, model.NodeState.BUILDING,
                             model.NodeState.DELETING, model.NodeState.DELETED,
                             model.NodeState.ABORTED, model.NodeState.FAILED})


class PoolIndex(Protocol):
    """The registered pool components (`zk.cache.ComponentCache`)."""

    def pools(self) -> Iterable[Component]: ...


class CleanupDeps(LeakDeps, Protocol):
    """What cleanup uses of the launcher's shared state (`context.Engine` is one)."""

    @property
    def zk(self) -> ZkClient: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def config(self) -> Config: ...

    @property
    def acting(self) -> bool: ...

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def request_cache(self) -> RequestCache: ...

    @property
    def requests(self) -> RequestStore: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def components(self) -> PoolIndex: ...

    @property
    def registry(self) -> ComponentRegistry: ...

    # Written by the persistent-lock check, read by min-ready and the pool workers.
    stuck_nodes: frozenset[str]
    stuck_requests: frozenset[str]

    def wake_all(self) -> None: ...


class CleanupWorker(Worker):
    def __init__(self, engine: CleanupDeps, deleter: NodeDeleter) -> None:
        super().__init__("CleanupWorker", engine.clock, engine.stats.thread_crashed,
                         coalesce=PASS_COALESCE)
        self.engine = engine
        self.deleter = deleter
        self.leaks = LeakSweeper(engine, deleter)
        self._dirty: set[str] = set()
        self._dirty_lock = threading.Lock()
        # Monotonic times of the next full pass and of the next node (or empty znode) that
        # may become due.
        self._next_full = -math.inf
        self._next_recheck = math.inf
        self._lost_due = True
        # Ages of nodes in their state, of empty node znodes and of request-lock dirs.
        self._node_ages = StampAges(engine.clock)
        self._empty_ages = StampAges(engine.clock)
        self._lock_dir_ages = StampAges(engine.clock)
        # Request-lock dir -> monotonic time before which it cannot be old enough to go.
        self._lock_dir_due: dict[str, float] = {}
        self._orphans_seen: set[str] = set()
        # Persistent lock contenders (`_persistent_locks`): what the last full pass saw.
        self._held_before: set[str] = set()
        self._waiting_before: set[str] = set()
        self._judged: dict[str, bool] = {}  # contender path -> not ephemeral
        self._refused = RefusedRequests(self.log)
        # Empty node znodes we may not remove (a child another client's ACL keeps): said
        # once, tried again on full passes only.
        self._empty_refused: set[str] = set()
        self.orphans_released = 0
        # Nodes due for deletion that are left to the live launcher that built them (see
        # `plan.builder_wait`) -> monotonic time their grace ends. Looked at again then
        # (not a full pass), or at once when a component goes away (`_builders_changed`).
        self._deferred: dict[str, float] = {}
        self._builders_changed = False
        # When (monotonic) the first entry the node cache left unread for its builder
        # becomes due for a read (`_read_left`).
        self._next_left = math.inf
        # Our own pool ids and every registered one, read once per pass (`_builder_wait`).
        self._pool_ids: tuple[frozenset[str], frozenset[str]] | None = None
        # Launch first: since when (monotonic) a due full pass or leak sweep waits for the
        # launches (None: nothing waits).
        self._held_since: float | None = None
        if deleter.first is not None:
            deleter.first.subscribe(self._may_resume)

    # -- cache listeners (quick, on the cache thread) -------------------------------------
    def on_node_event(self, kind: CacheEvent, node_id: str) -> None:
        if kind in (CacheEvent.CHANGED, CacheEvent.LOCK, CacheEvent.REMOVED):
            with self._dirty_lock:
                self._dirty.add(node_id)
            self.wake()

    def on_request_event(self, kind: CacheEvent, request_id: str) -> None:
        if kind is CacheEvent.REMOVED:
            nodes = self.engine.node_cache.allocated_to(request_id)
            if nodes:
                with self._dirty_lock:
                    self._dirty.update(nodes)
                self.wake()
        elif kind is CacheEvent.CHANGED and self._maybe_lost(request_id):
            self._lost_due = True
            self.wake()

    def _maybe_lost(self, request_id: str) -> bool:
        """A request the cache has just read `pending` (current) with no lock contender:
        its holder let go without finishing it, or its session ended (the cache reads a
        change made under a lock only once that lock goes, so the holder's registration
        going may have come before the cache showed `pending`). Not on lock events: the
        final write releases the lock in its own transaction, whose contender deletion
        comes before the write's change. Only where locks are followed: without them the
        cache cannot tell, and full passes find it."""
        cache = self.engine.request_cache
        if not cache.follows_locks() or cache.is_locked(request_id) \
                or cache.is_stale(request_id):
            return False
        request = cache.get(request_id)
        return request is not None and request.state == model.RequestState.PENDING

    def on_component_event(self, kind: CacheEvent, key: str) -> None:
        if kind is CacheEvent.REMOVED:
            self._lost_due = True
            # The builder of a deferred node may be gone: its nodes are ours to delete now.
            with self._dirty_lock:
                self._builders_changed = True
            self.wake()

    def request_full_pass(self) -> None:
        self._next_full = -math.inf
        self._lost_due = True
        self.wake()

    # -- the pass -------------------------------------------------------------------------
    def run_once(self) -> float | None:
        if not self.engine.acting:
            return None
        now = self.clock.monotonic()
        full = now >= self._next_full or now >= self._next_recheck
        hold_until = self._hold(now) if full or self.leaks.next_due() <= now else None
        if hold_until is not None:
            full = False
        if full:
            self._next_full = now + self.engine.settings.cleanup_interval
        with self._dirty_lock:
            dirty, self._dirty = self._dirty, set()
            builders_changed, self._builders_changed = self._builders_changed, False
        if full or builders_changed:
            # Nodes whose changes the cache left to their builder (`Engine._left_to_builder`):
            # current before a full pass, and when a builder may have gone.
            if not self.engine.node_cache.refresh():
                self.log.debug("Some stale node entries were not read in time")
        if full:
            # Requests taken as closed by their taker are not read at their lock's release:
            # read the ones still there, so one wrongly taken as closed (still open) is
            # served within a pass (zk/mirror.py, "Closed by the taker").
            closed = self.engine.request_cache.closed()
            if closed and not self.engine.request_cache.refresh(closed):
                self.log.debug("Some closed request entries were not read in time")
        self._step("nodes left unread", lambda: self._read_left(now, dirty))
        dirty.update(k for k, t in self._deferred.items() if builders_changed or t <= now)
        dirty.update(self.deleter.due_retries())
        self.deleter.resume_due()
        ids = self.engine.node_cache.ids() if full else list(dirty)
        self._step("nodes", lambda: self._nodes(ids, now, full))
        self._step("empty nodes", lambda: self._empty_nodes(now, full))
        if full or self._lost_due:
            self._lost_due = False
            self._step("lost requests", self._lost_requests)
        if full:
            self._step("request-lock dirs", lambda: self._lock_dirs(now))
            self._step("orphaned locks", self._orphaned_locks)
            self._step("persistent locks", self._persistent_locks)
        if hold_until is None:
            self._step("leak sweep", lambda: self.leaks.sweep_due(now))
        timed = [self._next_full, self._next_recheck, self.leaks.next_due()]
        if hold_until is not None:  # what is due now waits for the launches
            timed = [max(t, hold_until) for t in timed]
        due = min(*timed, self.deleter.next_retry(), self._next_left,
                  min(self._deferred.values(), default=math.inf))
        # Everything due was acted on in this pass; a deadline still in the past means
        # nothing will act on it, and re-running at once would only spin. Events (cache
        # changes, finished deletions) still wake the worker immediately.
        return max(due, self.clock.monotonic() + MIN_PASS_GAP)

    def _may_resume(self) -> None:
        """The last launch returned or a pool began to wait: run what waits for it (only
        then: most launches end with nothing held)."""
        if self._held_since is not None:
            self.wake()

    def _hold(self, now: float) -> float | None:
        """Launch first: until when (monotonic) the due full pass and leak sweep wait for
        this launcher's launches (None: they run now). They wait while launches run and
        none of our pools waits for quota, at most `delete_defer_max` from when they first
        waited; the last launch returning or a pool beginning to wait wakes this worker
        (`LaunchFirst.subscribe`). Lost requests are not held: resetting one serves a
        request."""
        first = self.deleter.first
        bound = self.engine.settings.delete_defer_max
        if first is None or bound <= 0 or not first.housekeeping_waits:
            self._held_since = None
            return None
        if self._held_since is None:
            self._held_since = now
        until = self._held_since + bound
        if now >= until:
            self._held_since = None
            return None
        return until

    def _step(self, name: str, fn: Callable[[], None]) -> None:
        """Run one cleanup task; a failure is logged and does not stop the others."""
        try:
            fn()
        except TemporaryError as exc:  # ZooKeeper unreachable or the session lost
            self.log.warning("Cleanup step %s interrupted: %s", name, exc)
        except Exception:
            self.log.exception("Cleanup step %s failed", name)

    def _age(self, node: plan.NodeFacts) -> float:
        """How long `node` has been in its state, step-proof (see the module docstring)."""
        stamp = node.state_time
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            return 0.0
        return self._node_ages.age(node.id, float(stamp))

    def _verdict(self, node: plan.NodeFacts, locked: bool) -> plan.NodeVerdict:
        allocated = node.allocated_to
        exists = not (node.state == model.NodeState.READY and allocated
                      and allocated not in self.engine.request_cache)
        return plan.node_cleanup(node, age=self._age(node), locked=locked,
                                 config=self.engine.config, request_exists=exists,
                                 stale_init_age=self.engine.settings.stale_init_age)

    def _nodes(self, ids: list[str], now: float, full: bool) -> None:
        """`now`: monotonic."""
        ours = set(self.engine.config.providers)
        cache = self.engine.node_cache
        next_check = math.inf
        candidates: list[str] = []
        self._pool_ids = None
        if full:
            self._deferred.clear()
        for node_id in ids:
            self._deferred.pop(node_id, None)
            node = cache.get(node_id)
            if node is None:
                self.deleter.forget(node_id)  # gone: a pending retry has nothing to do
                self._node_ages.forget(node_id)
                continue
            if node.provider not in ours or self.deleter.busy(node_id):
                continue
            if cache.is_stale(node_id):
                # Older than ZooKeeper's record (changes left unread): acting on it would
                # lock a node Zuul holds or take a used node for ready. It is read when
                # its lock goes, or by `_read_left`, then looked at again.
                continue
            verdict = self._verdict(node, locked=False)
            next_check = min(next_check, now + verdict.recheck_in)
            if verdict.action is plan.CleanupAction.DELETE and self._defer(node, now):
                continue  # its builder deletes it: no read, no lock attempt here
            # Between full passes trust the cache's lock view (its events tell us when a
            # node is unlocked); a full pass checks every candidate against ZooKeeper.
            if verdict.action is not plan.CleanupAction.NONE \
                    and (full or not cache.is_locked(node_id)):
                candidates.append(node_id)
        # Oldest first: ready nodes past max-ready-age leave in that order within a budget.
        candidates.sort(key=lambda i: (_state_time(cache.get(i)), i))
        budgets = _ExpiryBudgets(self.engine, self.deleter)
        # The cache shows a node and its lock contenders as separate znodes, so it can
        # briefly look unlocked: read both fresh (batched) before spending a lock attempt.
        for node_id, fresh, locked in self.engine.nodes.read_with_locks(candidates):
            if fresh is None:
                continue
            verdict = self._verdict(fresh, locked)
            # The fresh record may call for a deletion the cached one did not (the cache
            # still showed it ready when its request went).
            if verdict.action is plan.CleanupAction.DELETE and self._defer(fresh, now):
                continue
            if verdict.action is plan.CleanupAction.DELETE \
                    and fresh.state == model.NodeState.READY:
                # A spare past max-ready-age: an expiry, within the pool's budget.
                if not budgets.take(fresh):
                    next_check = min(next_check, now + disruption.RETRY_INTERVAL)
                    continue
                if self.deleter.submit(node_id, verdict.reason, self._still_deletable):
                    disruption.record_removal(self.engine, disruption.EXPIRY, fresh,
                                              verdict.reason)
            elif verdict.action is plan.CleanupAction.DELETE:
                # With its provider: the deletion may wait for the launches (launch first).
                self.deleter.submit(node_id, verdict.reason, self._still_deletable,
                                    provider=fresh.provider)
            elif verdict.action is plan.CleanupAction.DEALLOCATE:
                self._deallocate(node_id)
        if full:
            self._next_recheck = next_check
            self._reconcile()
            live = set(cache.ids())
            self.deleter.prune(live)
            self._node_ages.keep(live)
        else:
            self._next_recheck = min(self._next_recheck, next_check)

    def _read_left(self, now: float, dirty: set[str]) -> None:
        """Read the entries of our providers' nodes the node cache left unread for their
        live builder (`Engine._left_to_builder`) once they have been so, unlocked, for
        `delete_grace`: the builder did not delete the node Zuul released, or made a spare
        of it. One pipelined read of the due ones; they join `dirty`, looked at from what
        was read as any other node. Locked ones wait: a lock's going restarts their
        time. `now`: monotonic."""
        cache = self.engine.node_cache
        grace = self.engine.settings.delete_grace
        ours = self.engine.config.providers
        due: list[str] = []
        self._next_left = math.inf
        for node_id, since in cache.left_unread().items():
            node = cache.get(node_id)
            if node is None or node.provider not in ours or cache.is_locked(node_id):
                continue
            if since + grace <= now:
                due.append(node_id)
            else:
                self._next_left = min(self._next_left, since + grace)
        if due:
            if not cache.refresh(due):
                self.log.debug("Some node entries left to their builder were not read "
                               "in time")
            dirty.update(due)

    def _defer(self, node: Node, now: float) -> bool:
        """Whether `node`, due for deletion, is left to the live launcher that built it
        (`plan.builder_wait`); if so it is looked at again when the grace ends (`now`:
        monotonic) or a component goes."""
        if self._pool_ids is None:
            live = frozenset(c.id for c in self.engine.components.pools() if c.id)
            self._pool_ids = (self.engine.registry.pool_ids(), live)
        ours, live = self._pool_ids
        wait = plan.builder_wait(node.launcher, ours=ours, live=live, age=self._age(node),
                                 grace=self.engine.settings.delete_grace)
        if wait <= 0:
            return False
        self._deferred[node.id] = now + wait
        return True

    def _orphaned_locks(self) -> None:
        """Release locks our own session holds for work that no longer exists.

        A lock whose holder vanished inside this process (an ambiguous commit, a crashed
        handler) would otherwise be held until the session ends: the request is never
        reset, the node never cleaned. Only where the launcher itself takes locks is
        looked at (pending requests; nodes being built or deleted), and a contender must be
        seen orphaned on two full passes in a row (a lock being taken right now is not).
        """
        engine = self.engine
        dirs = [paths.request_lock_path(r.id) for r in engine.request_cache.requests()
                if r.state == model.RequestState.PENDING]
        dirs += [paths.node_lock_path(n.id) for n in engine.node_cache.nodes()
                 if n.state in OWN_LOCK_STATES]
        found = set(locks.orphaned_contenders(engine.zk, dirs))
        for path in sorted(found & self._orphans_seen):
            try:
                engine.zk.delete(path)
            except errors.NoNodeError:
                continue
            self.orphans_released += 1
            self.log.warning("Released lock %s: held by this launcher's session but by no "
                             "live work", path)
            self.wake()
        self._orphans_seen = found - self._orphans_seen

    def _persistent_locks(self) -> None:
        """Report lock contenders that are not ephemeral, once each, and tell the other
        workers which nodes and requests they keep locked (`engine.stuck_*`).

        Such a contender (left by a tool or a hand edit) is released by no session: what
        it locks stays locked for ever, as with Nodepool, which said nothing. Only
        contenders seen on two full passes in a row are looked at, with one batched stat
        each, once in their life; a request's lock dir is listed (batched) from its second
        full pass as `requested` or `pending` on. Lock events and lock attempts cost nothing
        more.
        """
        engine = self.engine
        owners: dict[str, tuple[str, str]] = {}  # contender path -> ("node"|"request", id)
        for node_id, names in engine.node_cache.held().items():
            lock_dir = paths.node_lock_path(node_id)
            for name in names:
                owners[f"{lock_dir}/{name}"] = ("node", node_id)
        requests = {r.id: r for r in engine.request_cache.requests()
                    if r.state in (model.RequestState.REQUESTED, model.RequestState.PENDING)}
        waited = sorted(set(requests) & self._waiting_before)
        dirs = {paths.request_lock_path(i): i for i in waited}
        self._waiting_before = set(requests)
        for lock_dir, listed in locks.contenders_of(engine.zk, list(dirs)).items():
            for name in listed:
                owners[f"{lock_dir}/{name}"] = ("request", dirs[lock_dir])
        fresh = [p for p in owners if p in self._held_before and p not in self._judged]
        persistent = set(locks.not_ephemeral(engine.zk, fresh))
        for path in fresh:
            self._judged[path] = path in persistent
            if path not in persistent:
                continue
            kind, key = owners[path]
            if kind == "node":
                node = engine.node_cache.get(key)
                self.log.warning(
                    "Lock contender %s is not ephemeral: no ZooKeeper session will ever "
                    "release it, so node %s (%s) stays locked; remove it with `nodepool "
                    "delete --force %s` or a ZooKeeper client", path, key,
                    node.state if node is not None else "?", key)
            else:
                self.log.warning(
                    "Lock contender %s is not ephemeral: no ZooKeeper session will ever "
                    "release it, so request %s (%s) stays locked and is not served; "
                    "remove it with a ZooKeeper client", path, key, requests[key].state)
        self._judged = {p: v for p, v in self._judged.items() if p in owners}
        self._held_before = set(owners)
        stuck = [owners[p] for p, persistent_one in self._judged.items() if persistent_one]
        nodes = frozenset(key for kind, key in stuck if kind == "node")
        held_requests = frozenset(key for kind, key in stuck if kind == "request")
        changed = (nodes, held_requests) != (engine.stuck_nodes, engine.stuck_requests)
        engine.stuck_nodes, engine.stuck_requests = nodes, held_requests
        if changed:  # min-ready counts spares anew; a request freed by hand is served
            engine.wake_all()

    def _reconcile(self) -> None:
        """Evict cache entries ZooKeeper no longer has (a safety net for missed events)."""
        engine = self.engine
        for cache, store, path in ((engine.node_cache, engine.nodes, paths.node_path),
                                   (engine.request_cache, engine.requests,
                                    paths.request_path)):
            present = set(store.ids())
            for key in [k for k in cache.ids() if k not in present]:
                if engine.zk.exists(path(key)) is None:
                    self.log.warning("Evicting %s from the cache: it no longer exists", key)
                    cache.evict(key)

    def _still_deletable(self, node: Node) -> bool:
        """Re-check under the lock (we hold it, so `locked` is False for this purpose)."""
        verdict = plan.node_cleanup(node, age=self._age(node), locked=False,
                                    config=self.engine.config, request_exists=True,
                                    stale_init_age=self.engine.settings.stale_init_age)
        return verdict.action is plan.CleanupAction.DELETE

    def _deallocate(self, node_id: str) -> None:
        engine = self.engine
        cached = engine.node_cache.get(node_id)
        if cached is None or not cached.allocated_to \
                or engine.requests.exists(cached.allocated_to):
            return
        got = engine.nodes.lock_and_read(node_id)
        if got is None:
            return
        lock, node = got
        try:
            request_id = node.allocated_to
            if node.state != model.NodeState.READY or not request_id \
                    or engine.requests.exists(request_id):
                return
            node.set(allocated_to=None)
            engine.nodes.store_and_release(node, lock)
            logconfig.annotate(self.log, node_id=node_id).info(
                "De-allocated ready node: request %s is gone", request_id)
        finally:
            if not lock.released:
                lock.release()

    def _empty_nodes(self, now: float, full: bool) -> None:
        """`now`: monotonic. An empty znode's age is ZooKeeper's mtime judged by
        `StampAges` (the server's clock, then ours)."""
        empty = self.engine.node_cache.empty_ids()
        self._empty_refused &= set(empty)
        self._empty_ages.keep(set(empty))
        limit = self.engine.settings.empty_node_age
        for node_id in empty:
            if node_id in self._empty_refused and not full:
                continue
            found = self.engine.zk.get(paths.node_path(node_id))
            if found is None or found[0]:
                continue
            age = self._empty_ages.age(node_id, found[1].mtime)
            if age < limit:
                self._next_recheck = min(self._next_recheck, now + limit - age)
                continue
            try:
                self.engine.nodes.delete_unlocked(node_id)
            except errors.ZkAuthError as exc:
                # Raising failed this step on every pass (each node event makes one), with
                # a traceback each time, and left the empty nodes after it alone.
                if node_id not in self._empty_refused:
                    self._empty_refused.add(node_id)
                    self.log.warning("Leaving node znode %s without data: %s", node_id, exc)
                continue
            self.log.info("Removed node znode %s without data", node_id)

    def _lost_requests(self) -> None:
        engine = self.engine
        requests = engine.request_cache.requests()
        if self._refused:
            self._refused.keep_only({r.id for r in requests})
        for request in requests:
            # Closed by its taker (its record, read before that lock, may say `pending`):
            # not lost. A full pass reads those entries first (`run_once`).
            if request.state != model.RequestState.PENDING or engine.stopping.is_set() \
                    or self._refused.skip(request) \
                    or engine.request_cache.is_closed(request.id):
                continue
            try:
                self._reset_if_lost(request)
            except errors.ZkAuthError as exc:
                self._refused.refuse(request, exc)

    def _reset_if_lost(self, request: model.NodeRequest) -> None:
        engine = self.engine
        if engine.requests.lock_contenders(request.id):
            return  # somebody is working on it
        got = engine.requests.lock_and_read(request.id)
        if got is None:
            return
        lock, fresh = got
        try:
            if fresh.state == model.RequestState.PENDING:
                self._reset(fresh, lock)
        finally:
            if not lock.released:
                lock.release()

    def _reset(self, request: model.NodeRequest, lock: HeldLock) -> None:
        engine = self.engine
        txn = Txn()
        node_locks: list[HeldLock] = []
        try:
            node_ids = set(engine.node_cache.allocated_to(request.id)) | set(request.nodes)
            for node_id in sorted(node_ids):
                got = engine.nodes.lock_and_read(node_id)
                if got is None:
                    continue
                node_lock, node = got
                node_locks.append(node_lock)
                if node.allocated_to == request.id and node.state == model.NodeState.INIT:
                    transition(node, model.NodeState.DELETING, self.clock.time(),
                               message=f"its request {request.id} was lost and reset")
                elif node.allocated_to == request.id and node.state == model.NodeState.READY:
                    node.set(allocated_to=None)
                else:
                    # Building etc.: unlocked, so the node cleanup deletes it anyway.
                    node_lock.release_in(txn)
                    continue
                engine.nodes.add_store(txn, node, node_lock, release=True)
            transition_request(request, model.RequestState.REQUESTED, self.clock.time())
            request.nodes = []
            engine.requests.add_store(txn, request, lock, release=True)
            try:
                txn.commit(engine.zk)
            except errors.TxnFailed as exc:
                if exc.path != paths.request_path(request.id) \
                        or not isinstance(exc.cause, errors.NoNodeError):
                    raise
                # Zuul deleted it meanwhile (a cancel needs no lock): nothing to reset. Its
                # nodes are de-allocated or removed by the node cleanup like any others.
                logconfig.annotate(self.log, request.event_id, request.id).info(
                    "Lost request was deleted before its reset")
                return
            lock.mark_released()
            for node_lock in node_locks:
                node_lock.mark_released()
            logconfig.annotate(self.log, request.event_id, request.id).info(
                "Reset lost request to requested")
        finally:
            for node_lock in node_locks:
                if not node_lock.released:
                    node_lock.release()

    def _lock_dirs(self, now: float) -> None:
        """`now`: monotonic. A dir's age is ZooKeeper's mtime judged by `StampAges`."""
        engine = self.engine
        max_age = engine.settings.lock_dir_max_age
        present = set(engine.requests.lock_dir_ids())
        for request_id in [r for r in self._lock_dir_due if r not in present]:
            del self._lock_dir_due[request_id]
        self._lock_dir_ages.keep(present)
        for request_id in present:
            if request_id in engine.request_cache:
                continue
            # Stat each dir once; look again only when it may have become old enough.
            if now < self._lock_dir_due.get(request_id, -math.inf):
                continue
            stat = engine.zk.exists(paths.request_lock_path(request_id))
            if stat is None:
                continue
            age = self._lock_dir_ages.age(request_id, stat.mtime)
            if age < max_age:
                self._lock_dir_due[request_id] = now + max_age - age
                continue
            # Removed only if unchanged since it was judged old (its mtime).
            if engine.requests.delete_orphan_lock_dir(request_id, stat.mtime):
                self._lock_dir_due.pop(request_id, None)
                self._lock_dir_ages.forget(request_id)
                self.log.info("Removed orphaned request-lock dir %s", request_id)


def _state_time(node: Node | None) -> float:
    return node.state_time or 0.0 if node is not None else 0.0


class _ExpiryBudgets:
    """Room in each pool's `expiry` budget during one cleanup pass: the pool's nodes being
    deleted (their state, or this launcher's deleter working on them) count against it,
    and so does each expiry this pass asks for."""

    def __init__(self, engine: CleanupDeps, deleter: NodeDeleter) -> None:
        self.engine = engine
        self.deleter = deleter
        self._counts: dict[tuple[str | None, str | None], list[int]] | None = None

    def _count(self) -> dict[tuple[str | None, str | None], list[int]]:
        """(provider, pool) -> [its nodes, those being deleted]."""
        counts: dict[tuple[str | None, str | None], list[int]] = {}
        for node in self.engine.node_cache.nodes():
            entry = counts.setdefault((node.provider, node.pool), [0, 0])
            entry[0] += 1
            if node.state in (model.NodeState.DELETING, model.NodeState.DELETED) \
                    or self.deleter.busy(node.id):
                entry[1] += 1
        return counts

    def take(self, node: Node) -> bool:
        pool = self.engine.config.pool_config(node.provider, node.pool)
        if pool is None:
            return True  # no pool configured any more: no budget to keep
        if self._counts is None:
            self._counts = self._count()
        entry = self._counts.setdefault((node.provider, node.pool), [1, 0])
        left = disruption.room(disruption.EXPIRY, pool.disruption_budgets, entry[0], entry[1],
                               self.engine.clock.time())
        if left is not None and left <= 0:
            return False
        entry[1] += 1
        return True
