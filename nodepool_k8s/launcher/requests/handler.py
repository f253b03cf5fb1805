"""One accepted request, from `pending` to `fulfilled` (or declined), as a re-entrant state
machine driven by its pool worker's passes.

Owns: the nodes of one request. Each slot (one per entry of `node_types`, order kept, so
`nodes` lines up with `node_types`) is satisfied by reusing a ready node of the pool or by
creating a node (both in `allocation.py`: quota check and guarded create) and launching
it; the handler pauses at quota and resumes when capacity frees (first letting an older
request that another launcher of the pool holds take freed room, for at most the engine's
`quota_yield`: `_yielding`); it finishes with exactly
one transaction that writes every node and the request and releases every lock
(fulfilled, declined, or the request was cancelled).

Its standing toward the pool is one `HandlerState` (active, queued behind a waiting
request, at quota, backing off after an aborted launch, done), changed only by `_enter`;
the pool worker reads `paused`, `done`, `blocked_scope` and `next_deadline` from it.
While it waits, the request carries why (`waiting_reasons`, this pool's entry), written
when that changes, dropped when the wait ends.
What it uses of the engine is `HandlerDeps`.

ZooKeeper writes per new node: the guarded create (one transaction for all nodes of the
request), lock + `building` (one transaction), the external id (driver progress) and a
share of the final transaction.

Tracing: the handler holds its request's root span (`span`; the one no-op span when
tracing is off) with `accept` under it from the start, a `launch` per new node (the phases
under it are the launch's, see launch.py) and `fulfil` or `decline` around the final
transaction; the root ends when the handler enters DONE, saying how (`OUTCOME`).

Handing back: the pool worker may `hold` the handler (its provider's API server cannot be
used: no launch starts, the request waits saying why) and `hand_back` it (the pool cannot
serve it now and another pool could, see `plan.hand_back`): its launches are cancelled and,
once they returned, the request is declined with that reason (Nodepool's way of letting
another pool take it; `failed` only if every registered pool declined).

Failure modes: a launch that fails after its retries declines the request for this pool
(`failed` once every registered pool declined); the cloud refusing for quota, or the
provider being unable to act at all (its credentials refused), aborts the node and pauses
(launching again after the engine's `quota_retry`), counting nothing against the label;
a vanished request releases the nodes unallocated for reuse; a lost session abandons
everything without writing (locks vanished with it; cleanup and the lost-request reset of
any launcher recover).
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from nodepool_k8s.runtime import logconfig
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model, quota
from nodepool_k8s.runtime.cancel import CancelEvent
from nodepool_k8s.config.model import PoolConfig, ProviderConfig
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.launcher.requests import allocation
from nodepool_k8s.launcher.requests import launch as launching
from nodepool_k8s.launcher.requests.launch import LaunchEnd
from nodepool_k8s.launcher import lifecycle
from nodepool_k8s.launcher import plan
from nodepool_k8s.launcher.requests.allocation import (
    CONTENTION, AllocationDeps, Allocator, Slot, SlotState)
from nodepool_k8s.launcher.requests.allocation import PoolRef as PoolRef
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.core.transition import transition, transition_request
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.runtime.tracing import NOOP_SPAN, Tracer
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import locks as zk_locks
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.requests import RequestStore
from nodepool_k8s.zk.txn import Txn


class Final(enum.Enum):
    """Outcomes of the final transaction."""

    DONE = "done"  # written (or found applied after a lost reply), or abandoned
    GONE = "gone"  # the request vanished
    RETRY = "retry"  # adopted a newer version or replaced a node: write again next pass


DONE, GONE, RETRY = Final.DONE, Final.GONE, Final.RETRY

# The request span's attribute saying how the handler ended: fulfilled, declined,
# cancelled (the requestor deleted it), returned (on shutdown) or abandoned.
OUTCOME = "nodepool.outcome"


class HandlerDeps(AllocationDeps, Protocol):
    """What a request handler uses of the engine, on top of its allocator's
    (`launcher.context.Engine` provides it)."""

    @property
    def requests(self) -> RequestStore: ...

    @property
    def request_cache(self) -> RequestCache: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def tracer(self) -> Tracer: ...

    def provider_config(self, name: str | None) -> ProviderConfig | None: ...


class HandlerState(enum.Enum):
    """Where a handler stands. `RequestHandler._enter` is the only place that changes it.

    A paused state is sticky: it holds until the handler allocates again (ACTIVE) or
    finishes (DONE), also across passes that stop early (launches still running, the
    pool left the configuration), so the pool stays paused meanwhile."""

    ACTIVE = "active"  # allocating, launching or writing its final transaction
    QUEUED = "queued"  # paused: a request ahead of it in the pool waits (may not allocate)
    AT_QUOTA = "at-quota"  # paused: its nodes do not fit a limit now (`blocked_scope`)
    BACKING_OFF = "backing-off"  # paused: a launch was aborted; none before `next_deadline`
    HELD = "held"  # paused: the pool worker holds it (`held`: its provider cannot act now)
    DONE = "done"  # fulfilled, declined, cancelled, returned or abandoned: nothing left


PAUSED = frozenset({HandlerState.QUEUED, HandlerState.AT_QUOTA, HandlerState.BACKING_OFF,
                    HandlerState.HELD})


@dataclass(frozen=True)
class Backoff:
    """The last aborted launch (the cloud refused it for quota, or the provider cannot act
    at all): why (a reason code), and the monotonic time before which the handler starts
    no new launch (None once it has tried again). Dropped when a launch starts; until then
    it says why the handler resumes."""

    reason: str
    until: float | None


class RequestHandler:
    def __init__(self, engine: HandlerDeps, ref: PoolRef, provider: Provider,
                 launches: launching.LaunchPool, request: NodeRequest, lock: HeldLock,
                 registered_ids: Callable[[], set[str]], wake: Callable[[], None],
                 accept_started: int = 0) -> None:
        """`accept_started` (`Tracer.now()`) is when accepting the request began: its
        trace starts there."""
        self.engine = engine
        self.ref = ref
        self.provider = provider
        self.launches = launches
        self.request = request
        self.lock = lock
        self.registered_ids = registered_ids
        self.wake = wake
        self.cancel = CancelEvent()  # wakes a waiting driver when set
        self.slots = [Slot(i, label) for i, label in enumerate(request.node_types)]
        self.state = HandlerState.ACTIVE
        self.backoff: Backoff | None = None
        # The limit that held it back at its last quota check ("pool", "provider",
        # "tenant", ...): kept while it waits, for whatever reason, so the pool worker
        # knows which nodes would make room.
        self.blocked_scope: str | None = None
        # Set by the pool worker (circuit breaker): why the request must not be launched
        # here any more (declined then), and who hears of each finished launch (label,
        # None on success or the failure's error text).
        self.refuse: Callable[[NodeRequest], plan.Decline | None] = lambda request: None
        self.on_launch_done: Callable[[str, str | None], None] = lambda label, error: None
        # Set by the pool worker: whether another launcher of this pool holds an older
        # request waiting for the same capacity (see `_yielding`), and since when
        # (monotonic) this one has let it go first while the cache showed room.
        self.older_waits: Callable[[NodeRequest], bool] = lambda request: False
        self._yield_since: float | None = None
        # Set by the pool worker: why no launch may start now (its provider cannot act), and
        # the decline it hands the request back with (see `hold`, `hand_back`).
        self.held: plan.Waiting | None = None
        self.handing_back: plan.Decline | None = None
        # Monotonic time of the first aborted launch since the last one that succeeded:
        # how long the cloud has refused this request (the hand-back's clock).
        self.refused_since: float | None = None
        # Held by whoever advances this handler: its pool worker, or the launch thread whose
        # launch was the last to return (see `_returned`), or the shutdown.
        self._mutex = threading.Lock()
        base = logging.getLogger(f"nodepool_k8s.PoolWorker.{ref.provider}-{ref.pool}")
        self.log = logconfig.annotate(base, request.event_id, request.id)
        self.allocator = Allocator(engine, ref, provider, request, lock, self.log)
        # The request's trace (`runtime.tracing`): its root span ends when the handler is
        # DONE (`_enter`). Launch threads add spans too, always under the root explicitly.
        self.span = NOOP_SPAN
        if engine.tracer.enabled:
            self.span = engine.tracer.root("request", {
                "nodepool.request.id": request.id,
                "nodepool.request.labels": list(request.node_types),
                "nodepool.request.requestor": request.requestor or "",
                "nodepool.request.priority": request.priority,
                "nodepool.request.relative_priority": request.relative_priority,
                "nodepool.provider": ref.provider, "nodepool.pool": ref.pool,
            }, start_ns=accept_started)
            self.span.child("accept", start_ns=accept_started).end()

    # -- state --------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """Waiting for capacity (or for the time to launch again): the pool is paused."""
        return self.state in PAUSED

    @property
    def done(self) -> bool:
        return self.state is HandlerState.DONE

    @property
    def next_deadline(self) -> float | None:
        """When (monotonic) it tries again after an aborted launch, or when it stops
        letting an older request of another launcher go first (`_yielding`)."""
        until = self.backoff.until if self.backoff is not None else None
        if self._yield_since is not None:
            given_up = self._yield_since + self.engine.settings.quota_yield
            until = given_up if until is None else min(until, given_up)
        return until

    def _enter(self, state: HandlerState, *, scope: str | None = None,
               why: str = "") -> None:
        """Change the state (DONE is final): `scope` is the limit of AT_QUOTA, `why` the
        verdict logged when the handler starts waiting at quota."""
        old = self.state
        if old is HandlerState.DONE:
            return
        if state is HandlerState.ACTIVE:
            if old in PAUSED:
                reason = self.backoff.reason if self.backoff is not None else None
                self.log.info("Resuming: %s", "capacity is available"
                              if reason in (None, "QuotaExceeded")
                              else f"launching again after {reason}")
                self.span.event("resumed")
            self.backoff = None
        elif state is HandlerState.AT_QUOTA:
            if old not in PAUSED:
                self.log.info("Pausing: %s", why)
                self.span.event("paused", why)
            self.blocked_scope = scope
        elif state is HandlerState.HELD and old is not HandlerState.HELD \
                and self.held is not None:
            self.log.info("Holding: %s", self.held.message)
            self.span.event("held", self.held.message)
        self.state = state
        if state is HandlerState.DONE:
            self.span.end()

    def _back_off(self, reason: str) -> None:
        """A launch was aborted: no new one for the engine's `quota_retry`."""
        if self.refused_since is None:
            self.refused_since = self.engine.clock.monotonic()
        self.backoff = Backoff(reason, self.engine.clock.monotonic()
                               + self.engine.settings.quota_retry)

    def _backing_off(self) -> bool:
        """Whether the wait after an aborted launch still runs."""
        until = self.backoff.until if self.backoff is not None else None
        return until is not None and self.engine.clock.monotonic() < until

    # -- lifecycle ------------------------------------------------------------------------
    def advance(self, may_allocate: bool = True) -> bool:
        """Move forward as far as possible; True while waiting for capacity."""
        with self._mutex:
            return self._advance(may_allocate)

    def _advance(self, may_allocate: bool) -> bool:
        try:
            return self._advance_once(may_allocate)
        except errors.LockLost as exc:
            self._give_up(exc)
            return False

    def _give_up(self, exc: errors.LockLost) -> None:
        """A lock the next write needs is no longer ours (e.g. released after an ambiguous
        commit): the write can never succeed. Raising instead failed every pass of the
        pool worker at this handler, so the pool served nothing more. Every lock still
        ours is released: the request, if still `pending`, is reset by the lost-request
        cleanup and served again; our unlocked nodes are cleaned up."""
        for slot in self.slots:
            if slot.lock is not None:
                slot.lock.release()
        self.lock.release()
        self.abandon(f"a lock is no longer ours ({exc})")

    def _advance_once(self, may_allocate: bool) -> bool:
        if self.done:
            return False
        if not self.lock.valid:
            self.abandon("the ZooKeeper session expired")
            return False
        self._collect()
        if any(s.state is SlotState.LAUNCHING for s in self.slots):
            return False
        if self._request_gone():
            self._finish_cancelled()
            return False
        if self.handing_back is not None:
            # Before the failed check: a launch it cancelled is no failure of the label.
            self._decline(self.handing_back)
            return False
        failed = [s for s in self.slots if s.state is SlotState.FAILED]
        if failed:
            node = failed[0].node
            self._decline(plan.Decline(cond.reason(node.failure_reason if node else None),
                                       "a node launch failed"))
            return False
        needed = [s for s in self.slots if s.state is SlotState.NEED]
        if not needed:
            self._fulfil()
            return False
        configs = self._configs()
        if configs is None:
            # The pool left the configuration: the reload that removed it stops this
            # worker next and hands the request back (`shutdown`) for the pools that
            # remain. Declining here, in that window, failed requests another pool serves.
            return False
        provider_cfg, pool_cfg = configs
        decline = plan.decline_for(self.request, pool_cfg, provider_cfg,
                                   self.provider.cloud_limits()) or self.refuse(self.request)
        if decline:
            self._decline(decline)
            return False
        if self.held is not None:
            self._enter(HandlerState.HELD)
            self._note_waiting()
            return True
        backing_off = self._backing_off()
        if backing_off or not may_allocate:
            self._enter(HandlerState.BACKING_OFF if backing_off else HandlerState.QUEUED)
            self._note_waiting()
            return True
        if self.backoff is not None:  # its wait is over: this is the try again
            self.backoff = Backoff(self.backoff.reason, None)
        yielding, looked = self._yielding(needed, provider_cfg, pool_cfg)
        if yielding:
            return True
        verdict = self._allocate(needed, provider_cfg, pool_cfg, looked)
        if verdict:
            self._enter(HandlerState.ACTIVE)
            if not any(s.state is SlotState.NEED or s.state is SlotState.LAUNCHING
                       for s in self.slots):
                self._fulfil()
            else:
                self._note_waiting()
            return False
        if verdict.scope == CONTENTION:
            self.wake()
            return False
        if plan.is_min_ready(self.request):
            self._decline(plan.Decline("AtQuota", f"at quota ({verdict.describe()})"))
            return False
        self._enter(HandlerState.AT_QUOTA, scope=verdict.scope, why=verdict.describe())
        self._note_waiting()
        return True

    def _yielding(self, needed: list[Slot], provider_cfg: ProviderConfig,
                  pool_cfg: PoolConfig) -> tuple[bool, quota.Fit | None]:
        """Whether a handler waiting at quota lets an older request go first: the cache
        shows room for its nodes, and another launcher of this pool holds an older request
        that waits for quota too. Every launcher sees a node go at once; each trying its
        guarded create then would cost all but one a failed write (a guard conflict).
        The oldest tries at once; the others look again when the room is taken (a cache
        event), or after the engine's `quota_yield` seconds, whatever that older request's
        launcher does (dead, paused, or unable to use the room): never lost, only later.
        Also the cache's verdict for the nodes still to create when it looked (the create
        need not work it out again)."""
        wait = self.engine.settings.quota_yield
        if self.state is not HandlerState.AT_QUOTA or wait <= 0 \
                or not self.older_waits(self.request):
            self._yield_since = None
            return False, None
        remaining = [s for s in needed if s.node is None]
        if not remaining:
            self._yield_since = None
            return False, None
        looked = self.allocator.fits_cached(remaining, provider_cfg, pool_cfg)
        if not looked:
            self._yield_since = None  # no room to leave to it: as before
            return False, looked
        now = self.engine.clock.monotonic()
        if self._yield_since is None:
            self._yield_since = now
            self.log.debug("Letting an older request of another launcher take the room")
        if now - self._yield_since < wait:
            return True, looked
        self._yield_since = None  # waited long enough: try now
        return False, looked

    def waiting(self) -> plan.Waiting | None:
        """Why this handler holds its request back now (None while it goes on)."""
        if self.state is HandlerState.AT_QUOTA:
            return plan.Waiting("WaitingForQuota",
                                f"waits until its nodes fit the {self.blocked_scope} limit")
        if self.state is HandlerState.QUEUED:
            return plan.Waiting("QueuedInPool",
                                "behind an earlier request of this pool that waits")
        if self.state is HandlerState.HELD and self.held is not None:
            return self.held
        if self.state is HandlerState.BACKING_OFF:
            reason = self.backoff.reason if self.backoff is not None else "Unknown"
            return plan.Waiting("LaunchBackoff",
                                f"a launch was aborted ({reason}); it launches again after"
                                " quota-retry")
        return None

    def _note_waiting(self) -> None:
        """Write why the request waits onto it, when that changed (a wait that starts, a
        different cause, or the wait that ended): the request is ours (locked), and its
        final write drops the note anyway. Best effort: a failed write is tried again on
        the next pass, as the record still shows the old note."""
        waiting = self.waiting()
        if lifecycle.waiting_note(self.request, self.ref.pool_id) == (
                waiting.to_dict() if waiting is not None else None):
            return  # the common case, every pass of a waiting pool: no copy, no write
        noted = self.request.copy()
        lifecycle.note_waiting(noted, self.ref.pool_id, waiting)
        try:
            self.engine.requests.store(noted, self.lock)
        except errors.VersionConflict:
            # Nobody should write a request we hold locked: adopt what is there (as the
            # final write does) and note again on the next pass.
            fresh = self.engine.requests.get(self.request.id)
            if fresh is not None:
                self.request.version = fresh.version
                self.request.relative_priority = fresh.relative_priority
                self.request.extra = fresh.extra
            return
        except (errors.ZkConnectionError, errors.NoNodeError) as exc:
            self.log.warning("Could not note why the request waits: %s", exc)
            return
        self.request.version = noted.version
        self.request.extra = noted.extra

    def hold(self, waiting: plan.Waiting | None) -> None:
        """Start no launch while `waiting` is set (why, written onto the request); None
        lets the handler go on. Launches already running carry on."""
        self.held = waiting

    def hand_back(self, decline: plan.Decline) -> None:
        """Give the request up for other pools: cancel its launches and, once they all
        returned (the next advance), decline it with `decline`."""
        with self._mutex:  # a launch thread may be writing the final transaction
            if self.done or self.handing_back is not None:
                return
            self.handing_back = decline
            self.log.info("Handing the request back: %s", decline.message)
            self.span.event("handing back", decline.message)
            if any(s.state is SlotState.LAUNCHING for s in self.slots):
                self.cancel.set()

    def launch_created(self) -> None:
        """Start the launches of the nodes a batched create (`allocation.create_batch`)
        made for this freshly accepted handler; from here on it is like one that created
        them itself."""
        with self._mutex:
            configs = self._configs()
            created = [s for s in self.slots
                       if s.state is SlotState.NEED and s.node is not None]
            if configs is not None and created:
                self._start_launches(created, *configs)

    @property
    def finishable(self) -> bool:
        """Every launch has returned, and none was aborted: advancing only writes the final
        transaction (fulfil or decline) and allocates nothing, so it may happen outside the
        pool worker's pass without changing the priority order of allocation."""
        if self.done:
            return False
        running = [s for s in self.slots if s.state is SlotState.LAUNCHING]
        if not running or any(s.state is SlotState.NEED for s in self.slots):
            return False
        for slot in running:
            future = slot.future
            if future is None or not future.done():
                return False
            try:
                if future.result().kind in (LaunchEnd.ABORTED, LaunchEnd.UNLOCKED):
                    return False  # the slot needs a new node: allocation is the worker's
            except Exception:
                continue  # collected as a failure
        return True

    def abandon(self, why: str) -> None:
        """Stop without writing: our locks are gone with the session."""
        self.cancel.set()
        if not self.done:
            self.log.warning("Abandoning request: %s", why)
            self.span.set(OUTCOME, "abandoned")
            self.span.fail("Cancelled", why)
        self._enter(HandlerState.DONE)

    def shutdown(self, timeout: float) -> None:
        """Graceful stop: cancel launches, put the request back to `requested`, unlock.

        A node whose launch returned cancelled or failed has no cloud resource left (the
        driver removed it, or labelled it for the leak sweeper): its record is removed
        here, so a stop leaves nothing for another launcher's cleanup. A node whose launch
        did not return in time, or finished, is unlocked in `building`; cleanup deletes it.
        """
        self.cancel.set()
        with self._mutex:  # a launch thread may be writing the final transaction
            self._shutdown(timeout)

    def _shutdown(self, timeout: float) -> None:
        discarded: list[Slot] = []
        clock = self.engine.clock
        deadline = clock.monotonic() + timeout
        for slot in self.slots:
            if slot.future is not None:
                try:
                    outcome = slot.future.result(max(0.0, deadline - clock.monotonic()))
                except Exception:
                    outcome = None
                # Returned or not: if its launch took the node's lock, release it with the
                # rest (a node whose launch did not return stays `building`; cleanup
                # deletes it).
                self._take_launch_lock(slot)
                if outcome is None:
                    continue
                if outcome.kind in (LaunchEnd.CANCELLED, LaunchEnd.FAILED) and not slot.reused:
                    discarded.append(slot)
        if self.done or not self.lock.valid:
            if not self.done:
                self.span.set(OUTCOME, "abandoned")
                self.span.fail("Cancelled", "stopping without the request's lock")
            self._enter(HandlerState.DONE)
            return
        for slot in discarded:
            if slot.node is None or slot.lock is None or not slot.lock.valid:
                continue
            try:
                if self.engine.nodes.delete(slot.node, slot.lock):
                    self._node_log(slot.node).info("Removed the node of a cancelled launch")
            except Exception as exc:  # cleanup of any launcher removes it later
                self._node_log(slot.node).warning("Could not remove node on shutdown: %s", exc)
        txn = Txn()
        held: list[HeldLock] = []
        for slot in self.slots:
            if slot.node is None or slot.lock is None or not slot.lock.valid:
                continue
            if slot.reused:
                slot.node.set(allocated_to=None)
                self.engine.nodes.add_store(txn, slot.node, slot.lock, release=True)
            else:
                slot.lock.release_in(txn)
            held.append(slot.lock)
        transition_request(self.request, model.RequestState.REQUESTED, self.engine.clock.time())
        self.request.nodes = []
        try:
            self.engine.requests.add_store(txn, self.request, self.lock, release=True)
            txn.commit(self.engine.zk)
            self.log.info("Returned request to the queue on shutdown")
        except Exception as exc:
            self.log.warning("Could not return request on shutdown: %s", exc)
            for lock in held + [self.lock]:
                lock.release()
        for lock in held + [self.lock]:
            lock.mark_released()
        self.span.set(OUTCOME, "returned")
        self._enter(HandlerState.DONE)

    # -- internals ------------------------------------------------------------------------
    def _configs(self) -> tuple[ProviderConfig, PoolConfig] | None:
        provider = self.engine.provider_config(self.ref.provider)
        pool = provider.pools.get(self.ref.pool) if provider else None
        return (provider, pool) if provider and pool else None

    def _request_gone(self) -> bool:
        if self.request.id in self.engine.request_cache:
            return False
        return not self.engine.requests.exists(self.request.id)

    def _node_log(self, node: Node) -> logging.LoggerAdapter[logging.Logger]:
        return allocation.node_log(self.log, self.request, node)

    def _collect(self) -> None:
        for slot in self.slots:
            if slot.state is not SlotState.LAUNCHING or slot.future is None \
                    or not slot.future.done():
                continue
            try:
                outcome = slot.future.result()
            except Exception as exc:  # run() catches everything; be defensive anyway
                outcome = launching.LaunchOutcome(LaunchEnd.FAILED, error=repr(exc))
            # The future (and so the outcome) is dropped only once the outcome is applied:
            # if writing the node's final state fails (ZooKeeper unreachable), the next
            # advance collects the same outcome again instead of waiting forever.
            if outcome.kind is LaunchEnd.UNLOCKED:
                if slot.node is not None:
                    self._node_log(slot.node).warning(
                        "Could not lock our new node (%s); replacing it", outcome.error)
                slot.state, slot.node, slot.lock = SlotState.NEED, None, None
                slot.future = slot.job = None
                continue
            self._take_launch_lock(slot)
            if outcome.kind in (LaunchEnd.READY, LaunchEnd.FAILED):
                self._launch_done(slot.label, outcome)
            if outcome.kind is LaunchEnd.READY:
                slot.state, slot.result = SlotState.READY, outcome.result
                self.refused_since = None
            elif outcome.kind is LaunchEnd.ABORTED:
                self._finish_node(slot, model.NodeState.ABORTED, outcome)
                if slot.node is not None:
                    lifecycle.record_outcome(self.engine.events, slot.node,
                                             zk_events.LAUNCH_ABORTED, outcome.reason,
                                             outcome.error)
                slot.state, slot.node, slot.lock = SlotState.NEED, None, None
                self._back_off(outcome.reason)
            else:
                if outcome.kind is LaunchEnd.CANCELLED and not self.lock.valid:
                    return  # advance() abandons on the next check
                self._finish_node(slot, model.NodeState.FAILED, outcome)
                slot.state = SlotState.FAILED
                assert slot.node is not None
                lifecycle.record_outcome(self.engine.events, slot.node,
                                         zk_events.LAUNCH_FAILED, outcome.reason,
                                         outcome.error)
                self._node_log(slot.node).warning("Launch failed: %s", outcome.error)
            slot.future = slot.job = None

    @staticmethod
    def _take_launch_lock(slot: Slot) -> None:
        """The node's lock, which its launch takes first (see `launch.NodeLaunch`)."""
        if slot.job is not None and slot.job.lock is not None:
            slot.lock = slot.job.lock

    def _launch_done(self, label: str, outcome: launching.LaunchOutcome) -> None:
        try:
            self.on_launch_done(label, None if outcome.kind == LaunchEnd.READY
                                else outcome.error)
        except Exception as exc:  # the breaker's bookkeeping never blocks the request
            self.log.warning("Could not record the launch outcome: %s", exc)

    def _finish_node(self, slot: Slot, state: model.NodeState,
                     outcome: launching.LaunchOutcome) -> None:
        """Move a node to its final state (the failed condition saying why, for the event
        log and the decline) and write it, unlocking it (cleanup deletes it later)."""
        node, lock = slot.node, slot.lock
        if node is None:
            return
        reason = outcome.reason or ("Cancelled" if outcome.kind is LaunchEnd.CANCELLED
                                    else "Unknown")
        transition(node, state, self.engine.clock.time(), reason=reason,
                   message=outcome.error)
        if lock is None or not lock.valid:
            return
        try:
            self.engine.nodes.store_and_release(node, lock)
        except (errors.LockLost, errors.NoNodeError, errors.VersionConflict) as exc:
            self._node_log(node).warning("Could not mark node %s: %s", state, exc)
            lock.release()

    def _allocate(self, needed: list[Slot], provider_cfg: ProviderConfig,
                  pool_cfg: PoolConfig, looked: quota.Fit | None = None) -> quota.Fit:
        """`looked`: the cache's verdict for the slots without a node, worked out in this
        pass (valid while no slot is served by reuse)."""
        created = [s for s in needed if s.node is not None]
        if created:
            # Created by a batch whose launches could not all be started (`launch_created`
            # raised part way): launch them now instead of creating others.
            self._start_launches(created, provider_cfg, pool_cfg)
            needed = [s for s in needed if s.node is None]
            if not needed:
                return quota.FITS
        if self.request.reuse:
            self.allocator.reuse(needed)
            if any(s.state is not SlotState.NEED for s in needed):
                looked = None
        remaining = [s for s in needed if s.state is SlotState.NEED]
        if not remaining:
            return quota.FITS
        try:
            verdict = self.allocator.create(remaining, provider_cfg, pool_cfg, looked)
        except errors.LockLost:
            self.abandon("the request's lock vanished before its nodes were created")
            return quota.Fit(False, CONTENTION, ())
        if verdict:
            self._start_launches(remaining, provider_cfg, pool_cfg)
        return verdict

    def _start_launches(self, slots: list[Slot], provider_cfg: ProviderConfig,
                        pool_cfg: PoolConfig) -> None:
        for slot in slots:
            node = slot.node
            assert node is not None
            # Lock + `building` is sent now and its answer collected by the launch thread:
            # in a burst the pool worker goes on to the next request meanwhile.
            # Not sent when this raises (ZooKeeper unreachable): the node is still `init`
            # and unlocked, and stays with its slot; the next pass launches it.
            pending = self.engine.nodes.lock_new_async(node, model.NodeState.BUILDING,
                                                       self.engine.clock.time())
            slot.state = SlotState.LAUNCHING
            job = launching.NodeLaunch(
                provider=self.provider, provider_config=provider_cfg, pool=pool_cfg,
                label=pool_cfg.labels[slot.label], request=self.request, node=node,
                pending_lock=pending, nodes=self.engine.nodes, cancel=self.cancel,
                stats=self.engine.stats, log=self._node_log(node), clock=self.engine.clock,
                on_attempt_failed=functools.partial(lifecycle.record_attempt_failed,
                                                    self.engine.events, node))
            if self.span.recording:
                job.span = self.span.child("launch", {
                    "nodepool.node.id": node.id, "nodepool.node.label": slot.label})
            self._node_log(node).info("Launching %s node", slot.label)
            slot.job = job
            slot.future = self.launches.submit(job.run, self._returned)

    def _returned(self) -> None:
        """A launch returned (called in its launch thread). If that completes the request,
        write the final transaction here: the pool worker may be busy accepting a burst,
        and a request whose node is ready should not wait until the queue is through.
        Anything else (an aborted launch, a request with launches still running) is the
        pool worker's, which is woken either way."""
        try:
            if not self.cancel.is_set() and self.finishable \
                    and self._mutex.acquire(blocking=False):
                try:
                    if self.finishable:  # re-checked under the mutex
                        self._advance(may_allocate=False)
                finally:
                    self._mutex.release()
        except Exception as exc:  # the pool worker's next pass tries again
            self.log.warning("Could not finish the request in its launch thread: %s", exc)
        finally:
            self.wake()

    def _final_txn(self, *, allocated: bool) -> tuple[Txn, list[HeldLock]]:
        """Every ready node: written `ready` (allocated or not) and unlocked."""
        txn = Txn()
        locks: list[HeldLock] = []
        now = self.engine.clock.time()
        for slot in self.slots:
            if slot.state is not SlotState.READY or slot.node is None or slot.lock is None:
                continue
            node = slot.node
            if not slot.reused and slot.result is not None:
                launching.apply_result(node, slot.result)
                transition(node, model.NodeState.READY, now)
            if not allocated:
                node.set(allocated_to=None)
            self.engine.nodes.add_store(txn, node, slot.lock, release=True)
            locks.append(slot.lock)
        return txn, locks

    def _commit_final(self, txn: Txn, locks: list[HeldLock],
                      written: NodeRequest | None) -> Final:
        """Commit the final transaction: DONE, GONE (request vanished) or RETRY.
        `written`: the request as the transaction writes it (None: it writes only nodes)."""
        with_request = written is not None
        try:
            txn.commit(self.engine.zk)
        except errors.TxnFailed as exc:
            return self._final_failed(exc, locks)
        except errors.ZkAuthError as exc:
            if not with_request or exc.path != paths.request_path(self.request.id):
                raise
            # The requestor's ACL no longer lets us write its request: as good as gone.
            # Raising instead failed every pass of the pool worker, and no other request
            # of the pool was served any more.
            self.log.warning("Giving the request up: %s", exc)
            return GONE
        except errors.ZkConnectionError:
            # Ambiguous: the reply was lost. If the request carries exactly what we wrote,
            # the whole transaction was applied (it is atomic): nothing to do again.
            if written is None or not self._final_write_applied(written):
                raise
        for lock in locks:
            lock.mark_released()
        if with_request:
            self.lock.mark_released()
        return DONE

    def _final_write_applied(self, written: NodeRequest) -> bool:
        """Whether ZooKeeper holds exactly `written` one version on: the lost reply's
        transaction was applied (it is atomic, so the node writes were too)."""
        outcome = zk_locks.reconcile_write(self.engine.zk, paths.request_path(written.id),
                                           request_codec.encode(written), written.version)
        if outcome is None:
            return False
        self.request.version = outcome[0]
        self.log.info("The final write was applied although its reply was lost")
        return True

    def _final_failed(self, exc: errors.TxnFailed, locks: list[HeldLock]) -> Final:
        if exc.path == paths.request_path(self.request.id):
            if isinstance(exc.cause, errors.NoNodeError):
                return GONE
            if isinstance(exc.cause, errors.VersionConflict):
                # Nobody should write a request we hold locked; adopt what is there
                # (keeping our decision) and write it again on the next pass.
                fresh = self.engine.requests.get(self.request.id)
                if fresh is None:
                    return GONE
                self.request.version = fresh.version
                self.request.relative_priority = fresh.relative_priority
                self.request.extra = fresh.extra
                self.wake()
                return RETRY
        for slot in self.slots:
            if slot.node is not None and exc.path == paths.node_path(slot.node.id) \
                    and isinstance(exc.cause, errors.VersionConflict):
                # We hold this node's lock, so the newer version is a write of ours whose
                # reply was lost (or someone ignoring the lock): our decision stands, so
                # write it over that version on the next pass instead of failing forever.
                stat = self.engine.zk.exists(exc.path)
                if stat is None:
                    break
                self._node_log(slot.node).warning(
                    "Node changed under our lock (version %d, expected %d); writing again",
                    stat.version, slot.node.version)
                slot.node.version = stat.version
                self.wake()
                return RETRY
        for slot in self.slots:
            if slot.node is not None and exc.path == paths.node_path(slot.node.id) \
                    and isinstance(exc.cause, errors.NoNodeError):
                # Someone removed a node we held (e.g. an operator): replace it.
                self._node_log(slot.node).warning("Node vanished while locked; replacing it")
                if slot.lock is not None:
                    slot.lock.release()
                slot.state, slot.node, slot.lock = SlotState.NEED, None, None
                slot.result, slot.reused = None, False
                self.wake()
                return RETRY
        if exc.path.endswith(tuple(lock.node for lock in locks + [self.lock])):
            self.abandon("a lock vanished before the final write")
            return DONE
        raise exc.cause from exc

    def _fulfil(self) -> None:
        txn, locks = self._final_txn(allocated=True)
        nodes = [s.node.id for s in self.slots if s.node is not None]
        now = self.engine.clock.time()

        def fulfil(request: NodeRequest) -> None:
            request.nodes = list(nodes)
            transition_request(request, model.RequestState.FULFILLED, now)

        outcome = self._write_final(txn, locks, "fulfil", fulfil)
        if outcome is DONE and not self.done:
            self.span.set(OUTCOME, "fulfilled")
            if self.span.recording:
                self.span.set("nodepool.nodes", list(nodes))
        self._settle(outcome, "Fulfilled request with nodes %s", nodes)
        if outcome == DONE:
            for slot in self.slots:
                if slot.node is not None and not slot.reused:
                    lifecycle.report_ready(self.engine.stats, slot.node)
                    lifecycle.record_ready(self.engine.events, slot.node)
            self._report_done(now)

    def _decline(self, decline: plan.Decline) -> None:
        txn, locks = self._final_txn(allocated=False)
        registered = self.registered_ids() | {self.ref.pool_id}
        now = self.engine.clock.time()

        def record(request: NodeRequest) -> str:
            lifecycle.note_decline(request, self.ref.pool_id, decline)
            return plan.record_decline(request, self.ref.pool_id, registered, now)

        states: list[str] = []
        outcome = self._write_final(txn, locks, "decline",
                                    lambda request: states.append(record(request)))
        state = states[0]
        if outcome is DONE and not self.done:
            self.span.set(OUTCOME, "declined")
            self.span.fail(decline.code, decline.message)
        self._settle(outcome, "Declined request (%s); request is now %s", decline.message,
                     state)
        if outcome == DONE:
            self._report_done(now)
            lifecycle.record_declined(self.engine.events, self.request, self.ref.provider,
                                      self.ref.pool, decline)

    def _write_final(self, txn: Txn, locks: list[HeldLock], step: str,
                     change: Callable[[NodeRequest], object]) -> Final:
        """Write the request as a copy with `change` applied, in `txn` with the node writes,
        under a `step` span; the request itself takes the change only once that write went
        through (a RETRY leaves it as it was, and writes again in a span of its own)."""
        span = self.span.child(step)
        copy = self.request.copy()
        change(copy)
        self.engine.requests.add_store(txn, copy, self.lock, release=True)
        try:
            outcome = self._commit_final(txn, locks, written=copy)
        except Exception as exc:
            span.fail("Unknown", str(exc))
            raise
        finally:
            span.end()
        if outcome is not RETRY:
            change(self.request)
        return outcome

    def _report_done(self, now: float) -> None:
        """The request's wait, once it is fulfilled or failed (not declined for others)."""
        configs = self._configs()
        if configs is not None:
            lifecycle.report_request_done(self.engine.stats, self.request, self.ref.provider,
                                          configs[1], now)

    def _settle(self, outcome: Final, message: str, *args: object) -> Final:
        """Act on the outcome of the final transaction (see `_commit_final`)."""
        if outcome is GONE:
            self._finish_cancelled()
        elif outcome is DONE and not self.done:
            self._enter(HandlerState.DONE)
            self.log.info(message, *args)
        return outcome

    def _finish_cancelled(self) -> None:
        """The requestor deleted the request: keep its ready nodes, unallocated, for reuse.

        Only called once no launch is running: launches of a cancelled request finish,
        so their nodes can serve the next request.
        """
        txn, locks = self._final_txn(allocated=False)
        try:
            if len(txn):
                self._commit_final(txn, locks, written=None)
        finally:
            for slot in self.slots:
                if slot.lock is not None and not slot.lock.released:
                    slot.lock.release()
            self.lock.release()
        self.span.set(OUTCOME, "cancelled")
        self._enter(HandlerState.DONE)
        self.log.info("Request was cancelled; released %d ready node(s) for reuse",
                      len(locks))
