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
entry that is not such JSON (an unknown action, a `reason` or `by` that is not a string, a
`time` that is not a number of seconds from 1970 to the end of year 9999) is `Malformed`:
reported by the mirror and ignored, and left out by `PoolStateStore.list` (which tells
its caller).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable
from urllib.parse import quote, unquote

from nodepool_k8s.core import records
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.cache import MirroredCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.mirror import ChildMirror

ROOT = f"{paths.OWN_ROOT}/pool-state"
PAUSE, DRAIN = "pause", "drain"
ACTIONS = (PAUSE, DRAIN)
_STRENGTH = {PAUSE: 1, DRAIN: 2}
# The latest `time` that can be shown as a date (the end of year 9999).
MAX_TIME = records.MAX_TIME


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
    """The entry in `raw`, or Malformed: every field read is type- and range-checked, so
    nothing a hand edit or another tool wrote can fail later (when it is shown, compared
    or turned into a date)."""
    data = records.load_object(raw)
    action = data.get("action")
    if not isinstance(action, str) or action not in ACTIONS:
        raise records.Malformed(f"expected an action of {', '.join(ACTIONS)},"
                                f" got {records.clip(repr(action))}")
    texts: dict[str, str] = {}
    for key in ("reason", "by"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise records.Malformed(f"{key} must be a string, got {type(value).__name__}")
        texts[key] = value or ""
    when = data.get("time")
    when = 0.0 if when is None else when
    if not records.timestamp(when):
        raise records.Malformed(f"time must be seconds since the epoch (0 to {MAX_TIME}),"
                                f" got {records.clip(repr(when))}")
    return PoolState(target=unquote(name), action=action, reason=texts["reason"],
                     by=texts["by"], time=float(when))


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

    def list(self, malformed: Callable[[str, str], None] | None = None) -> list[PoolState]:
        """The entries; a malformed one is left out (as the launchers ignore it) and
        reported to `malformed(path, reason)`, if given."""
        names = self.zk.get_children(ROOT) or []
        found: list[PoolState] = []
        for path, result in self.zk.get_many([f"{ROOT}/{n}" for n in sorted(names)]):
            if result is None:
                continue
            try:
                found.append(decode(paths.basename(path), result[0]))
            except records.Malformed as exc:
                if malformed is not None:
                    malformed(path, exc.reason)
        return found


class PoolStateCache(MirroredCache[PoolState]):
    """Every launcher's live view of the entries; listeners hear of each change."""

    name = "pool state cache"

    def __init__(self, zk: ZkClient) -> None:
        # A target's entry is deleted on resume and created again on the next pause.
        self._mirror = ChildMirror(zk, ROOT, decode, name="pool-state-cache",
                                   accept=lambda name: True, reused_names=True)

    def states(self) -> list[PoolState]:
        with self._mirror._lock:
            return list(self._mirror.items.values())

    def state_for(self, provider: str, pool: str) -> PoolState | None:
        return strongest(s for s in self.states() if s.covers(provider, pool))
