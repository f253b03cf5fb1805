"""Pure decisions of the launcher: which request a pool takes, what cleanup does to a node,
how many min-ready requests are missing. No I/O, no clocks (time, or an age, is an
argument).

Owns the rules of the Nodepool protocol's request handling (nodepool-protocol.md §2.3 and
B1.3-B1.6) as functions of plain values, so they are unit-tested exhaustively and the
workers only act on their verdicts:

- `order` sorts requests for one pool: labels it lacks, priority prefix, relative
  priority, sequence;
- `triage` says SKIP (not ours to touch now), DECLINE (this pool can never serve it) or
  ACCEPT, yielding to a preferred provider and to higher-priority pools that are not paused;
- `decline_for` says why a pool can never serve a request (disabled, label not served,
  does not fit the pool or provider limits even when empty) as a `Decline`: a reason code
  and the message; `record_decline` applies a decline (`failed` only once every registered
  pool declined);
- `Waiting` says why a pool holds back a request it would serve (paused, drained,
  tenant limit; the handler's quota waits);
- `hand_back` says when a pool that holds an accepted request but cannot serve it now
  (its provider unhealthy, paused or drained, the cluster refusing for quota) releases it
  the Nodepool way (a decline, so another pool takes it): only once the cause has lasted
  `after` seconds and another registered pool could serve it; `RecentlyFailed` remembers
  (pool, label) pairs that were handed back, for a while, so the next request of that
  label goes elsewhere while another pool can take it;
- `node_cleanup` decides delete / deallocate / nothing for one node from its age, with
  how long until it should be looked at again; `builder_wait` how long a deletion is left
  to the live launcher that built the node;
- `min_ready_shortfall` counts how many spare nodes of a label are missing.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model, quota
from nodepool_k8s.config.model import Config, PoolConfig, ProviderConfig
from nodepool_k8s.core.model import NodeRequest, Resources
from nodepool_k8s.core.transition import transition_request


class NodeFacts(Protocol):
    """What decisions read from a node: a full `model.Node` or the cache's record."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def state_time(self) -> Any: ...

    @property
    def label(self) -> str | None: ...

    @property
    def provider(self) -> Any: ...

    @property
    def pool(self) -> Any: ...

    @property
    def allocated_to(self) -> Any: ...

    @property
    def hold_expiration(self) -> Any: ...

    @property
    def external_id(self) -> Any: ...


@dataclass(frozen=True)
class PoolInfo:
    """A registered pool component, as the decline/yield logic needs it."""

    id: str
    provider: str | None
    labels: frozenset[str]
    priority: int = 100
    paused: bool = False


class Verdict(enum.Enum):
    SKIP = "skip"
    DECLINE = "decline"
    ACCEPT = "accept"


@dataclass(frozen=True)
class Decline:
    """Why a pool declines a request: `code`, one of `conditions.REASONS` (written under
    the request's `declined_reasons`), and `message`, the text operators read."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in cond.REASONS:
            raise ValueError(f"{self.code!r} is not a reason code")


@dataclass(frozen=True)
class Waiting:
    """Why a pool holds a request back for now (written under the request's
    `waiting_reasons` when it changes): `code`, one of `conditions.REASONS`, and the
    operator's `message`. Messages carry no counts or times, so an unchanged cause is an
    unchanged value and costs no write."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in cond.REASONS:
            raise ValueError(f"{self.code!r} is not a reason code")

    def to_dict(self) -> dict[str, str]:
        return {"reason": self.code, "message": self.message[:cond.MESSAGE_LIMIT]}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""  # why: the SKIP's (for logs), the decline's message
    decline: Decline | None = None  # set exactly when `verdict` is DECLINE

    @classmethod
    def declined(cls, decline: Decline) -> "Decision":
        return cls(Verdict.DECLINE, decline.message, decline)


# `triage` answers ACCEPT for most requests of a busy pool at every pass: one shared value
# (frozen) instead of a new one each time.
ACCEPTED = Decision(Verdict.ACCEPT)


def lacking(request: NodeRequest, labels: Iterable[str]) -> int:
    """How many of the request's distinct labels are not in `labels`."""
    return len(set(request.node_types).difference(labels))


