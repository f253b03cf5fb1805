"""Accepting several fresh requests of one pass together.

Owns: gathering the requests of one pool worker's pass that can be accepted the fast way
(nobody ever locked them), then accepting them with one round trip for their locks and
one guarded transaction for their nodes. A request joins while it asks for no reuse of a
ready node of its labels, has no tenant limit, and, with the batch before it, still fits
the pool's and provider's quotas as the cache sees them (at most BATCH_LIMIT together).
`flush` sends the lock + `pending` transaction of every member before collecting any
answer, creates the nodes of all that fit in one guarded transaction
(`allocation.create_batch`), and starts their launches; members that did not fit after
all are advanced one by one (they pause in order).

The pool worker that gathers the batch keeps the handlers: the batch reaches it only
through `BatchOwner`, and the engine only through `BatchDeps`.

Failure modes: a member that changed meanwhile (version conflict, gone) is skipped (the
cache event brings the pool worker back to it); one the requestor's ACL keeps us from
writing is refused for a while (`BatchOwner.refuse`); one somebody locked before is taken
the ordinary way (lock, re-read) in its turn. Any other error is raised once every answer
has been collected, so that each request this pass locked has its handler.
"""

from __future__ import annotations

from typing import Callable, Protocol

from nodepool_k8s.config.model import PoolConfig, ProviderConfig
from nodepool_k8s.core import model, quota
from nodepool_k8s.core.model import NodeRequest, Resources
from nodepool_k8s.core.transition import transition_request
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.launcher.requests.allocation import (
    AllocationDeps, PoolRef, SlotState, check_quota, create_batch, usage_totals)
from nodepool_k8s.launcher.requests.handler import RequestHandler
from nodepool_k8s.runtime.tracing import Tracer
from nodepool_k8s.zk import errors
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.requests import PendingFresh, RequestStore

# At most this many requests are accepted together (one lock round trip, one guarded
# create): a bound on what one pass holds before any of it launches.
BATCH_LIMIT = 16

# How the owner accepts a request the ordinary way, given whether the pool is paused.
Take = Callable[[bool], "RequestHandler | None"]


def copy_request(request: NodeRequest) -> NodeRequest:
    """A private copy of a cached request (cache objects are shared and never mutated)."""
    return NodeRequest.from_dict(request.id, request.to_dict(), version=request.version)


class BatchDeps(AllocationDeps, Protocol):
    """What a batch uses of the engine (`launcher.context.Engine` provides it)."""

    @property
    def requests(self) -> RequestStore: ...

    @property
    def tracer(self) -> Tracer: ...


class BatchOwner(Protocol):
    """What a batch asks of the pool worker that gathers it."""

    def lock_dir_seen(self, request_id: str) -> bool:
        """Whether somebody locked the request before (it is never batched then)."""
        ...

    def saw_lock_dir(self, request_id: str) -> None: ...

    def taken_elsewhere(self, request: NodeRequest) -> None:
        """A fresh read showed `request` taken by somebody else (not `requested`)."""
        ...

    def new_handler(self, provider: Provider, request: NodeRequest,
                    lock: HeldLock, accept_started: int = 0) -> RequestHandler:
        """The handler of a request just locked and written `pending`; accepting it began
        at `accept_started` (`Tracer.now()`)."""
        ...

    def keep(self, handler: RequestHandler) -> None:
        """Hold the handler from now on (before its nodes are created)."""
        ...

    def adopt(self, handler: RequestHandler, paused: bool, may_allocate: bool) -> bool:
        """Advance a kept handler once; whether the pool is paused after."""
        ...

    def refuse(self, request: NodeRequest, exc: Exception) -> None:
        """The requestor's ACL keeps us from writing the request."""
        ...


