"""Fleet control in the launcher: whether a pool is paused or drained right now, and the
draining of its spare nodes.

Owns: combining the operator's pause/drain (ZooKeeper, `zk.pool_state`, mirrored by every
launcher) with the pool's configured maintenance windows into the one state that governs
the pool (`control`), and deleting the spare nodes of a draining pool (`drain_spares`).
The pool worker calls both on every pass; a paused or drained pool accepts no request
(requests only it could serve stay queued: it does not decline them), its in-use nodes
are untouched, and a drained pool also loses its ready, unallocated, unlocked nodes.
"""

from __future__ import annotations

import logging
from typing import Protocol

from nodepool_k8s.core import model
from nodepool_k8s.config.model import PoolConfig
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.core.model import Node
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.pool_state import DRAIN, PoolState, PoolStateCache

log = logging.getLogger("nodepool_k8s.fleet")


class FleetDeps(Protocol):
    """What fleet control (and drift, which deletes spares the same way) uses of the
    engine (`launcher.context.Engine` provides it)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def pool_states(self) -> PoolStateCache: ...

    @property
    def node_cache(self) -> NodeCache: ...

    def request_delete(self, node_id: str, reason: str) -> bool: ...


def control(engine: FleetDeps, provider: str, pool: PoolConfig) -> PoolState | None:
    """The pause or drain in force for the pool (operator's or a maintenance window's)."""
    return maintenance.in_force(engine.pool_states, provider, pool, engine.clock.time())


def is_spare(node: Node, locked: bool) -> bool:
    """Ready, not allocated to a request, not locked (Zuul holds the lock while in use)."""
    return node.state == model.NodeState.READY and not node.allocated_to and not locked


def spares(engine: FleetDeps, provider: str, pool: str) -> list[Node]:
    cache = engine.node_cache
    return [n for n in cache.nodes() if n.provider == provider and n.pool == pool
            and is_spare(n, cache.is_locked(n.id))]


def drain_spares(engine: FleetDeps, provider: str, pool: str, state: PoolState) -> int:
    """Ask for every spare node of a draining pool to be deleted; how many were asked."""
    if state.action != DRAIN:
        return 0
    asked = 0
    for node in spares(engine, provider, pool):
        if engine.request_delete(node.id, f"draining pool {provider}/{pool}"):
            asked += 1
            log.info("[node: %s] Deleting a spare node of draining pool %s/%s", node.id,
                     provider, pool)
    return asked