def order(requests: Iterable[NodeRequest], labels: Iterable[str]) -> list[NodeRequest]:
    """Pool order: requests this pool serves fully first, then by `sort_key`. Every pass
    sorts every cached request, so the key is worked out in one go (the same values as
    `lacking` and `NodeRequest.sort_key`)."""
    have = frozenset(labels)

    def key(r: NodeRequest) -> tuple[int, str, int, str]:
        parts = r.id.split("-", 1)
        return (len(set(r.node_types).difference(have)), parts[0], r.relative_priority,
                parts[-1])
    return sorted(requests, key=key)


# `decline_for` is asked about every waiting request at every pass of the pool worker, so
# a burst costs requests x passes of it; its answer depends only on the labels and the
# configuration (and cloud limits), so it is remembered per label list, checked by the
# identity of the configuration objects (a reload makes new ones). Bounded: cleared when
# full. A race between two threads only computes an answer twice.
_DECLINES_MAX = 1024
_declines: dict[tuple[tuple[str, ...], int, int, Resources | None],
                tuple[PoolConfig, ProviderConfig, Decline | None]] = {}


def decline_for(request: NodeRequest, pool: PoolConfig, provider: ProviderConfig,
                cloud_limits: Resources | None = None) -> Decline | None:
    """Why `pool` can never serve `request`, None when it can."""
    key = (tuple(request.node_types), id(pool), id(provider), cloud_limits)
    known = _declines.get(key)
    if known is not None and known[0] is pool and known[1] is provider:
        return known[2]
    decline = _decline_for(request.node_types, pool, provider, cloud_limits)
    if len(_declines) >= _DECLINES_MAX:
        _declines.clear()
    _declines[key] = (pool, provider, decline)
    return decline


def _decline_for(node_types: Sequence[str], pool: PoolConfig, provider: ProviderConfig,
                 cloud_limits: Resources | None) -> Decline | None:
    if pool.disabled:
        return Decline("PoolDisabled", "pool is disabled")
    missing = sorted({label for label in node_types if label not in pool.labels})
    if missing:
        return Decline("LabelNotServed",
                       f"label(s) not served by this pool: {', '.join(missing)}")
    fit = quota.never_fits(quota.demand(node_types, pool), pool, provider, cloud_limits)
    if not fit:
        return Decline("ExceedsQuota",
                       f"it would exceed quota even with no nodes ({fit.describe()})")
    return None


def triage(request: NodeRequest, me: PoolInfo, pool: PoolConfig, provider: ProviderConfig,
           registered: Sequence[PoolInfo], cloud_limits: Resources | None = None) -> Decision:
    if request.state != model.RequestState.REQUESTED:
        return Decision(Verdict.SKIP, f"state is {request.state}")
    if me.id in request.declined_by:
        return Decision(Verdict.SKIP, "already declined by this pool")
    target = target_pool(request)
    if target is not None:
        if target != f"{provider.name}/{pool.name}":
            return Decision(Verdict.SKIP, f"pool-level min-ready request of {target}")
        decline = decline_for(request, pool, provider, cloud_limits)
        return Decision.declined(decline) if decline else ACCEPTED
    wanted = set(request.node_types)
    others = [p for p in registered if p.id != me.id and p.id not in request.declined_by
              and wanted <= p.labels]
    if request.provider and request.provider != provider.name \
            and any(p.provider == request.provider for p in others):
        return Decision(Verdict.SKIP, f"yielding to preferred provider {request.provider}")
    if any(p.priority < pool.priority and not p.paused for p in others):
        return Decision(Verdict.SKIP, "yielding to a higher-priority pool")
    if lacking(request, pool.labels) and others:
        return Decision(Verdict.SKIP, "leaving it to pools that serve every label")
    decline = decline_for(request, pool, provider, cloud_limits)
    if decline:
        return Decision.declined(decline)
    return ACCEPTED


def all_declined(declined_by: Iterable[str], registered_ids: Iterable[str]) -> bool:
    """Fail only when every currently registered pool has declined."""
    return set(registered_ids) <= set(declined_by)


def record_decline(request: NodeRequest, pool_id: str, registered_ids: set[str],
                   now: float) -> model.RequestState:
    """Record on `request` that `pool_id` declined it: `failed` once every registered pool
    declined, else back to `requested` (with `nodes` emptied). Returns the new state."""
    if pool_id not in request.declined_by:
        request.declined_by.append(pool_id)
    # A pool-level min-ready request has one server (the others skip it): its decline ends it.
    state = model.RequestState.FAILED if target_pool(request) is not None \
        or all_declined(request.declined_by, registered_ids) else model.RequestState.REQUESTED
    transition_request(request, state, now)
    request.nodes = []
    return request.state


