"""Allocation for one request: reuse of ready nodes, the quota check and the guarded create.

Owns: finding nodes for a request's unfilled slots, either by taking over a ready,
unallocated node of the pool (lock, re-read, re-check, write `allocated_to`) or by creating
node znodes in `init` after a quota check, serialised across launchers by the guard loop
(`zk.quota_guard.commit_guarded`: the guard bump rides in the transaction that creates the
nodes). A request that waited drops its `waiting_reasons` note in that transaction (no
write of its own), and our last commit's listing is reused only while the cache shows no
node created since by another launcher (a decision on it would fail on the guard). It
does not launch anything: the request handler (`handler.py`) starts the launches of the
nodes created here and owns every later state change.

Dependencies: only what `AllocationDeps` lists (a slice of the engine), so a test or a
future caller can see what allocation reads and writes.

Failure modes: a non-fitting `quota.Fit` (the handler pauses or declines), a
CONTENTION verdict when every guarded attempt lost to another launcher (the handler asks
for another pass), and the typed ZooKeeper errors of the commit. A request the requestor
revised since the handler read it (its version moved: Zuul's relative priority) fails the
create that carries its note: the revision is adopted and the create made again without
the note. So is a create whose request the requestor deleted meanwhile (no revision to
adopt; the handler then finds the request gone).
"""

from __future__ import annotations

import enum
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from nodepool_k8s.core import model, quota, records
from nodepool_k8s.runtime import logconfig
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.core.errors import NodepoolError
from nodepool_k8s.config.fingerprint import label_hash
from nodepool_k8s.config.model import Config, PoolConfig, ProviderConfig, TenantLimit
from nodepool_k8s.driver.base import LaunchResult, Provider
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.launcher import lifecycle
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.quota_guard import (CONTENDED, GuardedWrite, Keep, QuotaGuard,
                                         commit_guarded, usage_record)
from nodepool_k8s.zk.txn import Txn

if TYPE_CHECKING:
    from nodepool_k8s.launcher.requests.launch import LaunchOutcome, NodeLaunch

CONTENTION = "contention"


class SlotState(enum.Enum):
    NEED = "need"
    LAUNCHING = "launching"
    READY = "ready"
    FAILED = "failed"


@dataclass
class Slot:
    index: int
    label: str
    state: SlotState = SlotState.NEED
    node: Node | None = None
    lock: HeldLock | None = None
    future: "Future[LaunchOutcome] | None" = None
    job: "NodeLaunch | None" = None  # the running launch (its lock, once taken)
    result: LaunchResult | None = None
    reused: bool = False


@dataclass(frozen=True)
class PoolRef:
    pool_id: str
    provider: str
    pool: str


class AllocationDeps(Protocol):
    """What allocation uses of the engine (`launcher.context.Engine` provides it)."""

    @property
    def zk(self) -> ZkClient: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def config(self) -> Config: ...

    @property
    def nodes(self) -> NodeStore: ...

    @property
    def node_cache(self) -> NodeCache: ...

    @property
    def guard(self) -> QuotaGuard: ...

    def cached_usage(self, keep: Keep = None) -> list[quota.UsageRecord]: ...

    def usage(self, keep: Keep = None,
              ids: list[str] | None = None) -> list[quota.UsageRecord]: ...


def node_log(log: logging.LoggerAdapter[logging.Logger], request: NodeRequest,
             node: Node) -> logging.LoggerAdapter[logging.Logger]:
    """The logger of one node of `request` (`log` is the request's)."""
    return logconfig.annotate(log.logger, request.event_id, request.id, node.id)


