"""Drift replacement: spare nodes built from an older configuration are replaced.

Owns: finding the pool's drifted spares (ready, unallocated, unlocked nodes whose recorded
`config_hash` differs from the hash of their label's configuration now) and asking the
deleter to remove them, at most the pool's `drift-budget` at a time, and only inside the
budget's window when it has one. Nodes in use or held are never touched (they are locked
or allocated), and nothing is created here: min-ready builds the replacements, within
max-servers, so the pool never has more nodes than it may. Nodes without a recorded hash
(built before this feature) are left alone. Called by the pool worker; cheap when nothing
drifted (one pass over the pool's cached nodes after a reload and every CHECK_INTERVAL seconds;
on every pool pass only while drifted spares wait).

Failure modes: none of its own; a delete request the deleter refuses (already queued) is
simply not counted.
"""

from __future__ import annotations

import logging
import math

from nodepool_k8s.core import model
from nodepool_k8s.config.fingerprint import label_hash
from nodepool_k8s.config.model import DriftBudget, MaintenanceWindow, PoolConfig
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.launcher.upkeep import fleet
from nodepool_k8s.core.model import Node

log = logging.getLogger("nodepool_k8s.drift")

# Without a reload nothing new can drift: a slow look for nodes of other launchers only.
CHECK_INTERVAL = 60.0
# While drifted spares wait for room in the budget (deletions also wake the worker).
RETRY_INTERVAL = 5.0
REASON = "drifted: built from an older configuration"


def current_hashes(pool: PoolConfig) -> dict[str, str]:
    return {name: label_hash(label, pool) for name, label in pool.labels.items()}


def is_drifted(node: Node, hashes: dict[str, str]) -> bool:
    """Built from another configuration of a label the pool still has."""
    wanted = hashes.get(node.label or "")
    return node.config_hash is not None and wanted is not None and node.config_hash != wanted


def allowance(budget: DriftBudget, spares: int) -> int:
    """How many drifted spares may be being replaced at once."""
    limits: list[int] = []
    if budget.max_nodes is not None:
        limits.append(budget.max_nodes)
    if budget.max_percent is not None:
        limits.append(max(1, math.floor(spares * budget.max_percent / 100.0))
                      if budget.max_percent > 0 else 0)
    return min(limits) if limits else spares


def in_window(budget: DriftBudget, now: float) -> bool:
    if budget.schedule is None or budget.duration is None:
        return True
    window = MaintenanceWindow(schedule=budget.schedule, duration=budget.duration,
                               timezone=budget.timezone)
    return maintenance.window_span(window, now) is not None


def replace_drifted(engine: fleet.FleetDeps, provider: str, pool: PoolConfig,
                    asked: set[str]) -> tuple[int, int]:
    """Ask for drifted spares to be deleted within the budget: (asked now, still waiting).

    `asked` (the caller's, kept across passes) holds the nodes this pool asked to delete
    that still exist: a node asked for is not `deleting` in the cache yet, and counting only
    the cache would let a burst of passes exceed the budget.
    """
    hashes = current_hashes(pool)
    spares = fleet.spares(engine, provider, pool.name)
    drifted_spares = sorted((n for n in spares if is_drifted(n, hashes) and n.id not in asked),
                            key=lambda n: (n.state_time or 0.0, n.id))
    # Replacements under way: nodes we asked to delete that still exist, and this pool's
    # nodes being deleted anyway (each leaves a gap that min-ready fills).
    present: set[str] = set()
    deleting: set[str] = set()
    for node in engine.node_cache.nodes():
        if node.provider == provider and node.pool == pool.name:
            present.add(node.id)
            if node.state in (model.NodeState.DELETING, model.NodeState.DELETED):
                deleting.add(node.id)
    asked &= present
    if not drifted_spares or not in_window(pool.drift_budget, engine.clock.time()):
        return 0, len(drifted_spares)
    room = allowance(pool.drift_budget, len(spares)) - len(asked | deleting)
    count = 0
    for node in drifted_spares[:max(0, room)]:
        if engine.request_delete(node.id, REASON):
            asked.add(node.id)
            count += 1
            log.info("[node: %s] Replacing a spare of %s/%s: %s", node.id, provider,
                     pool.name, REASON)
    return count, len(drifted_spares) - count
