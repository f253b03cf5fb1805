"""Disruption of spare nodes: a pool's spares removed for drift, expiry, surplus or a drain,
within the pool's disruption budgets.

Owns, for one pool (its pool worker holds a `Disruptor`):
- finding the candidates by reason among the pool's spares (ready, unallocated, unlocked):
  `drain` (the pool is drained), `expiry` (older than the label's `max-age`, counted from
  the node's creation; also while the pool is paused), `drift` (built from an older
  configuration, see drift.py) and `surplus` (beyond the label's pool-level and global
  min-ready targets, once the label has been over them for the pool's `surplus-delay`,
  which runs from the first look that found it so: at most `CHECK_INTERVAL` late); spares
  past `max-ready-age` are expiries too, deleted by the cleanup worker within the same
  `expiry` budget (`room`);
- deciding which of them may go now (`decide`, pure): every budget that names a reason
  and is in force caps how many of the pool's nodes may be being deleted at once, the
  nodes being deleted for any reason counted; a reason no budget in force names gets its
  default (`schema.DISRUPTION_DEFAULTS`);
- asking the deleter for them (`request_delete`: it locks the node and deletes it only if
  it is still a ready, unallocated spare, so a node Zuul locked or was handed meanwhile is
  skipped), with an event and a counter per reason.

Nothing is created here: min-ready builds replacements within max-servers. Nodes in use,
held or allocated are never candidates. Surplus is chosen the same way by every launcher
(oldest first over the label's spares of every pool, never below a pool's or the global
target, outstanding min-ready requests counted), so two launchers do not both remove the
last spares above the target.

Failure modes: none of its own; a delete request the deleter refuses (already queued or in
back-off) is not counted and tried again on a later pass. Ages are wall-clock differences
of the records' stamps; the surplus delay is on monotonic time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import Config, DisruptionBudget, MaintenanceWindow, PoolConfig
from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.launcher import maintenance, plan
from nodepool_k8s.launcher.upkeep import drift, fleet
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.pool_state import DRAIN, PoolState

log = logging.getLogger("nodepool_k8s.disruption")

DRIFT, EXPIRY, SURPLUS, DRAIN_REASON = S.DISRUPTION_REASONS
# The order reasons take room in a budget: an operator's drain first, then what makes a
# spare unfit (age, an older configuration), then mere surplus.
ORDER = (DRAIN_REASON, EXPIRY, DRIFT, SURPLUS)
EVENT_KINDS = {DRAIN_REASON: zk_events.SPARE_DRAINED, EXPIRY: zk_events.SPARE_EXPIRED,
               DRIFT: zk_events.SPARE_DRIFTED, SURPLUS: zk_events.SURPLUS_REMOVED}
# Without an event, a look for new candidates this often (nodes of other launchers,
# ages crossing no computed deadline).
CHECK_INTERVAL = 60.0
# While candidates wait for room in a budget (a finished deletion also wakes the worker).
RETRY_INTERVAL = 5.0


class DisruptionDeps(fleet.FleetDeps, Protocol):
    """What disruption uses of the engine (`launcher.context.Engine` provides it)."""

    @property
    def config(self) -> Config: ...

    @property
    def request_cache(self) -> RequestCache: ...

    @property
    def nodes(self) -> NodeStore: ...

    @property
    def events(self) -> EventLog: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def unhandable(self) -> frozenset[str]: ...


# -- the budget arithmetic (pure) -------------------------------------------------------------

def budget_limit(budget: DisruptionBudget, pool_nodes: int) -> int | None:
    """How many nodes the budget lets be deleted at once (None: any number)."""
    limits: list[int] = []
    if budget.max_nodes is not None:
        limits.append(budget.max_nodes)
    if budget.max_percent is not None:
        limits.append(max(1, math.floor(pool_nodes * budget.max_percent / 100.0))
                      if budget.max_percent > 0 else 0)
    return min(limits) if limits else None


def limit_now(budget: DisruptionBudget, pool_nodes: int, now: float) -> float | None:
    """The budget's limit at `now` (wall time): inf when it allows any number, None when it
    does not apply (outside its window, with no `outside_window` limit)."""
    if budget.schedule is not None and budget.duration is not None:
        window = MaintenanceWindow(schedule=budget.schedule, duration=budget.duration,
                                   timezone=budget.timezone)
        if maintenance.window_span(window, now) is None:
            return None if budget.outside_window is None else budget.outside_window
    limit = budget_limit(budget, pool_nodes)
    return math.inf if limit is None else limit


def room(reason: str, budgets: Sequence[DisruptionBudget], pool_nodes: int, in_flight: int,
         now: float) -> int | None:
    """How many more nodes may be deleted for `reason` now (None: any number), `in_flight`
    of the pool's nodes being deleted already."""
    limits: list[float] = []
    for budget in budgets:
        if reason not in budget.reasons:
            continue
        limit = limit_now(budget, pool_nodes, now)
        if limit is not None:
            limits.append(limit)
    if not limits:
        default = S.DISRUPTION_DEFAULTS[reason]
        limits.append(math.inf if default is None else default)
    least = min(limits)
    return None if math.isinf(least) else max(0, int(least) - in_flight)