class Allocator:
    """Reuse and guarded creation of nodes for the slots of one request.

    Holds nothing of the handler that owns it (no bound method of it): a reference back
    would make every finished request a reference cycle, kept until the collector's next
    full pass instead of freed when the pool worker drops the handler."""

    def __init__(self, deps: AllocationDeps, ref: PoolRef, provider: Provider,
                 request: NodeRequest, request_lock: HeldLock,
                 log: logging.LoggerAdapter[logging.Logger]) -> None:
        self.deps = deps
        self.ref = ref
        self.provider = provider
        self.request = request
        self.request_lock = request_lock
        self.log = log

    def _node_log(self, node: Node) -> logging.LoggerAdapter[logging.Logger]:
        return node_log(self.log, self.request, node)

    @property
    def tenant_limit(self) -> TenantLimit | None:
        tenant = self.request.tenant_name
        return self.deps.config.tenant_resource_limits.get(tenant) if tenant else None

    def fits_cached(self, remaining: list[Slot], provider_cfg: ProviderConfig,
                    pool_cfg: PoolConfig) -> quota.Fit:
        """Whether nodes for `remaining` fit the quotas as the cache sees them (no
        ZooKeeper request)."""
        tenant_limit = self.tenant_limit
        counts = _counted(provider_cfg, set() if tenant_limit is None
                          else {self.request.tenant_name})
        return self.check(quota.demand([s.label for s in remaining], pool_cfg),
                          usage_totals(self.deps.cached_usage(counts), provider_cfg,
                                       pool_cfg), provider_cfg, pool_cfg, tenant_limit)

    def create(self, remaining: list[Slot], provider_cfg: ProviderConfig,
               pool_cfg: PoolConfig, looked: quota.Fit | None = None) -> quota.Fit:
        """Create nodes in `init` for `remaining` if the quotas allow (FITS: every slot has
        its `node`, not yet locked or launched); else the verdict that says why not.
        `looked`: `fits_cached(remaining, ...)` if the caller just worked it out."""
        # A cheap look at the cache first: while paused this is all a pass costs.
        verdict = looked if looked is not None \
            else self.fits_cached(remaining, provider_cfg, pool_cfg)
        if not verdict:
            return verdict
        try:
            return create_guarded(self.deps, [(self, remaining)], provider_cfg, pool_cfg)[1]
        except errors.NoNodeError as exc:
            failed = exc.__cause__
            if isinstance(failed, errors.TxnFailed) \
                    and failed.path == self.request_lock.child_path:
                raise errors.LockLost(f"lock on request {self.request.id} vanished") from exc
            raise

    def check(self, need: model.Resources, usage: quota.Totals,
              provider_cfg: ProviderConfig, pool_cfg: PoolConfig,
              tenant_limit: TenantLimit | None) -> quota.Fit:
        return check_quota(need, usage, self.provider, provider_cfg, pool_cfg,
                           self.request.node_types, self.request.tenant_name, tenant_limit)

    def new_node(self, label: str, pool_cfg: PoolConfig) -> Node:
        now = self.deps.clock.time()
        node = Node(id="", state=model.NodeState.INIT, state_time=now, type=[label])
        attributes = dict(pool_cfg.node_attributes) if pool_cfg.node_attributes else None
        node.set(provider=self.ref.provider, pool=self.ref.pool, launcher=self.ref.pool_id,
                 allocated_to=self.request.id, tenant_name=self.request.tenant_name,
                 requestor=self.request.requestor, attributes=attributes,
                 resources=self.provider.quota_for_label(pool_cfg.labels[label]).as_dict(),
                 created_time=now)
        # What it is built from, so a later configuration can tell it drifted (drift.py).
        node.extra[model.CONFIG_HASH] = label_hash(pool_cfg.labels[label], pool_cfg)
        return node

    def _provably_ours(self, node: Node) -> bool:
        """Whether the ready record may be handed out (`handout_problem`)."""
        try:
            return handout_problem(self.provider, node) is None
        except NodepoolError as exc:
            self._node_log(node).info("Not reusing the ready node now: %s", exc)
            return False

    def reuse(self, needed: list[Slot]) -> None:
        """Take over ready, unallocated nodes of the pool for `needed` slots (locked,
        re-read and re-checked, then `allocated_to` written)."""
        cache = self.deps.node_cache
        candidates = sorted(
            (n for n in cache.nodes()
             if n.state == model.NodeState.READY and not n.allocated_to
             and n.provider == self.ref.provider and n.pool == self.ref.pool
             and not cache.is_locked(n.id)),
            key=lambda n: (n.state_time or 0.0, n.id))
        taken: set[str] = set()
        for slot in needed:
            for candidate in candidates:
                if candidate.id in taken or candidate.label != slot.label:
                    continue
                taken.add(candidate.id)
                if not self._provably_ours(candidate):
                    continue
                got = self.deps.nodes.lock_and_read(candidate.id)
                if got is None:
                    continue
                lock, node = got
                if node.state != model.NodeState.READY or node.allocated_to \
                        or node.provider != self.ref.provider or node.pool != self.ref.pool \
                        or node.label != slot.label \
                        or (node.external_id != candidate.external_id
                            and not self._provably_ours(node)):
                    lock.release()
                    continue
                if not self.request_lock.valid:  # our session expired during this pass
                    lock.release()
                    return
                node.set(allocated_to=self.request.id, tenant_name=self.request.tenant_name,
                         requestor=self.request.requestor)
                try:
                    self.deps.nodes.store(node, lock)
                except (errors.LockLost, errors.NoNodeError, errors.VersionConflict):
                    lock.release()
                    continue
                slot.node, slot.lock, slot.state, slot.reused = node, lock, SlotState.READY, True
                self._node_log(node).info("Reusing ready node for %s", slot.label)
                break


