"""One worker per (provider, pool): takes requests and drives their handlers.

Owns: the pool's component registration (labels, priority, paused), its request handlers,
and each pass of the Nodepool algorithm for this pool (nodepool-protocol.md §2.2-2.3):

1. advance handlers in request-priority order; a handler waiting for capacity stops the
   ones behind it from taking capacity first (paused requests are served in order);
2. while any handler waits, the pool is paused: it accepts nothing new, but still declines
   what it can never serve, and asks for the oldest unused ready node to be deleted so a
   pool full of idle nodes of other labels cannot wedge;
3. walk the cached requests in pool order; `plan.triage` decides; tenant limits defer;
   then lock and decline or accept. A request nobody has locked yet (its lock dir does
   not exist) is locked and written in one versioned transaction, the version standing in
   for the re-read; otherwise: lock without blocking, re-read, decide again, write. A
   race lost to another launcher's transaction costs one read (the request is then
   skipped until the cache shows that version), and a lock another contender holds is
   seen by listing the lock dir, without a contender of ours. Where the request cache
   follows the request locks, a request whose lock dir shows a contender is not tried at
   all (its release is a cache event that wakes the pool), and an entry with changes not
   read yet is read before the pass acts on it.
   Fresh requests that qualify are accepted together (`requests.batch.Batch`, which
   reaches this worker only through its public `BatchOwner` methods). A request it would
   take but holds back (paused, drained, busy, its tenant at its limit) while no other
   pool takes it is counted in the status's `requests_queued`, and why it waits is
   written onto it (`waiting_reasons`) when that changed, for the causes that last (an
   operator's or a window's pause or drain, a tenant limit). A request held back with
   nothing to write is not triaged again while it and the pass's inputs (the registered
   pools, the configuration, the cloud's limits, why the pool waits) stay the same and
   no answer depends on the time (no label suspended or remembered as handed back).

Requests it cannot serve now (`_hand_back`): while its provider's API server cannot be
used the pool counts as paused (registered so: other pools stop yielding to it), starts no
launch and accepts nothing; a request it holds while so, or while paused or drained (one
that waits), or whose launches the cluster keeps refusing for quota, is handed back (a
decline with reason `HandedBack`) once the cause lasted the provider's `hand-back-after`
and another registered pool could serve it (`plan.hand_back`); otherwise it waits here,
saying why. Labels handed back are declined (`RecentlyFailed`) for `recently-failed-ttl`
while another pool could take them, so the next request goes there at once.

What it uses of the engine is `PoolWorkerDeps`; the handlers, the batch and fleet control
each name their own slice of it.

Passes are triggered by cache events, launch completions and deadlines; there is no sleep
per request and no fixed tick. Deadlines and rate limits (the retry after losing a lock
race or after the cloud's quota refusal, the spares' disruption check, reclaiming, the
status's interval) are monotonic time; a maintenance window's next change is a wall-clock
moment, turned into a deadline afresh on every pass. Failure: a pass that raises is logged and
retried; a lost session abandons every handler without writing (see handler.py).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from nodepool_k8s.runtime import logconfig, stats
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model, quota
from nodepool_k8s.runtime.clock import wall_deadline
from nodepool_k8s.config.model import PoolConfig, ProviderConfig
from nodepool_k8s.core.transition import transition_request
from nodepool_k8s.driver.base import ClusterAware, Provider
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.launcher.upkeep import disruption, fleet
from nodepool_k8s.launcher import lifecycle, plan
from nodepool_k8s.launcher.reporting import pool_status
from nodepool_k8s.launcher.breaker import PoolBreaker
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.launcher.requests.batch import Batch, copy_request
from nodepool_k8s.launcher.requests.handler import (HandlerDeps, HandlerState, PoolRef,
                                                    RequestHandler)
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.launcher.requests.launch import LaunchPool
from nodepool_k8s.launcher.worker import RefusedRequests, Worker
from nodepool_k8s.core.model import Node, NodeRequest, Resources
from nodepool_k8s.core.pool_records import PoolStatusRecord
from nodepool_k8s.zk import errors
from nodepool_k8s.zk.cache import ComponentCache
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.pool_state import DRAIN, PoolState
from nodepool_k8s.zk.pool_status import BreakerRecord, JsonDirCache, StatusWriter
from nodepool_k8s.zk.registry import ComponentRegistry, Registration, pool_worker_id


def _hold(control: PoolState | None) -> pool_status.Hold | None:
    """The pause or drain in force, as the pool status shows it."""
    if control is None:
        return None
    verb = "drained" if control.action == DRAIN else "paused"
    if control.source == "maintenance":
        return pool_status.Hold(control.action, f"{verb} by a {control.reason}")
    by = f" by {control.by}" if control.by else ""
    why = f": {control.reason}" if control.reason else ""
    return pool_status.Hold(control.action, f"{verb}{by} ({control.source}){why}")


# Why a pool hands requests back that is a failure of the pool (not an operator's pause or
# drain): its labels are then left to other pools for `recently-failed-ttl`.
FAILING = frozenset({"ProviderUnhealthy", "LaunchBackoff"})

# After losing the race for a request's lock, look at the request again this much later.
CONTENDED_RETRY = 0.2


@dataclass(frozen=True)
class PassView:
    """What one pass decides every request against (read once at the start of the
    accepting part of the pass)."""

    provider: Provider
    provider_cfg: ProviderConfig
    pool_cfg: PoolConfig
    me: plan.PoolInfo  # this pool, as `plan.triage` sees it
    registered: list[plan.PoolInfo]  # every registered pool, this one included
    cloud: Resources  # the provider's cloud limits


def waiting_for(control: PoolState | None, pool: PoolConfig) -> plan.Waiting | None:
    """Why a pool an operator or a maintenance window paused or drained holds a request
    back (None when neither does)."""
    if control is None:
        return None
    what = "drained" if control.action == DRAIN else "paused"
    if control.source == "maintenance":
        why = f"{control.reason}"
    else:
        why = f"by {control.by or 'an operator'}" + (f": {control.reason}"
                                                     if control.reason else "")
    return plan.Waiting("PoolDraining" if control.action == DRAIN else "PoolPaused",
                        f"pool {pool.provider}/{pool.name} is {what} ({why})")


def _waits_for_quota(request: NodeRequest, pools: set[str]) -> bool:
    """Whether `request` is pending with a `WaitingForQuota` note of one of `pools`."""
    notes = request.extra.get(model.WAITING_REASONS)
    return request.state == model.RequestState.PENDING and isinstance(notes, dict) and any(
        isinstance(note, dict) and note.get("reason") == "WaitingForQuota"
        for pool_id, note in notes.items() if pool_id in pools)


class PoolWorkerDeps(HandlerDeps, disruption.DisruptionDeps, Protocol):
    """What a pool worker uses of the engine, on top of its handlers' and fleet
    control's (`launcher.context.Engine` provides it)."""

    @property
    def acting(self) -> bool: ...

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...

    @property
    def registry(self) -> ComponentRegistry: ...

    @property
    def components(self) -> ComponentCache: ...

    @property
    def breakers(self) -> JsonDirCache[BreakerRecord]: ...

    @property
    def pool_statuses(self) -> JsonDirCache[dict[str, Any]]: ...

    @property
    def cluster_aware(self) -> Mapping[str, ClusterAware]: ...

    @property
    def stuck_requests(self) -> frozenset[str]: ...

    @property
    def unhandable(self) -> frozenset[str]: ...

    def pool_config(self, provider: str | None, pool: str | None) -> PoolConfig | None: ...

    def registered_pools(self) -> list[plan.PoolInfo]: ...