def decide(candidates: Mapping[str, Sequence[Node]], budgets: Sequence[DisruptionBudget],
           pool_nodes: int, in_flight: int, now: float) -> list[tuple[str, Node]]:
    """Which candidates may be removed now, with their reason, in `ORDER` and each list's
    order (a node listed for several reasons goes once, for the first). `now`: wall time
    (budget windows are cron schedules)."""
    chosen: list[tuple[str, Node]] = []
    taken: set[str] = set()
    for reason in ORDER:
        for node in candidates.get(reason, ()):
            if node.id in taken:
                continue
            left = room(reason, budgets, pool_nodes, in_flight, now)
            if left is not None and left <= 0:
                break
            chosen.append((reason, node))
            taken.add(node.id)
            in_flight += 1
    return chosen


# -- candidates ------------------------------------------------------------------------------

def _oldest_first(nodes: Sequence[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: (n.state_time or 0.0, n.id))


def max_age(config: Config, pool: PoolConfig, label: str) -> float:
    """The label's `max-age` in the pool (0: none)."""
    age = pool.label_max_age.get(label)
    if age is None:
        glob = config.labels.get(label)
        age = glob.max_age if glob is not None else 0.0
    return age


def surplus(config: Config, provider: str, pool: PoolConfig, label: str,
            spares: Sequence[Node], requests: Sequence[model.NodeRequest]) -> list[Node]:
    """The pool's spares of `label` to remove as surplus, oldest first: the walk over the
    label's unlocked spares of every pool (`spares`: as min-ready counts them, less the
    locked ones, which may be being handed out), oldest first, takes an unallocated one
    while both its pool's and the global count stay above their targets, outstanding
    min-ready requests counted. Every launcher walks the same way, so they agree on which
    go."""
    outstanding: dict[str | None, int] = {}
    for request in requests:
        if plan.is_min_ready(request) and request.node_types == [label] \
                and request.state in (model.RequestState.REQUESTED,
                                      model.RequestState.PENDING):
            target = plan.target_pool(request)
            outstanding[target] = outstanding.get(target, 0) + 1
    glob = config.labels.get(label)
    over_global = len(spares) + sum(outstanding.values()) \
        - (glob.min_ready if glob is not None else 0)
    over_pool: dict[tuple[str | None, str | None], int] = {}
    for node in spares:
        key = (node.provider, node.pool)
        if key not in over_pool:
            found = config.pool_config(node.provider, node.pool)
            pool_label = found.labels.get(label) if found is not None else None
            over_pool[key] = outstanding.get(f"{node.provider}/{node.pool}", 0) \
                - (pool_label.min_ready if pool_label is not None else 0)
        over_pool[key] += 1
    chosen: list[Node] = []
    for node in _oldest_first(spares):
        if over_global <= 0:
            break
        key = (node.provider, node.pool)
        if node.allocated_to or over_pool[key] <= 0:
            continue
        over_global -= 1
        over_pool[key] -= 1
        if key == (provider, pool.name):
            chosen.append(node)
    return chosen


@dataclass
class Disruptor:
    """One pool's disruption state across passes (its pool worker's thread only)."""

    provider: str
    pool: str
    # Nodes this pool asked to delete that still exist, with the reason: a node asked for
    # is not `deleting` in the cache yet, and counting only the cache would let a burst of
    # passes exceed a budget.
    asked: dict[str, str] = field(default_factory=dict)
    # Label -> monotonic time it was first seen over its target (surplus-delay runs from it).
    over_since: dict[str, float] = field(default_factory=dict)
    # Node id -> its creation time (a node summary does not keep it; read once per node).
    created: dict[str, float] = field(default_factory=dict)
    waiting: int = 0
    next_look: float = -math.inf
    # The time (monotonic) something becomes due (an expiry, a label's surplus-delay, a
    # retry), kept for the passes that do not look.
    next_due: float | None = None
    config: PoolConfig | None = None
    # The pause or drain in force at the last look: a change is looked at at once.
    action: str | None = None

    def due(self, pool: PoolConfig, now: float, control: PoolState | None = None) -> bool:
        """Whether a pass should look now (`now`: monotonic). A drained pool looks on
        every pass: each spare that turns up (a launch that was in flight, another
        launcher's node) goes at once."""
        action = control.action if control is not None else None
        return (pool is not self.config or action != self.action or action == DRAIN
                or self.waiting > 0 or now >= self.next_look)

    def run(self, engine: DisruptionDeps, pool: PoolConfig,
            control: PoolState | None) -> float | None:
        """Remove what may go now; the monotonic time to look again (None: nothing is due;
        a pass after `CHECK_INTERVAL` looks anyway, for nodes of other launchers)."""
        mono, now = engine.clock.monotonic(), engine.clock.time()
        if not self.due(pool, mono, control):
            return self.next_due
        self.config = pool
        self.action = control.action if control is not None else None
        cache = engine.node_cache
        present: set[str] = set()
        deleting: set[str] = set()
        pool_nodes = 0
        for node in cache.nodes():
            if node.provider == self.provider and node.pool == self.pool:
                present.add(node.id)
                pool_nodes += 1
                if node.state in (model.NodeState.DELETING, model.NodeState.DELETED):
                    deleting.add(node.id)
        self.asked = {k: v for k, v in self.asked.items() if k in present}
        self.created = {k: v for k, v in self.created.items() if k in present}
        spares = [n for n in fleet.spares(engine, self.provider, self.pool)
                  if n.id not in self.asked]
        candidates: dict[str, list[Node]] = {}
        next_due: float | None = None
        if control is not None and control.action == DRAIN:
            self.over_since.clear()
            candidates[DRAIN_REASON] = _oldest_first(spares)
        else:
            # Old spares go while the pool is paused too (as past max-ready-age); drift
            # and surplus wait for the pool to serve again (nothing would replace them).
            candidates[EXPIRY], expiry_due = self._expired(engine, pool, spares, now)
            surplus_due = None
            if control is None:
                hashes = drift.current_hashes(pool)
                candidates[DRIFT] = _oldest_first([n for n in spares
                                                   if drift.is_drifted(n, hashes)])
                candidates[SURPLUS], surplus_due = self._surplus(engine, pool, spares, mono)
            else:
                self.over_since.clear()
            dues = [d for d in (expiry_due, surplus_due) if d is not None]
            next_due = min(dues) if dues else None
        chosen = decide(candidates, pool.disruption_budgets, pool_nodes,
                        len(set(self.asked) | deleting), now)
        asked = 0
        for reason, node in chosen:
            if self._remove(engine, reason, node):
                asked += 1
        self.waiting = sum(len(c) for c in candidates.values()) - asked
        if self.waiting > 0:
            next_due = min(next_due if next_due is not None else math.inf,
                           mono + RETRY_INTERVAL)
        self.next_look = min(next_due if next_due is not None else math.inf,
                             mono + CHECK_INTERVAL)
        self.next_due = next_due
        return next_due

    def _expired(self, engine: DisruptionDeps, pool: PoolConfig, spares: list[Node],
                 now: float) -> tuple[list[Node], float | None]:
        """Spares past their label's max-age, oldest first, and when (monotonic) the next
        one will be. A node summary keeps no creation time: each spare of a label with a
        max-age has its record read once (`created`)."""
        expired: list[tuple[float, Node]] = []
        soonest = math.inf
        for node in spares:
            limit = max_age(engine.config, pool, node.label or "")
            if limit <= 0:
                continue
            created = self.created.get(node.id)
            if created is None:
                fresh = engine.nodes.get(node.id)
                if fresh is None:
                    continue
                created = fresh.created_time or fresh.state_time or now
                self.created[node.id] = created
            if now - created >= limit:
                expired.append((created, node))
            else:
                soonest = min(soonest, created + limit - now)
        due = engine.clock.monotonic() + soonest if not math.isinf(soonest) else None
        return [n for _, n in sorted(expired, key=lambda e: (e[0], e[1].id))], due

    def _surplus(self, engine: DisruptionDeps, pool: PoolConfig, spares: list[Node],
                 mono: float) -> tuple[list[Node], float | None]:
        """The pool's surplus spares whose label has been over target for the pool's
        `surplus-delay`, and when (monotonic) a label waiting for it is due."""
        if pool.surplus_delay <= 0:
            self.over_since.clear()
            return [], None
        cache = engine.node_cache
        mine = {n.label for n in spares}
        # Ready records min-ready does not count (not provably their node's) are not
        # counted here either, or a real spare would go in their stead and come back.
        skip = engine.unhandable
        everywhere = [n for n in cache.nodes() if n.id not in self.asked and n.label in mine
                      and n.id not in skip and not cache.is_locked(n.id)]
        requests = engine.request_cache.requests()
        out: list[Node] = []
        due: float | None = None
        for label in sorted(pool.labels):
            found = surplus(engine.config, self.provider, pool, label,
                            [n for n in everywhere if plan.counts_as_spare(n, label)],
                            requests) if label in mine else []
            if not found:
                self.over_since.pop(label, None)
                continue
            since = self.over_since.setdefault(label, mono)
            if mono - since >= pool.surplus_delay:
                out.extend(found)
            else:
                ready_at = since + pool.surplus_delay
                due = ready_at if due is None else min(due, ready_at)
        return _oldest_first(out), due

    def _remove(self, engine: DisruptionDeps, reason: str, node: Node) -> bool:
        why = _why(reason, node, self.provider, self.pool)
        if not engine.request_delete(node.id, why):
            return False
        self.asked[node.id] = reason
        record_removal(engine, reason, node, why)
        return True


class RemovalDeps(Protocol):
    @property
    def events(self) -> EventLog: ...

    @property
    def stats(self) -> Stats: ...


def record_removal(engine: RemovalDeps, reason: str, node: Node, why: str) -> None:
    """A spare asked to be deleted for `reason`: the log line, the event, the counter."""
    log.info("[node: %s] Removing a spare of %s/%s: %s", node.id, node.provider, node.pool,
             why)
    engine.events.record_batched(EVENT_KINDS[reason], reason=reason, message=why,
                                 provider=node.provider, pool=node.pool, node=node.id,
                                 label=node.label, external_id=node.external_id)
    engine.stats.spare_removed(node.provider or "", node.pool or "", reason)


def _why(reason: str, node: Node, provider: str, pool: str) -> str:
    """The deletion's reason as the node's `Deleting` condition and the log show it."""
    if reason == DRAIN_REASON:
        return f"draining pool {provider}/{pool}"
    if reason == EXPIRY:
        return "expired: older than the label's max-age"
    if reason == DRIFT:
        return drift.REASON
    return f"surplus: more spares of {node.label} than min-ready wants"