def handout_problem(provider: Provider, node: Node) -> str | None:
    """Why the ready record `node` of `provider` may not be handed to a request (None: it
    may): the resource it names must provably be that node's, of this installation, or
    anybody who can write a record could hand a job somebody else's namespace. A refusal
    is logged once per record version (the record is left alone: not ours to delete).
    The provider remembers refusals, so a forged record costs one look. Raises the
    provider's NodepoolError (TemporaryError) when it cannot tell now."""
    problem = provider.ownership_problem(node.external_id, node.id) \
        if node.external_id else "it names no resource"
    if problem is not None:
        records.REPORTS.report("node", paths.node_path(node.id), node.version,
                               f"ready, but not handed out: {problem}")
    return problem


def usage_totals(records: list[quota.UsageRecord], provider_cfg: ProviderConfig,
                 pool_cfg: PoolConfig) -> quota.Totals:
    """`records` summed as `check_quota` reads them (once for a batch of checks)."""
    return quota.Totals(records, provider_cfg.name, pool_cfg.name)


def check_quota(need: model.Resources, usage: quota.Totals, provider: Provider,
                provider_cfg: ProviderConfig, pool_cfg: PoolConfig, labels: Sequence[str],
                tenant: str | None = None,
                tenant_limit: TenantLimit | None = None) -> quota.Fit:
    """Whether `need` (of nodes with `labels`) fits the pool, provider, cloud and, with
    `tenant_limit`, the tenant's limits on top of `usage` (`usage_totals` of the
    records, made for this pool)."""
    verdict = quota.check(
        need, pool_usage=usage.pool, provider_usage=usage.provider,
        pool=pool_cfg, provider=provider_cfg, cloud_limits=quota.tightest(
            provider.cloud_limits(pool_cfg.labels[name])
            for name in sorted(set(labels)) if name in pool_cfg.labels))
    if verdict and tenant_limit is not None:
        verdict = quota.check_tenant(need, usage.tenant(tenant), tenant_limit)
    return verdict


def _counted(provider_cfg: ProviderConfig, tenants: set[str | None]) -> Keep:
    """Only this provider's nodes (and those of `tenants`, the limited ones) enter the
    checks."""
    def counts(node: quota.NodeUsage) -> bool:
        return bool(node.provider == provider_cfg.name or (tenants and node.tenant_name in tenants))
    return counts


