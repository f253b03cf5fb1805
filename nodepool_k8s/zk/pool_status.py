"""Pool status and circuit-breaker records in ZooKeeper, mirrored for every launcher.

Owns two directories of JSON records under our own tree (never under `/nodepool`):

- `/nodepool_k8s/pool-status/<pool-id>`: ephemeral, one per running pool worker (the id of
  its component registration), written by that worker only when its status changed (see
  `launcher.pool_status` for the content and the rate limit); it vanishes with the session;
- `/nodepool_k8s/pool-breakers/<provider>.<pool>`: persistent, one per configured pool
  (shared by every launcher serving that pool), holding the circuit-breaker state of each
  label; changed with versioned read-modify-write, so concurrent launchers never lose an
  update (see `launcher.breaker`).

`JsonDirCache` keeps either directory in memory with a `ChildMirror` (a persistent
recursive watch, one-shot watches on a server older than 3.6; no polling), so deciding
whether a label is suspended costs no read, and this process's own writes of either are
not read back (zk/echo.py).

Failure modes: writes raise the zk.errors classes; a record that does not pass the gate
(`records.load_object`: size, encoding, depth, numbers in range) or whose fields have the
wrong types is `malformed` in the mirror, reported once with its path, and ignored.
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, TypeVar, cast
from urllib.parse import quote

from nodepool_k8s.core import records
from nodepool_k8s.core.pool_records import BreakerEntry, PoolStatusRecord
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.cache import MirroredCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.mirror import ChildMirror

POOL_STATUS = f"{paths.OWN_ROOT}/pool-status"
POOL_BREAKERS = f"{paths.OWN_ROOT}/pool-breakers"

# A pool's breaker record: label -> that label's entry.
BreakerRecord = dict[str, BreakerEntry]
R = TypeVar("R")


def status_path(pool_id: str) -> str:
    return f"{POOL_STATUS}/{quote(pool_id, safe='')}"


def breaker_key(provider: str, pool: str) -> str:
    return f"{quote(provider, safe='')}.{quote(pool, safe='')}"


def breaker_path(provider: str, pool: str) -> str:
    return f"{POOL_BREAKERS}/{breaker_key(provider, pool)}"


def encode(data: Mapping[str, object]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf8")


def decode(key: str, raw: bytes, stat: Any) -> dict[str, Any]:
    return records.load_object(raw)


def _finite(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# What a breaker entry's keys must hold (see launcher.breaker for their meaning).
_BREAKER_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "state": (lambda v: v in ("closed", "open", "probing"), "closed, open or probing"),
    "config": (lambda v: isinstance(v, str), "a string"),
    "probe": (lambda v: isinstance(v, str), "a string"),
    "reason": (lambda v: isinstance(v, str), "a string"),
    "message": (lambda v: isinstance(v, str), "a string"),
    "failures": (_count, "a non-negative integer"),
    "trips": (_count, "a non-negative integer"),
    # Wall times: within records.MAX_TIME a back-off added to one stays exact to well
    # under a second (near float's limit, 1e308 + 60 == 1e308 would suspend for good).
    "until": (records.timestamp, "a timestamp"),
    "since": (records.timestamp, "a timestamp"),
    "probe_at": (records.timestamp, "a timestamp"),
}


def breaker_entry_problem(entry: Any) -> str | None:
    """Why one label's breaker entry is unusable, None when it is fine."""
    if not isinstance(entry, dict):
        return f"expected an object, got {type(entry).__name__}"
    for key, (check, expected) in _BREAKER_FIELDS.items():
        if key in entry and not check(entry[key]):
            return f"{key} must be {expected}"
    return None


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, dict) for item in value)


def _status_conditions(value: Any) -> bool:
    """A pool's conditions: strings, and `last_transition` a timestamp (wall time)."""
    return records.conditions(value) and all(
        records.timestamp(c.get("last_transition", 0)) for c in value)


def _counts(value: Any) -> bool:
    return isinstance(value, dict) and all(_finite(v) for v in value.values())


# What the readers of a pool's status (pool-list, /metrics, the status page) rely on.
_STATUS_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "id": (lambda v: isinstance(v, str), "a string"),
    "provider": (lambda v: isinstance(v, str), "a string"),
    "pool": (lambda v: isinstance(v, str), "a string"),
    "hostname": (lambda v: v is None or isinstance(v, str), "a string"),
    "conditions": (_status_conditions, records.CONDITIONS),
    "usage": (_objects, "a list of objects"),
    "nodes": (_counts, "an object of numbers"),
    "suspended": (lambda v: isinstance(v, dict), "an object"),
    "capacity": (lambda v: isinstance(v, dict), "an object"),
    "labels": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
               "a list of strings"),
    "launches_in_progress": (_finite, "a number"),
    "requests_queued": (_finite, "a number"),
    "requests_handled": (_finite, "a number"),
    "priority": (_finite, "a number"),
    "drifted": (_finite, "a number"),
    "paused": (lambda v: isinstance(v, bool), "true or false"),
}


