"""Drift replacement: spare nodes built from an older configuration are replaced.

Owns: telling which spares drifted (ready, unallocated, unlocked nodes whose recorded
`config_hash` differs from the hash of their label's configuration now). Their removal,
within the pool's disruption budgets (`drift-budget` is a drift-only one), is
disruption.py's; nothing is created here: min-ready builds the replacements, within
max-servers. Nodes without a recorded hash (built before this feature) are left alone.

Failure modes: none (pure).
"""

from __future__ import annotations

from nodepool_k8s.config.fingerprint import label_hash
from nodepool_k8s.config.model import PoolConfig
from nodepool_k8s.core.model import Node

REASON = "drifted: built from an older configuration"


def current_hashes(pool: PoolConfig) -> dict[str, str]:
    return {name: label_hash(label, pool) for name, label in pool.labels.items()}


def is_drifted(node: Node, hashes: dict[str, str]) -> bool:
    """Built from another configuration of a label the pool still has."""
    wanted = hashes.get(node.label or "")
    return node.config_hash is not None and wanted is not None and node.config_hash != wanted