def create_guarded(deps: AllocationDeps, batch: Sequence[tuple[Allocator, list[Slot]]],
                   provider_cfg: ProviderConfig, pool_cfg: PoolConfig
                   ) -> tuple[int, quota.Fit]:
    """Create nodes in `init` for the leading entries of `batch` (requests of one pool, in
    priority order, each with the slots it needs) that fit the quotas together, in one
    guarded transaction: the guard versions counted, or one guard read (see
    `QuotaGuard.read_listing` and `known_listing`), and one commit, with each request's
    lock checked in it.

    Returns (how many leading entries got their nodes, slot `node`s set but not locked
    or launched; FITS if that is all of them, else the verdict of the first that did not
    fit, CONTENTION when every attempt lost to another launcher). A commit that fails for
    another reason than a guard conflict raises its typed cause (NoNodeError when one of
    the requests' locks vanished) and creates nothing.
    """
    tenants = {a.request.tenant_name for a, _ in batch if a.tenant_limit is not None}
    # A request that waited here carries why (`waiting_reasons`); its handler drops the
    # note once its nodes are created. That write rides in this transaction instead (the
    # request's lock is checked in it anyway): one write request less per wait.
    ride = [True]
    guards = [paths.provider_guard_path(provider_cfg.name)]
    guards += [paths.tenant_guard_path(t) for t in sorted(t for t in tenants if t)]
    counts = _counted(provider_cfg, tenants)
    tries = [0]

    def fitting(records: list[quota.UsageRecord]) -> tuple[list[list[Node]], quota.Fit]:
        """New nodes for the longest prefix of `batch` that fits on top of `records`."""
        planned: list[list[Node]] = []
        usage = usage_totals(records, provider_cfg, pool_cfg)
        for allocator, slots in batch:
            verdict = allocator.check(quota.demand([s.label for s in slots], pool_cfg),
                                      usage, provider_cfg, pool_cfg,
                                      allocator.tenant_limit)
            if not verdict:
                return planned, verdict
            nodes = [allocator.new_node(s.label, pool_cfg) for s in slots]
            usage = usage.plus([usage_record(node, lambda _node: None) for node in nodes])
            planned.append(nodes)
        return planned, quota.FITS

    def attempt() -> GuardedWrite[tuple[int, quota.Fit]] | tuple[int, quota.Fit]:
        tries[0] += 1
        known = deps.guard.known_listing(guards) if tries[0] == 1 else None
        if known is not None and _created_since(deps.node_cache.nodes(), known[1], counts):
            # Another launcher created nodes under the guard since our last commit (the
            # cache shows them): a decision on our listing would fail on the guard.
            known = None
        if tries[0] > 1:
            deps.guard.forget()  # another launcher wrote a guard since
        if known is not None:
            # As our last commit left it: no read, if all fits (see `known_listing`).
            versions, ids = known
            planned, verdict = fitting(deps.usage(counts, ids))
        if known is None or not verdict:
            # The remembered listing over-counts deleted nodes: decide a shortfall afresh.
            # Guard versions and the node listing in one round trip (pipelined).
            versions, ids = deps.guard.read_listing(guards)
            planned, verdict = fitting(deps.usage(counts, ids))
        if not planned:
            return 0, verdict
        txn = Txn()
        indexes: list[list[int]] = []
        notes: list[tuple[NodeRequest, NodeRequest, int]] = []
        for (allocator, _slots), nodes in zip(batch, planned):
            # Only while the request is still ours: a pass that began before our session
            # expired must not create nodes for a request another launcher now serves.
            allocator.request_lock.guard(txn)
            cleared = _without_note(allocator.request, allocator.ref.pool_id) \
                if ride[0] else None
            if cleared is not None:
                notes.append((allocator.request, cleared, txn.set(
                    paths.request_path(cleared.id), request_codec.encode(cleared),
                    version=allocator.request.version)))
            indexes.append([NodeStore.add_create(txn, node) for node in nodes])

        def committed(results: list[Any]) -> tuple[int, quota.Fit]:
            for request, cleared, index in notes:
                request.version, request.extra = results[index].version, cleared.extra
            made: list[Node] = []
            for (_allocator, slots), nodes, where in zip(batch, planned, indexes):
                for slot, node, index in zip(slots, nodes, where):
                    node.id, node.version = NodeStore.created_id(results[index]), 0
                    slot.node = node
                    made.append(node)
            created = [node.id for node in made]
            deps.guard.note_created(made, created)
            deps.guard.remember(versions, ids, created)
            return len(planned), verdict
        return GuardedWrite(versions, txn, committed)

    try:
        outcome = commit_guarded(deps.zk, deps.settings.guard_attempts, attempt, deps.guard)
    except (errors.VersionConflict, errors.NoNodeError) as exc:
        failed = exc.__cause__
        changed = [a.request for a, _ in batch
                   if isinstance(failed, errors.TxnFailed)
                   and failed.path == paths.request_path(a.request.id)]
        if not changed:
            raise
        if isinstance(exc, errors.VersionConflict):
            # The requestor revised the request meanwhile (Zuul's relative priority): adopt
            # its revision and decide again without the note; the handler drops it after.
            for request in changed:
                adopt_revision(deps, request)
        # Else the requestor deleted it meanwhile (a cancelled build): decide again without
        # the note, as if none had ridden along; the handler finds the request gone and
        # releases what was made for it, as for a request deleted at any other moment.
        ride[0] = False
        outcome = commit_guarded(deps.zk, deps.settings.guard_attempts, attempt, deps.guard)
    if outcome is CONTENDED:
        return 0, quota.Fit(False, CONTENTION, ())
    return outcome


def _created_since(cached: Sequence[Node], ids: list[str], counts: Keep) -> bool:
    """Whether the cache shows a node that `counts` prices, created after the listing
    `ids` (a higher sequence number) and not in it."""
    listed = set(ids)
    top = max(ids, default="")
    return any(node.id > top and node.id not in listed and (counts is None or counts(node))
               for node in cached)


def _without_note(request: NodeRequest, pool_id: str) -> NodeRequest | None:
    """A copy of `request` without pool `pool_id`'s waiting note (None: it has none)."""
    if lifecycle.waiting_note(request, pool_id) is None:
        return None
    cleared = request.copy()
    lifecycle.note_waiting(cleared, pool_id, None)
    return cleared


def adopt_revision(deps: AllocationDeps, request: NodeRequest) -> None:
    """Take over what the requestor may change on a request we hold locked (its version,
    relative priority and extra keys) from a fresh read; nothing if it is gone."""
    fresh = request_codec.RequestStore(deps.zk).get(request.id)
    if fresh is not None:
        request.version = fresh.version
        request.relative_priority = fresh.relative_priority
        request.extra = fresh.extra


def create_batch(deps: AllocationDeps, batch: Sequence[tuple[Allocator, list[Slot]]],
                 provider_cfg: ProviderConfig, pool_cfg: PoolConfig) -> int:
    """`create_guarded` for freshly accepted requests (`batch.Batch`): how many
    leading entries got their nodes. The caller serves the rest one by one, which pauses
    or declines them exactly as before; a vanished request lock creates nothing (0)."""
    if not batch:
        return 0
    try:
        return create_guarded(deps, batch, provider_cfg, pool_cfg)[0]
    except errors.NoNodeError:
        return 0
