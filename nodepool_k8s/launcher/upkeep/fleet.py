"""Fleet control in the launcher: whether a pool is paused or drained right now, and what
a spare node is.

Owns: combining the operator's pause/drain (ZooKeeper, `zk.pool_state`, mirrored by every
launcher) with the pool's configured maintenance windows into the one state that governs
the pool (`control`), and listing the pool's spares (`spares`). The pool worker calls
`control` on every pass; a paused or drained pool accepts no request (requests only it
could serve stay queued: it does not decline them), its in-use nodes are untouched, and a
drained pool also loses its ready, unallocated, unlocked nodes (disruption.py deletes
them, within the pool's `drain` budget).
"""

from __future__ import annotations

from typing import Protocol

from nodepool_k8s.core import model
from nodepool_k8s.config.model import PoolConfig
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.core.model import Node
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.pool_state import PoolState, PoolStateCache


class FleetDeps(Protocol):
    """What fleet control (and disruption, which deletes spares) uses of the engine
    (`launcher.context.Engine` provides it)."""

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