# -- handing requests back ------------------------------------------------------------------

def served_elsewhere(request: NodeRequest, me: str, registered: Iterable[PoolInfo]) -> bool:
    """Whether another registered pool that is not paused (nor unhealthy: such pools
    register paused) serves every label of `request` and has not declined it.
    A pool-level min-ready request has one server only: never."""
    if target_pool(request) is not None:
        return False
    wanted = set(request.node_types)
    return any(p.id != me and not p.paused and p.id not in request.declined_by
               and wanted <= p.labels for p in registered)


@dataclass(frozen=True)
class Unable:
    """Why a pool cannot serve a request it holds now: the waiting reason (a code of
    `conditions.REASONS` and its message) and since when (monotonic seconds)."""

    waiting: Waiting
    since: float


def hand_back(request: NodeRequest, me: str, registered: Iterable[PoolInfo],
              unable: Unable | None, now: float,
              after: float) -> tuple[Decline | None, float | None]:
    """Whether pool `me` hands `request` back now: (the decline to write, None) when
    the cause has lasted `after` seconds and another pool could serve it; (None, the
    monotonic time to look again) while the cause has not lasted that long; (None, None)
    when nothing is to be done (no cause, or nobody else could serve it: it waits here)."""
    if unable is None or not served_elsewhere(request, me, registered):
        return None, None
    due = unable.since + max(0.0, after)
    if now < due:
        return None, due
    return Decline("HandedBack", f"handed back: {unable.waiting.message}"), None