class Batch:
    """The fresh requests of one pass gathered to be accepted together."""

    def __init__(self, deps: BatchDeps, owner: BatchOwner, ref: PoolRef, provider: Provider,
                 provider_cfg: ProviderConfig, pool_cfg: PoolConfig) -> None:
        self.deps = deps
        self.owner = owner
        self.ref = ref
        self.provider = provider
        self.provider_cfg = provider_cfg
        self.pool_cfg = pool_cfg
        self.requests: list[NodeRequest] = []
        self._takes: list[Take] = []
        self.node_count = 0
        self._usage: quota.Totals | None = None
        self._need = Resources({})
        self._spare_labels: set[str | None] | None = None

    def add(self, request: NodeRequest, take: Take) -> bool:
        """Gather `request` if it qualifies; `take(paused)` is the ordinary way to accept it
        (used if it turns out somebody locked it before)."""
        tenant_limits = self.deps.config.tenant_resource_limits
        if len(self.requests) >= BATCH_LIMIT or request.tenant_name \
                and request.tenant_name in tenant_limits:
            return False
        if self.owner.lock_dir_seen(request.id) \
                or (request.reuse and self._reusable(request)):
            return False
        provider_cfg, pool_cfg = self.provider_cfg, self.pool_cfg
        if self._usage is None:
            self._usage = usage_totals(
                self.deps.cached_usage(lambda n: n.provider == provider_cfg.name),
                provider_cfg, pool_cfg)
        need = self._need + quota.demand(request.node_types, pool_cfg)
        if not check_quota(need, self._usage, self.provider, provider_cfg, pool_cfg,
                           request.node_types):
            return False
        self._need = need
        self.requests.append(request)
        self._takes.append(take)
        self.node_count += len(request.node_types)
        return True

    def _reusable(self, request: NodeRequest) -> bool:
        """A ready, unallocated node of one of the request's labels in this pool (then the
        request is served one by one, which takes it over). The labels are looked up once
        per pass."""
        if self._spare_labels is None:
            self._spare_labels = {
                n.label for n in self.deps.node_cache.nodes()
                if n.state == model.NodeState.READY and not n.allocated_to
                and n.provider == self.ref.provider and n.pool == self.ref.pool}
        return not self._spare_labels.isdisjoint(request.node_types)

    def flush(self, paused: bool) -> bool:
        """Accept and start the gathered requests; whether the pool is paused after."""
        # The pass's usage and the demand gathered so far stay: a later batch of the same
        # pass is checked on top of this one (the cache does not show its nodes yet).
        requests, takes = self.requests, self._takes
        self.requests, self._takes, self.node_count = [], [], 0
        if not requests:
            return paused
        owner = self.owner
        started = self.deps.tracer.now()
        sent: list[tuple[NodeRequest, PendingFresh | BaseException]] = []
        for request in requests:
            fresh = copy_request(request)
            transition_request(fresh, model.RequestState.PENDING, self.deps.clock.time())
            try:
                sent.append((fresh, self.deps.requests.store_fresh_async(fresh,
                                                                         release=False)))
            except Exception as exc:  # not sent: nothing to collect
                sent.append((fresh, exc))
        # Every answer is collected even if one raises: a request the transaction locked
        # must get its handler (or it would stay `pending` under our lock).
        handlers: list[RequestHandler] = []
        failure: BaseException | None = None
        for (fresh, pending), take in zip(sent, takes):
            try:
                if isinstance(pending, BaseException):
                    raise pending
                lock = pending.result()
                if lock is None:
                    # Someone locked it before. Mostly another launcher that won the
                    # race with the same transaction, which wrote `pending` with its
                    # lock: one read tells, and then losing costs nothing more (contending
                    # for the lock would cost two writes and a read to find it taken).
                    # Still `requested` (a lock dir left by an earlier holder): the
                    # ordinary way (lock, re-read), in turn.
                    owner.saw_lock_dir(fresh.id)
                    now = self.deps.requests.get(fresh.id)
                    if now is None or now.state != model.RequestState.REQUESTED:
                        if now is not None:
                            owner.taken_elsewhere(now)
                        continue
                    handler = take(paused)
                else:
                    handler = owner.new_handler(self.provider, fresh, lock, started)
            except (errors.NoNodeError, errors.VersionConflict):
                continue  # it changed meanwhile; the cache event brings us back
            except errors.ZkAuthError as exc:
                owner.refuse(fresh, exc)
                continue
            except Exception as exc:
                failure = failure or exc
                continue
            if handler is None:
                continue
            owner.keep(handler)
            handlers.append(handler)
        entries = [(h.allocator, [s for s in h.slots if s.state is SlotState.NEED])
                   for h in handlers]
        served = create_batch(self.deps, entries, self.provider_cfg, self.pool_cfg) \
            if not paused else 0
        for handler in handlers[:served]:
            handler.launch_created()
        for handler in handlers:
            paused = owner.adopt(handler, paused, may_allocate=not paused)
        if failure is not None:
            raise failure
        return paused
