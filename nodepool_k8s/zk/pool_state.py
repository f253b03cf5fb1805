"""Operator fleet control in ZooKeeper: pools (or whole providers) paused or drained.

Owns: `/nodepool_k8s/pool-state/<target>`, one persistent znode per paused or drained
target (`PROVIDER` or `PROVIDER/POOL`, URL-quoted into one znode name) holding JSON
`{"action": "pause"|"drain", "reason", "by": "user@host", "time"}`; `PoolStateStore` writes
and reads it for the `nodepool pause/drain/resume` commands; `PoolStateCache` mirrors it in
every launcher (one-shot watches through `ChildMirror`), so a command takes effect on every
launcher at once, without a configuration edit. Resuming deletes the znode.

A pool is governed by its own entry and its provider's; when both exist the stronger wins
(drain over pause). The znodes live outside `/nodepool`: Zuul never sees them.

How it fails: writes raise the usual `zk.errors` (`ZkConnectionError`, `ZkAuthError`); an
entry that is not such JSON is reported as malformed by the mirror and ignored.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable
from urllib.parse import quote, unquote

from nodepool_k8s import records
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.cache import MirroredCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.mirror import ChildMirror

ROOT = f"{paths.OWN_ROOT}/pool-state"
PAUSE, DRAIN = "pause", "drain"
ACTIONS = (PAUSE, DRAIN)
_STRENGTH = {PAUSE: 1, DRAIN: 2}


@dataclass(frozen=True)
class PoolState:
    """A pause or drain in force for `target` (`provider` or `provider/pool`)."""

    target: str
    action: str
    reason: str = ""
    by: str = ""
    time: float = 0.0
    source: str = "operator"  # "operator" (ZooKeeper) or "maintenance" (a config window)

    @property
    def provider(self) -> str:
        return self.target.split("/", 1)[0]

    @property
    def pool(self) -> str | None:
        parts = self.target.split("/", 1)
        return parts[1] if len(parts) == 2 else None

    def covers(self, provider: str, pool: str) -> bool:
        return self.provider == provider and self.pool in (None, pool)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def target_path(target: str) -> str:
    return f"{ROOT}/{quote(target, safe='')}"


def decode(name: str, raw: bytes, stat: Any = None) -> PoolState:
    data = records.load_object(raw)
    if data.get("action") not in ACTIONS:
        raise records.Malformed(f"expected an action of {', '.join(ACTIONS)}")
    return PoolState(target=unquote(name), action=str(data["action"]),
                     reason=str(data.get("reason") or ""), by=str(data.get("by") or ""),
                     time=float(data.get("time") or 0.0))


def strongest(states: Iterable[PoolState]) -> PoolState | None:
    """The state that governs: drain over pause, then the pool's own entry."""
    ordered = sorted(states, key=lambda s: (_STRENGTH.get(s.action, 0), s.pool is not None))
    return ordered[-1] if ordered else None


class PoolStateStore:
    """Writes and one-off reads (the CLI)."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    def set(self, target: str, action: str, reason: str, by: str, now: float) -> PoolState:
        state = PoolState(target=target, action=action, reason=reason, by=by, time=now)
        data = json.dumps({k: v for k, v in state.to_dict().items()
                           if k not in ("target", "source")}).encode()
        path = target_path(target)
        try:
            self.zk.create(path, data, makepath=True)
        except errors.NodeExistsError:
            self.zk.set(path, data)
        return state

    def clear(self, target: str) -> bool:
        """Resume: True if there was an entry."""
        try:
            self.zk.delete(target_path(target))
        except errors.NoNodeError:
            return False
        return True

    def list(self) -> list[PoolState]:
        names = self.zk.get_children(ROOT) or []
        found: list[PoolState] = []
        for path, result in self.zk.get_many([f"{ROOT}/{n}" for n in sorted(names)]):
            if result is None:
                continue
            try:
                found.append(decode(paths.basename(path), result[0]))
            except records.Malformed:
                continue
        return found


class PoolStateCache(MirroredCache[PoolState]):
    """Every launcher's live view of the entries; listeners hear of each change."""

    name = "pool state cache"

    def __init__(self, zk: ZkClient) -> None:
        self._mirror = ChildMirror(zk, ROOT, decode, name="pool-state-cache",
                                   accept=lambda name: True)

    def states(self) -> list[PoolState]:
        with self._mirror._lock:
            return list(self._mirror.items.values())

    def state_for(self, provider: str, pool: str) -> PoolState | None:
        return strongest(s for s in self.states() if s.covers(provider, pool))