class PoolWorker(Worker):
    def __init__(self, engine: PoolWorkerDeps, provider: str, pool: str, launches: LaunchPool,
                 fqdn: str | None = None, first: LaunchFirst | None = None) -> None:
        """`first`: told after each pass whether a request waits for quota or capacity
        here (the deleter yields to launches only while none does)."""
        super().__init__(f"PoolWorker.{provider}-{pool}", engine.clock, engine.stats.thread_crashed)
        self.engine = engine
        self.ref = PoolRef(pool_worker_id(provider, pool, fqdn), provider, pool)
        self.id = self.ref.pool_id
        self.launches = launches
        # Only this worker's thread adds or removes handlers, under `_handlers_lock`; other
        # threads (the ZooKeeper state thread's cancel_launches, the stop) read a snapshot
        # taken under it. The worker's own thread may read without it.
        self.handlers: dict[str, RequestHandler] = {}
        self._handlers_lock = threading.Lock()
        self.registration: Registration | None = None
        self._epoch = engine.zk.epoch
        self._last_reclaim = -math.inf  # monotonic, as every deadline of the worker
        # Spares removed for drift, expiry, surplus or a drain (see disruption.py).
        self.disruptor = disruption.Disruptor(provider, pool)
        self._reported_paused = False  # the pause state last put in the event log
        # The ApiReachable (status, reason) last seen: its transitions go to the event log.
        self._api_seen: tuple[str, str] | None = None
        # Circuit breaker (shared by every launcher of this pool) and the published status.
        self.breaker = PoolBreaker(engine.zk, engine.breakers, provider, pool, self.id,
                                   engine.clock)
        self._probes: set[str] = set()  # requests accepted as a suspended label's probe
        self._status = pool_status.StatusBuilder(engine.settings.pool_status_interval)
        self._status_writer = StatusWriter(engine.zk, self.id)
        self.published_status: PoolStatusRecord | None = None
        self._contended = False
        # Requests whose lock dir exists (someone locked them before): never batched.
        self._lock_dir_seen: set[str] = set()
        # Requests a fresh read showed taken by another launcher -> the version read: the
        # cache's older copies of them are skipped (`taken_elsewhere`).
        self._taken_elsewhere: dict[str, int] = {}
        self.refused = RefusedRequests(self.log)
        # Requests whose `waiting_reasons` entry we wrote and the version we wrote, until
        # the cache shows it; and how many requests we held back in the last pass.
        self._waiting_written: dict[str, tuple[dict[str, str] | None, int]] = {}
        self._held_back_count = 0
        # Requests held back with nothing left to write, by a pass whose answers could not
        # change with the time (no label suspended or remembered as handed back) -> (the
        # version held back, whether it counted in `requests_queued`). Valid while the
        # pass's inputs (`_held_inputs`) and the request stay the same: a paused pool's
        # walk over a long queue costs a look-up per request, not a triage (a burst's
        # passes would otherwise grow with the square of its size).
        self._held: dict[str, tuple[int, int]] = {}
        self._held_inputs: tuple[Any, ...] | None = None
        # Why the whole pool cannot serve now (its provider unhealthy, paused, drained) and
        # since when (monotonic), for the hand-back; labels it handed back lately.
        self._unable: plan.Unable | None = None
        self._unhealthy: plan.Waiting | None = None
        self.recently_failed = plan.RecentlyFailed()
        self.first = first
        self._tenant_waits = False  # the last pass held a request back for its tenant's limit

    # -- registration ---------------------------------------------------------------------
    def register(self) -> None:
        pool = self.engine.pool_config(self.ref.provider, self.ref.pool)
        labels = sorted(pool.labels) if pool else []
        self.registration = self.engine.registry.register_pool(
            self.id, self.ref.provider, self.ref.pool, labels,
            pool.priority if pool else 100)

    def unregister(self) -> None:
        if self.first is not None:
            self.first.set_waiting(self.id, self.ref.provider, False)
        self._status_writer.remove()
        if self.registration is not None:
            self.engine.registry.unregister(self.registration)
            self.registration = None

    @property
    def paused(self) -> bool:
        return any(h.paused for h in self._handler_snapshot())

    def _handler_snapshot(self) -> list[RequestHandler]:
        with self._handlers_lock:
            return list(self.handlers.values())

    def _remove_handlers(self, request_ids: list[str]) -> None:
        with self._handlers_lock:
            for request_id in request_ids:
                self.handlers.pop(request_id, None)

    # -- the pass -------------------------------------------------------------------------
    def run_once(self) -> float | None:
        engine = self.engine
        if engine.zk.epoch != self._epoch:
            self._epoch = engine.zk.epoch
            self._drop_expired_handlers()
            # The status znode was ephemeral: without this an unchanged pool would stay
            # absent from pool-list and /metrics until its state next changed.
            self._status.republish()
        if not engine.acting:
            return None
        provider_cfg = engine.provider_config(self.ref.provider)
        pool_cfg = provider_cfg.pools.get(self.ref.pool) if provider_cfg else None
        provider = engine.providers.get(self.ref.provider)
        if provider_cfg is None or pool_cfg is None or provider is None:
            return None
        registered = self._registered(pool_cfg)
        # Paused or drained by the operator or a maintenance window: accept nothing (and
        # decline nothing only this pool could serve: such requests wait); in-flight
        # handlers carry on. Draining also deletes the pool's spare nodes.
        control = fleet.control(engine, self.ref.provider, pool_cfg)
        disruption_due = self.disruptor.run(engine, pool_cfg, control)
        self._unhealthy = self._provider_unhealthy()
        for handler in self.handlers.values():
            handler.hold(self._unhealthy)
        paused = self._advance_handlers() or control is not None \
            or self._unhealthy is not None
        hand_back_due = self._hand_back(provider_cfg, pool_cfg, registered, control)
        scopes = {h.blocked_scope for h in self.handlers.values() if h.paused}
        if scopes & {quota.SCOPE_POOL, quota.SCOPE_PROVIDER, quota.SCOPE_CLOUD}:
            self._reclaim(whole_provider=bool(scopes - {quota.SCOPE_POOL}))
        paused = self._assign(provider_cfg, pool_cfg, provider, registered, paused, control)
        if self.first is not None:  # what a deletion would free is awaited here
            self.first.set_waiting(self.id, self.ref.provider, paused or self._tenant_waits)
        if paused != self._reported_paused:
            self._reported_paused = paused
            # Batched: a pool at quota may pause and resume once per freed node.
            engine.events.record_batched(
                zk_events.POOL_PAUSED if paused else zk_events.POOL_RESUMED,
                provider=self.ref.provider, pool=self.ref.pool,
                message=(self._unhealthy.message if self._unhealthy is not None
                         else ", ".join(sorted(str(s) for s in scopes if s)))
                if paused else "")
        if self.registration is not None:
            # Other pools yield to us only while we are not paused: keep it current.
            engine.registry.update(self.registration, paused=paused,
                                   supported_labels=sorted(pool_cfg.labels),
                                   priority=pool_cfg.priority)
        deadlines = [h.next_deadline for h in self.handlers.values()
                     if h.next_deadline is not None]
        window_change = maintenance.next_change(pool_cfg, engine.clock.time())
        if window_change is not None:
            deadlines.append(wall_deadline(engine.clock, window_change))
        if disruption_due is not None:
            deadlines.append(disruption_due)
        deadlines += hand_back_due
        deadlines += self._publish_status(provider_cfg, pool_cfg, provider, control)
        if self._contended:
            self._contended = False
            deadlines.append(self.clock.monotonic() + CONTENDED_RETRY)
        return min(deadlines) if deadlines else None

    # -- requests it cannot serve now -----------------------------------------------------
    def _provider_unhealthy(self) -> plan.Waiting | None:
        """Why no launch may start: the provider's API server cannot be used (None: it
        can, or the provider does not say)."""
        cluster = self.engine.cluster_aware.get(self.ref.provider)
        health = cluster.api_health() if cluster is not None else None
        if health is None or health.healthy is not False:
            return None
        return plan.Waiting("ProviderUnhealthy", f"the API server of provider"
                            f" {self.ref.provider} cannot be used ({health.reason})")

    def _pool_unable(self, pool_cfg: PoolConfig,
                     control: PoolState | None) -> plan.Unable | None:
        """Why the pool cannot serve what it holds, since when (kept while the cause stays
        the same)."""
        waiting = self._unhealthy or waiting_for(control, pool_cfg)
        if waiting is None:
            self._unable = None
        elif self._unable is None or self._unable.waiting.code != waiting.code:
            self._unable = plan.Unable(waiting, self.clock.monotonic())
        elif self._unable.waiting != waiting:
            self._unable = plan.Unable(waiting, self._unable.since)
        return self._unable

    def _handler_unable(self, handler: RequestHandler,
                        pool: plan.Unable | None) -> plan.Unable | None:
        """Why `handler`'s request cannot be served here now: the pool's cause (the
        provider unhealthy: whatever the handler does; paused or drained: while the handler
        waits), or the cloud refusing its launches (waiting after an aborted launch)."""
        if pool is not None and (self._unhealthy is not None or handler.paused):
            return pool
        if handler.state is HandlerState.BACKING_OFF and handler.refused_since is not None:
            waiting = handler.waiting()
            if waiting is not None:
                return plan.Unable(waiting, handler.refused_since)
        return None

    def _hand_back(self, provider_cfg: ProviderConfig, pool_cfg: PoolConfig,
                   registered: list[plan.PoolInfo],
                   control: PoolState | None) -> list[float]:
        """Hand back the requests this pool cannot serve now that another pool could
        (`plan.hand_back`); the times to look again."""
        pool = self._pool_unable(pool_cfg, control)
        now = self.clock.monotonic()
        deadlines: list[float] = []
        handed: list[RequestHandler] = []
        for handler in list(self.handlers.values()):
            if handler.done or handler.handing_back is not None:
                continue
            unable = self._handler_unable(handler, pool)
            if unable is None:
                continue  # the common case, every pass of a busy pool: nothing to decide
            decline, due = plan.hand_back(handler.request, self.id, registered, unable, now,
                                          provider_cfg.hand_back_after)
            if due is not None:
                deadlines.append(due)
            if decline is None or unable is None:
                continue
            handler.hand_back(decline)
            if unable.waiting.code in FAILING:
                self.recently_failed.remember(handler.request.node_types, now,
                                              provider_cfg.recently_failed_ttl)
            self.engine.stats.handed_back(self.ref.provider, self.ref.pool,
                                          unable.waiting.code)
            handed.append(handler)
        for handler in handed:
            handler.advance(may_allocate=False)  # declines now unless launches still run
        if handed:
            self._remove_handlers([h.request.id for h in handed if h.done])
        # A remembered label is looked at again when it is forgotten.
        deadlines += self.recently_failed.active(now).values()
        return deadlines

    def _registered(self, pool_cfg: PoolConfig) -> list[plan.PoolInfo]:
        pools = [p for p in self.engine.registered_pools() if p.id != self.id]
        # Our own entry may not be visible in the cache yet: we are registered regardless.
        pools.append(plan.PoolInfo(self.id, self.ref.provider, frozenset(pool_cfg.labels),
                                   pool_cfg.priority, self.paused))
        return pools

    def registered_ids(self) -> set[str]:
        return {p.id for p in self.engine.registered_pools()} | {self.id}

    def _advance_handlers(self) -> bool:
        may_allocate = True
        for handler in sorted(self.handlers.values(), key=lambda h: h.request.sort_key()):
            if handler.advance(may_allocate=may_allocate):
                may_allocate = False
        self._remove_handlers([k for k, h in self.handlers.items() if h.done])
        return self.paused

    def _assign(self, provider_cfg: ProviderConfig, pool_cfg: PoolConfig,
                provider: Provider, registered: list[plan.PoolInfo], paused: bool,
                control: PoolState | None = None) -> bool:
        view = PassView(provider, provider_cfg, pool_cfg,
                        me=next(p for p in registered if p.id == self.id),
                        registered=registered, cloud=provider.cloud_limits())
        me, cloud = view.me, view.cloud
        tenant_usage: list[quota.UsageRecord] | None = None
        held_back = 0
        self._tenant_waits = False
        waiting = self._unhealthy or waiting_for(control, pool_cfg)
        inputs = (registered, pool_cfg, provider_cfg, cloud, waiting) \
            if self.breaker.quiet() and not self.recently_failed else None
        if inputs is None or inputs != self._held_inputs:
            self._held.clear()
        self._held_inputs = inputs
        # Once one request waits for a launch slot, every later one waits in this pass
        # too: a slot that frees while the pass walks the queue goes to the oldest request
        # at the next pass, not to whichever request the walk has reached (a burst would
        # otherwise hand slots to requests far behind the ones held back before them).
        full = False
        batch = Batch(self.engine, self, self.ref, provider, provider_cfg, pool_cfg)
        cache = self.engine.request_cache
        requests = cache.requests()
        # Locked for ever by a contender that is not ephemeral (the cleanup reported it):
        # trying its lock again every CONTENDED_RETRY would only cost three writes each time.
        stuck = self.engine.stuck_requests
        taken = self._taken_elsewhere
        if self._lock_dir_seen or self.refused or self._waiting_written or taken \
                or self._held:
            ids = {r.id for r in requests}
            self._lock_dir_seen &= ids
            for request in requests:
                if taken.get(request.id, -1) <= request.version:
                    taken.pop(request.id, None)  # the cache caught up (or it is gone)
            for gone in taken.keys() - ids:
                del taken[gone]
            self.refused.keep_only(ids)
            for gone in self._waiting_written.keys() - ids:
                del self._waiting_written[gone]
            for gone in self._held.keys() - ids:
                del self._held[gone]
        for request in plan.order(requests, pool_cfg.labels):
            if self.engine.stopping.is_set():
                break
            if request.id in self.handlers or request.state != model.RequestState.REQUESTED \
                    or self.id in request.declined_by or self._creator_starting(request) \
                    or self.refused.skip(request) or request.id in stuck \
                    or request.id in taken or cache.is_locked(request.id) \
                    or cache.is_closed(request.id):
                # Locked (its lock dir shows a contender): a lock attempt cannot win, and
                # its release comes as a cache event that wakes this worker. Closed by its
                # taker (fulfilled or failed, unread): nothing to serve.
                continue
            if inputs is not None and (held := self._held.get(request.id)) is not None \
                    and held[0] == request.version and not cache.is_stale(request.id) \
                    and (paused or full or self._at_concurrency(provider_cfg,
                                                                batch.node_count)):
                full = True  # held back again, as the last pass decided
                held_back += held[1]
                continue
            decision = plan.triage(request, me, pool_cfg, provider_cfg, registered, cloud)
            if decision.verdict is plan.Verdict.SKIP:
                continue
            if cache.is_stale(request.id):
                # Changes not read yet (made under a lock just released, or being read):
                # read them before acting on what is held (one read, shared).
                cache.refresh([request.id])
                current = cache.get(request.id)
                if current is None or current.state != model.RequestState.REQUESTED \
                        or self.id in current.declined_by or cache.is_locked(request.id) \
                        or cache.is_stale(request.id):
                    continue
                request = current
                decision = plan.triage(request, me, pool_cfg, provider_cfg, registered,
                                       cloud)
                if decision.verdict is plan.Verdict.SKIP:
                    continue
            refusal, probe = None, False
            if decision.verdict is plan.Verdict.ACCEPT:
                accepting = not paused and not full \
                    and not self._at_concurrency(provider_cfg)
                refusal, probe = self._breaker_check(request.node_types, pool_cfg,
                                                     accepting)
                if refusal is None:  # a label handed back lately: another pool's for now
                    refusal = self.recently_failed.refusal(request, self.id, registered,
                                                           self.clock.monotonic())
                if refusal:  # a suspended label: let another pool or provider serve it
                    decision = plan.Decision.declined(refusal)
            if decision.verdict is plan.Verdict.ACCEPT:
                if paused or full or self._at_concurrency(provider_cfg, batch.node_count):
                    full = True
                    really, settled = self._held_back(request, registered, waiting)
                    held_back += really
                    if inputs is not None and settled:
                        self._held[request.id] = (request.version, really)
                    continue
                if tenant_usage is None:
                    limited = self.engine.config.tenant_resource_limits
                    if limited:
                        # A spare another launcher handed out again carries its new
                        # tenant in changes the cache may have left to that launcher.
                        nodes, mine = self.engine.node_cache, self.engine.registry.pool_ids()
                        nodes.refresh([i for i in nodes.left_unread() if (n := nodes.get(i))
                                       is not None and n.launcher not in mine])
                    tenant_usage = self.engine.cached_usage(
                        lambda node: node.tenant_name in limited)
                if not self._tenant_fits(request, pool_cfg, tenant_usage):
                    self._tenant_waits = True
                    # Over the tenant's limit: defer, neither decline nor pause. The
                    # limit binds in every pool: another one would not take it either.
                    held_back += self._held_back(request, registered, plan.Waiting(
                        "TenantAtLimit", f"tenant {request.tenant_name} is at its"
                        " tenant-resource-limits"), everywhere=True)[0]
                    continue
                if not probe and batch.add(request, functools.partial(
                        self._take, request, decision, view, refusal=refusal)):
                    continue  # accepted together with the next ones (`Batch.flush`)
            # Anything else is taken on its own, after the batch before it (order kept).
            paused = batch.flush(paused)
            try:
                handler = self._take(request, decision, view, paused, refusal)
            except errors.ZkAuthError as exc:
                self.refused.refuse(request, exc)
                continue
            if handler is not None:
                if probe:
                    self._probes.add(handler.request.id)
                paused = self.adopt(handler, paused, may_allocate=True)
        self._held_back_count = held_back
        return batch.flush(paused)

    # -- requests this pool holds back (why they wait) ------------------------------------
    def _held_back(self, request: NodeRequest, registered: list[plan.PoolInfo],
                   waiting: plan.Waiting | None,
                   everywhere: bool = False) -> tuple[int, bool]:
        """A request this pool would take but holds back for now: (1 if it really waits
        (no other registered pool that is not paused could take it, or the cause binds
        in every pool: `everywhere`; counted in the pool's `requests_queued`), else 0;
        whether the request already says so: nothing was or is to be written).
        `waiting`: the cause to write onto the request (None: one that passes by itself,
        a pause for capacity or max-concurrency, which readers see from the pool's own
        `paused` and status; writing those onto every request a busy pool holds back
        would cost a write per request at each pause)."""
        wanted = set(request.node_types)
        if not everywhere and any(
                p.id != self.id and not p.paused and p.id not in request.declined_by
                and wanted <= p.labels for p in registered):
            waiting = None  # another pool takes it: nothing to say, nothing to write
            really = 0
        else:
            really = 1
        return really, self._note_held_back(request, waiting)

    def _note_held_back(self, request: NodeRequest, waiting: plan.Waiting | None) -> bool:
        """Write why this pool holds `request` back onto it when that changed: lock, write,
        unlock (one transaction when nobody locked it before). The request is the cache's:
        until our write comes back through the cache, what we wrote is remembered, so a
        pass in between does not write it again. True when the request says so already."""
        wanted = waiting.to_dict() if waiting is not None else None
        if lifecycle.waiting_note(request, self.id) == wanted:
            self._waiting_written.pop(request.id, None)
            return True
        written = self._waiting_written.get(request.id)
        if written is not None and written[0] == wanted and request.version < written[1]:
            return False  # ours, not in the cache yet
        requests = self.engine.requests
        try:
            fresh = copy_request(request)
            lifecycle.note_waiting(fresh, self.id, waiting)
            if not self.lock_dir_seen(request.id):
                if requests.store_fresh(fresh, release=True) is not None:
                    self._waiting_written[request.id] = (wanted, fresh.version)
                    return False
                self.saw_lock_dir(request.id)
            got = requests.lock_and_read(request.id)
            if got is None:
                self._contended = True  # someone holds it: look again shortly
                return False
            lock, fresh = got
            try:
                if fresh.state == model.RequestState.REQUESTED \
                        and lifecycle.note_waiting(fresh, self.id, waiting):
                    requests.store(fresh, lock, release=True)
                    self._waiting_written[request.id] = (wanted, fresh.version)
            finally:
                if not lock.released:
                    lock.release()
        except (errors.NoNodeError, errors.VersionConflict):
            return False  # it changed meanwhile; the cache event brings us back
        except errors.NodepoolError as exc:
            logconfig.annotate(self.log, request.event_id, request.id).warning(
                "Could not note why the request waits: %s", exc)
        return False

    # -- what a batch asks of its pool worker (requests.batch.BatchOwner) ----------------
    def lock_dir_seen(self, request_id: str) -> bool:
        return request_id in self._lock_dir_seen

    def saw_lock_dir(self, request_id: str) -> None:
        self._lock_dir_seen.add(request_id)

    def taken_elsewhere(self, request: NodeRequest) -> None:
        """A fresh read showed `request` no longer `requested` (another launcher took or
        declined it): until the cache shows a version at least as new, its stale copy is
        skipped (trying it would cost a lock attempt to find it taken)."""
        self._taken_elsewhere[request.id] = request.version

    def keep(self, handler: RequestHandler) -> None:
        with self._handlers_lock:
            self.handlers[handler.request.id] = handler

    def refuse(self, request: NodeRequest, exc: Exception) -> None:
        self.refused.refuse(request, exc)

    def adopt(self, handler: RequestHandler, paused: bool, may_allocate: bool) -> bool:
        """Keep a newly accepted handler and advance it once; whether the pool is paused."""
        self.keep(handler)
        if handler.advance(may_allocate=may_allocate):
            paused = True
        if handler.done:
            self._remove_handlers([handler.request.id])
        return paused

    def _take(self, request: NodeRequest, decision: plan.Decision, view: PassView,
              paused: bool, refusal: plan.Decline | None = None) -> RequestHandler | None:
        """Lock the request and decline or accept it; the accepted one's handler."""
        requests = self.engine.requests
        started = self.engine.tracer.now()
        # Fast path (most requests): nobody ever locked it, so its lock dir does not exist;
        # lock + write (+ unlock for a decline) is one transaction, versioned against the
        # copy we decided on (which stands in for the re-read after locking).
        fresh = copy_request(request)
        decline = decision.decline
        self._prepare(fresh, decline)
        lock: HeldLock | None = None
        if not self.lock_dir_seen(request.id):
            try:
                lock = requests.store_fresh(fresh, release=decline is not None)
            except (errors.NoNodeError, errors.VersionConflict):
                return None  # it changed meanwhile; the cache event brings us back
            if lock is None:
                self.saw_lock_dir(request.id)
                # Mostly another launcher's same transaction won and wrote `pending` with
                # its lock: one read tells, and losing costs nothing more.
                now = requests.get(request.id)
                if now is None or now.state != model.RequestState.REQUESTED:
                    if now is not None:
                        self.taken_elsewhere(now)
                    return None
        if lock is None:
            # Somebody locked it before: the ordinary way, lock, re-read, decide again;
            # not while another's contender is in the lock dir (that attempt would cost a
            # contender's create and deletion to find it held).
            got = requests.lock_and_read(request.id, look_first=True)
            if got is None:
                # Another pool holds the lock; if it lets go without writing (it skipped the
                # request), no cache event follows: look again shortly.
                self._contended = True
                return None
            lock, fresh = got
            try:
                decision = plan.triage(fresh, view.me, view.pool_cfg, view.provider_cfg,
                                       view.registered, view.cloud)
                if refusal and decision.verdict is plan.Verdict.ACCEPT:
                    decision = plan.Decision.declined(refusal)
                if decision.verdict is plan.Verdict.SKIP \
                        or (decision.verdict is plan.Verdict.ACCEPT and paused):
                    lock.release()
                    return None
                decline = decision.decline
                self._prepare(fresh, decline)
                requests.store(fresh, lock, release=decline is not None)
            except Exception:
                if not lock.released:
                    lock.release()
                raise
        if decline is not None:
            logconfig.annotate(self.log, fresh.event_id, fresh.id).info(
                "Declined (%s); request is now %s", decline.message, fresh.state)
            lifecycle.report_request_done(self.engine.stats, fresh, self.ref.provider,
                                          view.pool_cfg, self.engine.clock.time())
            lifecycle.record_declined(self.engine.events, fresh, self.ref.provider,
                                      self.ref.pool, decline)
            return None
        return self.new_handler(view.provider, fresh, lock, started)

    def new_handler(self, provider: Provider, request: NodeRequest,
                    lock: HeldLock, accept_started: int = 0) -> RequestHandler:
        handler = RequestHandler(self.engine, self.ref, provider, self.launches, request,
                                 lock, self.registered_ids, self.wake, accept_started)
        handler.refuse = self._breaker_refusal
        handler.older_waits = self._older_waits
        handler.on_launch_done = self._launch_done
        if handler.span.recording:
            handler.log.info("Accepted request for %s (trace %s)", request.node_types,
                             handler.span.trace_id)
        else:
            handler.log.info("Accepted request for %s", request.node_types)
        return handler

    def _older_waits(self, request: NodeRequest) -> bool:
        """Whether another registered launcher of this pool (same provider and pool name)
        holds a request older than `request` (Nodepool's order) that waits for quota.

        Reads nothing from ZooKeeper. A peer writes its `WaitingForQuota` note under its
        lock, and a cache that follows locks leaves such changes unread until the lock
        goes; reading them here cost a read per older request and pass. So the answer
        comes from what is known without them: a peer's registration says `paused` (a
        request of it waits: for quota, or for its provider or its operator) and an older
        request of our labels is in someone else's lock dir, not closed, without all its
        nodes in the node cache (`_peer_may_wait`). At quota a paused pool takes no new
        request and serves its requests oldest first, so such a request is the one it
        waits for, or one queued behind an older one that does. Where that is wrong
        (the holder is not the paused peer; its pause is not for quota) the handler
        waits `quota_yield` or until the room is taken, never longer; a peer's note or
        registration not seen yet only loses the order: the guard holds the quota either
        way. A cache that does not follow locks reads every change: its notes are current.
        """
        own = f"PoolWorker.{self.ref.provider}-{self.ref.pool}"
        peers = [p for p in self.engine.registered_pools()
                 if p.id != self.id and p.provider == self.ref.provider
                 and p.id.rsplit("-", 1)[0].endswith(own)]
        if not peers:
            return False
        mine = request.sort_key()
        cache = self.engine.request_cache
        if cache.follows_locks():
            return any(p.paused for p in peers) and self._peer_may_wait(request, mine)
        # Without lock following nothing is skipped for a lock; a read still in flight
        # is waited for (not those closed by their taker: they hold nothing back).
        cache.refresh([r.id for r in cache.requests()
                       if r.sort_key() < mine and not cache.is_closed(r.id)])
        peer_ids = {p.id for p in peers}
        return any(r.sort_key() < mine and r.id != request.id and _waits_for_quota(r, peer_ids)
                   and not cache.is_closed(r.id) for r in cache.requests())

    def _peer_may_wait(self, request: NodeRequest, mine: tuple[str, int, str]) -> bool:
        """Whether the request cache shows, without reading, an older request of this
        pool's labels that someone else holds and that still lacks nodes (see
        `_older_waits`)."""
        pool_cfg = self.engine.pool_config(self.ref.provider, self.ref.pool)
        if pool_cfg is None:
            return False
        labels = pool_cfg.labels
        cache, nodes = self.engine.request_cache, self.engine.node_cache
        for other in cache.requests():
            if other.sort_key() >= mine or other.id == request.id \
                    or other.id in self.handlers \
                    or other.state not in (model.RequestState.REQUESTED,
                                           model.RequestState.PENDING) \
                    or not all(label in labels for label in other.node_types) \
                    or not cache.held_elsewhere(other.id) or cache.is_closed(other.id):
                continue
            if len(nodes.allocated_to(other.id)) < len(other.node_types):
                return True
        # Requests this cache never read (left to another launcher's first look, and taken
        # by it): older by what their ids tell (relative priority unknown: 0), held by
        # someone else, not closed, no node of theirs in the node cache yet. Their labels
        # are not known, but a first look is only taken where every pool serves the same.
        for other_id in cache.unread():
            other_priority, _, other_sequence = other_id.partition("-")
            if (other_priority, 0, other_sequence) >= mine \
                    or other_id == request.id or other_id in self.handlers \
                    or not cache.held_elsewhere(other_id) or cache.is_closed(other_id):
                continue
            if not nodes.allocated_to(other_id):
                return True
        return False

    # -- circuit breaker and status --------------------------------------------------------
    def _breaker_check(self, labels: list[str], pool_cfg: PoolConfig,
                       accepting: bool) -> tuple[plan.Decline | None, bool]:
        """The circuit breaker's answer (`breaker.check`), its refusal as a decline."""
        refusal, probe = self.breaker.check(labels, pool_cfg, self.clock.time(), accepting)
        return (plan.Decline("LabelSuspended", refusal) if refusal else None), probe

    def _breaker_refusal(self, request: NodeRequest) -> plan.Decline | None:
        """An accepted request whose label got suspended meanwhile is declined (so it is
        served elsewhere, or fails cleanly), except the probe itself."""
        pool_cfg = self.engine.pool_config(self.ref.provider, self.ref.pool)
        if pool_cfg is None or request.id in self._probes:
            return None
        return self._breaker_check(request.node_types, pool_cfg, accepting=False)[0]

    def _launch_done(self, label: str, error: str | None) -> None:
        pool_cfg = self.engine.pool_config(self.ref.provider, self.ref.pool)
        label_cfg = pool_cfg.labels.get(label) if pool_cfg else None
        if pool_cfg is not None and label_cfg is not None:
            self.breaker.record(label_cfg, pool_cfg, error, self.clock.time())

    def _publish_status(self, provider_cfg: ProviderConfig, pool_cfg: PoolConfig,
                        provider: Provider, control: PoolState | None = None) -> list[float]:
        """Publish this pool's status if it changed; the time to look again, if any."""
        self._probes &= set(self.handlers)
        # Wall time for what is written (transition times, "probe in"); monotonic for
        # when to write and when to look again.
        now, mono = self.clock.time(), self.clock.monotonic()
        engine = self.engine
        nodes = engine.node_cache.nodes()
        paused = [h for h in self.handlers.values() if h.paused]
        # A cluster-aware provider's view of the cluster's capacity, of its own
        # credentials (refused: launches wait) and of its API server; others report none.
        cluster = engine.cluster_aware.get(self.ref.provider)
        health = cluster.api_health() if cluster is not None else None
        suspended = self.breaker.suspended(pool_cfg, now)
        fresh, data = pool_status.build(
            pool_id=self.id, hostname=engine.registry.hostname, pool=pool_cfg,
            provider=provider_cfg, config=engine.config, nodes=nodes,
            records=engine.cached_usage(lambda n: n.provider == provider_cfg.name),
            cloud=provider.cloud_limits(),
            capacity=cluster.capacity_condition(pool_cfg) if cluster is not None else None,
            blocked=next((h.blocked_scope for h in paused if h.blocked_scope), None),
            launching=sum(1 for h in self.handlers.values() for s in h.slots
                          if s.future is not None),
            queued=len(paused) + self._held_back_count, pending=len(self.handlers),
            suspended=suspended, now=now,
            unhandable=engine.unhandable,
            credentials=cluster.credentials_condition() if cluster is not None else None,
            api=health.condition() if health is not None else None,
            hold=_hold(control), paused=bool(paused))
        self._note_api_health(fresh["ApiReachable"])
        data["conditions"] = self._status.conditions(fresh, now)
        write, at = self._status.due(data, mono)
        if write:
            try:
                self._status_writer.write(data)
                self._status.published(data, mono)
                self.published_status = data
                # The pool's figures for statsd (combined with the other launchers'
                # records of the pool), as often as the record is written.
                engine.stats.gauges(stats.pool_status_gauges(pool_status.combined(
                    data, engine.pool_statuses.items().values())))
            except errors.NodepoolError as exc:
                self.log.warning("Could not publish the pool status: %s", exc)
                return [mono + 1.0]
        deadlines = [at] if at is not None else []
        # A suspended label's probe becomes due at a known time: look again then.
        for name, entry in suspended.items():
            wait = self.breaker.probe_in(name, entry, now)
            if wait is not None and wait > 0:
                deadlines.append(mono + wait)
        return deadlines

    def _note_api_health(self, condition: cond.Condition) -> None:
        """An event when the pool's ApiReachable condition turns False, or True again (not
        for its first value, nor while it stays, nor for the first probe's good news)."""
        seen = (condition.status, condition.reason)
        before, self._api_seen = self._api_seen, seen
        if before is None or before == seen or condition.status == cond.UNKNOWN \
                or (before[0] == cond.UNKNOWN and condition.status == cond.TRUE):
            return
        self.engine.events.record(
            zk_events.API_REACHABLE if condition.status == cond.TRUE
            else zk_events.API_UNREACHABLE,
            provider=self.ref.provider, pool=self.ref.pool, reason=condition.reason,
            message=condition.message)

    def _creator_starting(self, request: NodeRequest) -> bool:
        """A min-ready request of another launcher that has no pool registered yet.

        Nodepool creates its min-ready requests (ephemeral, in its own session) before its
        pool workers register. Declining one then fails it at once, since every registered
        pool (ours) declined. Its creator registers a pool serving the label moments later
        (the component event wakes us), or its session ends and the request with it.
        """
        if not plan.is_min_ready(request):
            return False
        owner = self.engine.request_cache.owner(request.id)
        if not owner or owner == self.engine.zk.session_id:
            return False
        return owner not in {c.owner for c in self.engine.components.pools()}

    def _prepare(self, request: NodeRequest, decline: plan.Decline | None) -> None:
        now = self.engine.clock.time()
        if decline is not None:
            plan.record_decline(request, self.id, self.registered_ids(), now)
            lifecycle.note_decline(request, self.id, decline)
        else:
            transition_request(request, model.RequestState.PENDING, now)

    def _at_concurrency(self, provider_cfg: ProviderConfig, planned: int = 0) -> bool:
        """`planned`: launches about to start (a batch being gathered)."""
        limit = provider_cfg.max_concurrency
        return limit > 0 and self.launches.in_flight + planned >= limit

    def _tenant_fits(self, request: NodeRequest, pool_cfg: PoolConfig,
                     usage: list[quota.UsageRecord]) -> bool:
        tenant = request.tenant_name
        limit = self.engine.config.tenant_resource_limits.get(tenant) if tenant else None
        if limit is None:
            return True
        need = quota.demand(request.node_types, pool_cfg)
        return bool(quota.check_tenant(need, quota.total(usage, tenant=tenant), limit))

    def _reclaim(self, whole_provider: bool) -> None:
        """At quota: delete the oldest unused ready node, one at a time.

        Only nodes that count against the limit in the way help: this pool's for a pool
        limit, any pool's of the provider for a provider (or cloud) limit.
        """
        now = self.clock.monotonic()
        if now - self._last_reclaim < self.engine.settings.reclaim_interval:
            return
        cache = self.engine.node_cache

        def idle_nodes() -> list[Node] | None:
            """The candidates; None while a deletion in the scope is in progress."""
            scope = [n for n in cache.nodes() if n.provider == self.ref.provider
                     and (whole_provider or n.pool == self.ref.pool)]
            if any(n.state == model.NodeState.DELETING for n in scope):
                return None
            if not any(n.state == model.NodeState.READY and not n.allocated_to
                       and not cache.is_locked(n.id) for n in scope):
                return []
            # A deletion elsewhere is written under its deleter's lock, which the cache
            # leaves unread (zk/cache.py): read those entries before deleting a spare.
            cache.refresh([n.id for n in scope])
            scope = [cache.get(n.id) or n for n in scope]
            if any(n.state == model.NodeState.DELETING for n in scope):
                return None
            return [n for n in scope if n.state == model.NodeState.READY
                    and not n.allocated_to and not cache.is_locked(n.id)]
        idle = idle_nodes()
        if not idle:
            return
        oldest = min(idle, key=lambda n: (n.state_time or 0.0, n.id))
        if self.engine.request_delete(oldest.id, "making room at quota"):
            self._last_reclaim = now
            self.log.info("[node: %s] Deleting the oldest unused ready node to make room",
                          oldest.id)

    # -- stopping -------------------------------------------------------------------------
    def _take_all_handlers(self) -> list[RequestHandler]:
        with self._handlers_lock:
            handlers = list(self.handlers.values())
            self.handlers.clear()
        return handlers

    def drop_handlers(self, why: str) -> None:
        for handler in self._take_all_handlers():
            handler.abandon(why)

    def _drop_expired_handlers(self) -> None:
        """Abandon the handlers whose request lock died with an earlier session. A pass
        that was under way when the session ended may have locked requests in the new
        one: those handlers are kept and served (abandoned, their live locks would keep
        the requests `pending` until the orphaned-lock check)."""
        with self._handlers_lock:
            expired = [h for h in self.handlers.values() if not h.lock.valid]
            for handler in expired:
                del self.handlers[handler.request.id]
        for handler in expired:
            handler.abandon("the ZooKeeper session expired")

    def cancel_launches(self) -> None:
        """Session lost: tell the launches of the lost session to give up (thread-safe).
        A handler that locked its request in the new session keeps its launches: cancelled,
        they would count as failed and decline the request."""
        for handler in self._handler_snapshot():
            if not handler.lock.valid:
                handler.cancel.set()

    def shutdown_handlers(self, timeout: float) -> None:
        """Called after the thread stopped: return requests, release locks."""
        handlers = self._take_all_handlers()
        for handler in handlers:
            handler.cancel.set()
        for handler in handlers:
            try:
                handler.shutdown(timeout)
            except Exception:
                self.log.exception("Error while returning request %s", handler.request.id)
