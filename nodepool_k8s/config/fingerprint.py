"""The fingerprint of the configuration a node is built from (drift detection).

Owns: `label_hash`, a short, stable digest of a pool label's resolved configuration (every
key of the label after pool and provider defaults were applied, but for keys left unset,
None or empty, and for `min-ready` and `boot-timeout`, which build nothing) and of the
pool's `node-attributes`, which end up on the node. A node records the hash it was built
with (`config_hash` in its record, an annotation on its namespace); a spare whose hash
differs from the current one was built from an older configuration and is replaced within
the pool's disruption budgets (see launcher/upkeep/drift.py and disruption.py). Pure and
deterministic across processes and Python runs (no `hash()`, sets are sorted), so every
launcher reaches the same answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from typing import Any, Mapping

from nodepool_k8s.config.model import Config, PoolConfig, PoolLabel


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, (list, tuple, dict, set, frozenset, str))
                             and not value)


# Label keys that say how many nodes to keep or how long to wait for one, not what a node
# is: changing them rebuilds no spare.
_NOT_BUILT = frozenset({"min_ready", "boot_timeout"})


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # A key left unset is not part of the digest, so a release that adds an optional
        # key (unset by default) does not make every spare look drifted.
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in _NOT_BUILT and not _unset(getattr(value, f.name))}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=repr)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value != value:  # NaN never equals itself
        return "nan"
    return value


# Every new node records its label's hash (twice: the node record and its namespace), and
# computing one walks the whole resolved label. A loaded configuration is immutable, so a
# hash is kept per (label, pool) object pair; the entry holds both objects, so their ids
# cannot be reused while it exists. Bounded: reloads replace the objects.
_CACHE_LIMIT = 1024
_cache: dict[tuple[int, int], tuple[PoolLabel, PoolConfig, str]] = {}
_cache_lock = threading.Lock()


def label_hash(label: PoolLabel, pool: PoolConfig) -> str:
    """16 hex digits identifying what a node of `label` in `pool` is built from."""
    key = (id(label), id(pool))
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] is label and hit[1] is pool:
        return hit[2]
    digest = _label_hash(label, pool)
    with _cache_lock:
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[key] = (label, pool, digest)
    return digest


def _label_hash(label: PoolLabel, pool: PoolConfig) -> str:
    text = json.dumps({"label": _plain(label), "node-attributes": _plain(pool.node_attributes)},
                      sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


Hashes = Mapping[tuple[str, str], Mapping[str, str]]


def config_hashes(config: Config) -> dict[tuple[str, str], dict[str, str]]:
    """(provider, pool) -> label -> the hash a node built now would record."""
    return {(provider.name, pool.name): {name: label_hash(label, pool)
                                         for name, label in pool.labels.items()}
            for provider in config.providers.values() for pool in provider.pools.values()}


def drifted(provider: str | None, pool: str | None, label: str | None,
            recorded: object, hashes: Hashes) -> bool | None:
    """Whether a node was built from another configuration of its label than `hashes`;
    None when unknown (no recorded hash, or the label is no longer configured there)."""
    if not isinstance(recorded, str):
        return None
    wanted = hashes.get((provider or "", pool or ""), {}).get(label or "")
    return None if wanted is None else recorded != wanted