def decode_pool_status(key: str, raw: bytes, stat: Any) -> dict[str, Any]:
    """A pool worker's published status, or Malformed when a field its readers use has
    the wrong type (one such record would turn /metrics into a 500 on every scrape)."""
    data = records.load_object(raw)
    for field, (check, expected) in _STATUS_FIELDS.items():
        if field in data and data[field] is not None and not check(data[field]):
            raise records.Malformed(f"{field} must be {expected}")
    return data


def decode_breakers(key: str, raw: bytes, stat: Any) -> BreakerRecord:
    """A pool's breaker record, label -> entry. An unusable entry (someone else wrote it, or
    an older format) is left out and reported once: that label's breaker starts afresh,
    and the next update of the record drops it."""
    data = records.load_object(raw)
    problems = {name: problem for name, entry in data.items()
                if (problem := breaker_entry_problem(entry)) is not None}
    for label, problem in problems.items():
        del data[label]
        records.REPORTS.report("breaker entry", f"{POOL_BREAKERS}/{key} (label {label})",
                               getattr(stat, "version", -1), problem)
    # Every entry left passed breaker_entry_problem: each key it has holds its type.
    return cast(BreakerRecord, data)


class JsonDirCache(MirroredCache[R]):
    """Every JSON child of `root`, by child name, as `decoder` made it."""

    def __init__(self, zk: ZkClient, root: str, name: str,
                 decoder: Callable[[str, bytes, Any], R],
                 skip_read: Callable[[R, bool], bool] | None = None) -> None:
        """`skip_read(record, locked)`: a change of the child last read as `record` is
        left unread (stale) until someone asks (`refresh`; zk/mirror.py, "Reads
        skipped"); asked on the mirror's thread, must be quick."""
        self.name = name
        # Names come back: a pool's status after a restart, its breaker after a removal.
        # A persistent watch where the server has them: this process's own writes (its
        # pools' statuses, its breaker updates) are then not read back (zk/echo.py).
        self._mirror = ChildMirror(zk, root, decoder, name=name,
                                   accept=lambda child: bool(child), reused_names=True,
                                   persistent=True, skip_read=skip_read)

    def get(self, key: str) -> R | None:
        with self._mirror._lock:
            return self._mirror.items.get(key)

    def items(self) -> dict[str, R]:
        with self._mirror._lock:
            return dict(self._mirror.items)


class StatusWriter:
    """Writes one pool worker's ephemeral status znode (create, then versioned sets)."""

    def __init__(self, zk: ZkClient, pool_id: str) -> None:
        self.zk = zk
        self.path = status_path(pool_id)
        self._version: int | None = None
        self._epoch = -1

    def write(self, data: PoolStatusRecord) -> None:
        raw = encode(data)
        if self._epoch != self.zk.epoch:  # a new session: our ephemeral is gone
            self._version, self._epoch = None, self.zk.epoch
        if self._version is not None:
            try:
                self._version = self.zk.set(self.path, raw, self._version).version
                return
            except (errors.NoNodeError, errors.VersionConflict):
                self._version = None
        try:
            self.zk.create(self.path, raw, ephemeral=True, makepath=True)
            self._version = 0
        except errors.NodeExistsError:
            self._version = self.zk.set(self.path, raw).version

    def remove(self) -> None:
        self._version = None
        try:
            self.zk.delete(self.path)
        except (errors.NoNodeError, errors.ZkConnectionError, errors.ZkSessionLost):
            pass


def update_breaker(zk: ZkClient, provider: str, pool: str,
                   change: Callable[[BreakerRecord], bool], attempts: int = 20
                   ) -> BreakerRecord:
    """Read-modify-write the pool's breaker record; `change` edits it in place and returns
    whether anything changed (no write otherwise). Returns the record as stored."""
    key = breaker_key(provider, pool)
    path = breaker_path(provider, pool)
    for _ in range(attempts):
        found = zk.get(path)
        data: BreakerRecord = {}
        if found and found[0]:
            try:
                data = decode_breakers(key, found[0], found[1])
            except records.Malformed as exc:
                # Our own record, unusable as a whole: replaced by this update.
                records.REPORTS.report("breaker record", path, found[1].version, exc.reason)
        if not change(data):
            return data
        try:
            if found is None:
                zk.create(path, encode(data), makepath=True)
            else:
                zk.set(path, encode(data), found[1].version)
            return data
        except (errors.NodeExistsError, errors.VersionConflict, errors.NoNodeError):
            continue
    raise errors.VersionConflict(f"{path}: too many concurrent breaker updates")


def read_all(zk: ZkClient, root: str,
             decoder: Callable[[str, bytes, Any], dict[str, Any]] = decode
             ) -> dict[str, dict[str, Any]]:
    """A one-shot read of every record under `root` (the CLI has no cache); malformed
    records are left out."""
    children = zk.get_children(root) or []
    out: dict[str, dict[str, Any]] = {}
    for path, found in zk.get_many([f"{root}/{c}" for c in sorted(children)]):
        if found is None or not found[0]:
            continue
        try:
            out[paths.basename(path)] = decoder(paths.basename(path), found[0], found[1])
        except records.Malformed as exc:
            records.REPORTS.report("record", path, found[1].version, exc.reason)
    return out