class RecentlyFailed:
    """Labels a pool handed back lately, each remembered `ttl` seconds (monotonic), so
    the next request of such a label is declined for another pool while one could take
    it (`refusal`). Bounded by the pool's labels; decays without a restart."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def remember(self, labels: Iterable[str], now: float, ttl: float) -> None:
        if ttl <= 0:
            return
        for label in labels:
            self._until[label] = now + ttl

    def __bool__(self) -> bool:
        """Whether any label is remembered (perhaps one past its time, not yet dropped)."""
        return bool(self._until)

    def active(self, now: float) -> dict[str, float]:
        """The labels still remembered, with when each is forgotten."""
        for label in [k for k, until in self._until.items() if until <= now]:
            del self._until[label]
        return dict(self._until)

    def refusal(self, request: NodeRequest, me: str, registered: Iterable[PoolInfo],
                now: float) -> Decline | None:
        """The decline for a request with a recently failed label that another pool
        could serve (None: take it here as usual)."""
        if not self._until:
            return None  # nothing remembered (asked for every waiting request each pass)
        failed = sorted(set(request.node_types) & set(self.active(now)))
        if not failed or not served_elsewhere(request, me, registered):
            return None
        return Decline("RecentlyFailed", f"this pool handed label(s) {', '.join(failed)}"
                       " back lately: leaving the request to another pool")


# -- cleanup ------------------------------------------------------------------------------

class CleanupAction(enum.Enum):
    NONE = "none"
    DELETE = "delete"
    DEALLOCATE = "deallocate"


# Unlocked nodes in these states belong to nobody any more.
ORPHAN_STATES = frozenset({model.NodeState.USED, model.NodeState.IN_USE,
                           model.NodeState.BUILDING, model.NodeState.FAILED,
                           model.NodeState.DELETING, model.NodeState.DELETED,
                           model.NodeState.ABORTED})


@dataclass(frozen=True)
class NodeVerdict:
    action: CleanupAction
    reason: str = ""
    # When nothing is due now: in how many seconds this node may become due.
    recheck_in: float = math.inf


NOTHING = NodeVerdict(CleanupAction.NONE)


def hold_limit(node: NodeFacts, max_hold_age: float) -> float:
    """Seconds a held node may stay: min(hold_expiration, max-hold-age); <=0 means none."""
    limit = max_hold_age if max_hold_age > 0 else math.inf
    expiration = node.hold_expiration
    if isinstance(expiration, (int, float)) and not isinstance(expiration, bool) \
            and expiration > 0:
        limit = min(limit, float(expiration))
    return limit


def _after(limit: float, age: float, reason: str) -> NodeVerdict:
    if age >= limit:
        return NodeVerdict(CleanupAction.DELETE, reason)
    return NodeVerdict(CleanupAction.NONE, recheck_in=limit - age)


def node_cleanup(node: NodeFacts, *, age: float, locked: bool, config: Config,
                 request_exists: bool, stale_init_age: float) -> NodeVerdict:
    """What cleanup should do to `node` of one of our providers (locked = has contenders).

    `age`: seconds the node has been in its state (since its `state_time`, which another
    machine's clock may have taken), as the caller judges them: the cleanup worker uses
    `clock.StampAges`, so a step of this launcher's wall clock neither expires a node early
    nor keeps it; 0 for a node without a state time.
    """
    if locked:
        return NOTHING
    state = node.state
    if state in ORPHAN_STATES:
        return NodeVerdict(CleanupAction.DELETE, f"unlocked node in state {state}")
    if state == model.NodeState.INIT:
        return _after(stale_init_age, age, "stale init node")
    if state == model.NodeState.READY:
        if node.allocated_to:
            if not request_exists:
                return NodeVerdict(CleanupAction.DEALLOCATE,
                                   f"request {node.allocated_to} is gone")
            return NOTHING
        label = config.labels.get(node.label or "")
        if label is not None and label.max_ready_age > 0:
            return _after(label.max_ready_age, age, "max-ready-age reached")
        return NOTHING
    if state == model.NodeState.HOLD:
        limit = hold_limit(node, config.max_hold_age)
        if math.isinf(limit):
            return NOTHING
        return _after(limit, age, "hold expired")
    return NOTHING


def builder_wait(launcher: Any, *, ours: frozenset[str], live: frozenset[str], age: float,
                 grace: float) -> float:
    """Seconds this launcher leaves a node it would delete to the launcher that built it
    (0: delete it now).

    `launcher`: the node's `launcher` (the pool id of its creator); `ours`: our pool ids;
    `live`: the ids of every registered pool. The builder deletes its nodes at once; any
    other launcher only `grace` seconds into the node's state (`age`), or at once when no
    registered pool has the builder's id (the builder died or stopped: its nodes must not
    wait for it). A node without a `launcher` is everyone's, as before.
    """
    if not isinstance(launcher, str) or not launcher or launcher in ours \
            or launcher not in live:
        return 0.0
    return max(0.0, grace - age)


# -- min-ready ------------------------------------------------------------------------------

def is_min_ready(request: NodeRequest) -> bool:
    return request.requestor == model.MIN_READY_REQUESTOR


def target_pool(request: NodeRequest) -> str | None:
    """`<provider>/<pool>` of our own pool-level min-ready request; None for any other."""
    if not is_min_ready(request):
        return None
    target = request.extra.get(model.MIN_READY_POOL)
    return target if isinstance(target, str) and target else None


def counts_as_spare(node: NodeFacts, label: str) -> bool:
    """A ready node of `label` nobody uses: unallocated, or held by a min-ready request."""
    if node.state != model.NodeState.READY or node.label != label:
        return False
    return not node.allocated_to or node.allocated_to.startswith(
        model.MIN_READY_PRIORITY + "-")


def min_ready_shortfall(label: str, min_ready: int, nodes: Iterable[NodeFacts],
                        requests: Iterable[NodeRequest],
                        pool: tuple[str, str] | None = None) -> int:
    """How many min-ready requests to add for `label` (never negative).

    Spare nodes count once whether their min-ready request still exists or not (nodes
    allocated to a min-ready request count as spares, the fulfilled request does not), so
    a reader that sees the request deletion before the de-allocation counts the same. A
    fulfilled min-ready request counts for each of its nodes that `nodes` does not hold
    yet: the requests are read fresh, the nodes may come from a cache a moment behind, and
    a reader that sees the fulfilment before the node would otherwise ask for it again.
    """
    if min_ready <= 0:
        return 0
    target = f"{pool[0]}/{pool[1]}" if pool is not None else None
    known: set[str] = set()
    spare = 0
    for node in nodes:
        known.add(node.id)
        if counts_as_spare(node, label) and (pool is None or (node.provider, node.pool) == pool):
            spare += 1
    outstanding = 0
    for r in requests:
        if not (is_min_ready(r) and r.node_types == [label] and target_pool(r) == target):
            continue
        if r.state in (model.RequestState.REQUESTED, model.RequestState.PENDING):
            outstanding += 1
        elif r.state == model.RequestState.FULFILLED:
            outstanding += sum(1 for node_id in r.nodes if node_id not in known)
    return max(0, min_ready - spare - outstanding)
