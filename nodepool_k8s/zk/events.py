"""The installation's lifecycle event log, shared by every launcher, in ZooKeeper.

Owns: `/nodepool_k8s/events`, a bounded log of what happened to nodes and pools (launch
failures with their reason, failed attempts, deletions, refusals, stuck deletions,
requests a launcher's decline failed for good (`declined`), pool pauses and resumes,
spares removed for drift, expiry, surplus or a drain, config reloads applied and rejected,
a pool's API server becoming unusable or usable again (`ApiReachable`), and successful
launches). Each znode is a sequential `entry-NNNNNNNNNN` holding a JSON list of events (a
batch); `nodepool events` and the web app's `/events` read them, newest last.

Cost and bounds: a launch failure, a quota abort, a delete refusal, a config reload
(applied or rejected) and an ApiReachable transition are one write at once (taking any
pending batch along in the same znode); successful launches, deletions, failed attempts,
declines, spare removals and pool pauses/resumes (the hot paths) are batched: kept in
memory and written as one znode of up to `batch_size` events, at the latest `batch_age`
seconds after the first (a background flusher; `stop` writes the rest), so the success
path pays a fraction of a write per node. At most `max_entries` znodes are kept: every
`trim_every`th write lists the children and deletes the oldest beyond the cap. Each
event's strings are cut to `FIELD_LIMIT` characters and a batch to `MAX_BATCH_BYTES`, so
the log's size is bounded by `max_entries * MAX_BATCH_BYTES`.
Everything here is best-effort: an error is logged at debug level and the event dropped,
never raised into a launch or a deletion. Reading passes every entry through the record gate
(`records.check_events`: numbers in range, each event's `time` a timestamp up to year
9999, its strings strings); an entry that fails is skipped whole and reported once with
its path.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from nodepool_k8s.core import records
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient

log = logging.getLogger("nodepool_k8s.zk.events")

EVENTS = f"{paths.OWN_ROOT}/events"
PREFIX = "entry-"
FIELD_LIMIT = 400
MAX_BATCH_BYTES = 16384

# Event kinds.
LAUNCHED = "launched"
LAUNCH_FAILED = "launch-failed"
ATTEMPT_FAILED = "attempt-failed"
LAUNCH_ABORTED = "launch-aborted"
DELETED = "deleted"
DELETE_REFUSED = "delete-refused"
DELETE_STUCK = "delete-stuck"
DECLINED = "declined"
POOL_PAUSED = "pool-paused"
POOL_RESUMED = "pool-resumed"
CONFIG_RELOADED = "config-reloaded"
API_UNREACHABLE = "api-unreachable"
API_REACHABLE = "api-reachable"
RELOAD_REJECTED = "reload-rejected"
# A spare the launcher chose to remove (launcher/upkeep/disruption.py), by reason.
SPARE_DRAINED = "spare-drained"
SPARE_EXPIRED = "expired"
SPARE_DRIFTED = "drift-replaced"
SURPLUS_REMOVED = "surplus-removed"
KINDS = (LAUNCHED, LAUNCH_FAILED, ATTEMPT_FAILED, LAUNCH_ABORTED, DELETED, DELETE_REFUSED,
         DELETE_STUCK, DECLINED, POOL_PAUSED, POOL_RESUMED, CONFIG_RELOADED,
         API_UNREACHABLE, API_REACHABLE, RELOAD_REJECTED, SPARE_DRAINED, SPARE_EXPIRED,
         SPARE_DRIFTED, SURPLUS_REMOVED)


@dataclass(frozen=True)
class EventLogSettings:
    max_entries: int = 500
    trim_every: int = 20
    batch_size: int = 20
    batch_age: float = 5.0


def make_event(kind: str, when: float, *, provider: str | None = None,
               pool: str | None = None, node: str | None = None, label: str | None = None,
               reason: str | None = None, message: str = "", **more: Any) -> dict[str, Any]:
    """One event as stored (strings cut to FIELD_LIMIT, unset keys left out)."""
    event: dict[str, Any] = {"time": when, "kind": kind}
    for key, value in (("provider", provider), ("pool", pool), ("node", node),
                       ("label", label), ("reason", reason), ("message", message),
                       *more.items()):
        if value is None or value == "":
            continue
        event[key] = value[:FIELD_LIMIT] if isinstance(value, str) else value
    return event


def _encode(events: list[dict[str, Any]]) -> bytes:
    data = json.dumps(events).encode("utf8")
    while len(data) > MAX_BATCH_BYTES and len(events) > 1:
        events = events[len(events) // 2:]  # keep the newer half
        data = json.dumps(events).encode("utf8")
    return data


class EventLog:
    """Writes and reads the shared event log; thread-safe, never raises on writes."""

    def __init__(self, zk: ZkClient, clock: Clock = SYSTEM_CLOCK,
                 settings: EventLogSettings = EventLogSettings()) -> None:
        self.zk = zk
        self.clock = clock
        self.settings = settings
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        self._pending_since: float | None = None
        self._writes = 0
        self._root_ready = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Flush batches in the background once they are `batch_age` old."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="event-log", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the flusher and write what is pending."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self.zk.connected:
            self.flush()

    def _run(self) -> None:
        while not self._stop.wait(max(0.05, self.settings.batch_age / 4)):
            self.flush(force=False)

    # -- writing ----------------------------------------------------------------------------
    def record(self, kind: str, **fields: Any) -> None:
        """Write one event now (launch failures, refusals, reloads), with any pending
        batch in the same znode (one write)."""
        event = make_event(kind, self.clock.time(), **fields)
        with self._lock:
            batch, self._pending, self._pending_since = self._pending, [], None
        self._write(batch + [event])

    def record_batched(self, kind: str, **fields: Any) -> None:
        """Keep an event for the next batch (successful launches: the hot path)."""
        with self._lock:
            self._pending.append(make_event(kind, self.clock.time(), **fields))
            if self._pending_since is None:
                self._pending_since = self.clock.monotonic()
            full = len(self._pending) >= self.settings.batch_size
        if full:
            self.flush()

    def flush(self, force: bool = True) -> None:
        """Write the pending batch (only once it is `batch_age` old unless `force`)."""
        with self._lock:
            if not self._pending:
                return
            if not force and self._pending_since is not None and \
                    self.clock.monotonic() - self._pending_since < self.settings.batch_age:
                return
            batch, self._pending, self._pending_since = self._pending, [], None
        self._write(batch)

    def next_flush(self) -> float | None:
        """When (monotonic) the pending batch is due, None when nothing is pending."""
        with self._lock:
            if self._pending_since is None:
                return None
            return self._pending_since + self.settings.batch_age

    def _write(self, events: list[dict[str, Any]]) -> None:
        try:
            if not self._root_ready:
                self.zk.ensure_path(EVENTS)
                self._root_ready = True
            self.zk.create(f"{EVENTS}/{PREFIX}", _encode(events), sequence=True)
        except Exception as exc:  # noqa: BLE001 - best effort by contract
            log.debug("Could not record %d event(s): %s", len(events), exc)
            return
        with self._lock:
            self._writes += 1
            trim = self._writes % self.settings.trim_every == 0
        if trim:
            self.trim()

    def trim(self) -> int:
        """Delete the oldest entries beyond `max_entries`; how many were deleted."""
        try:
            children = sorted(c for c in self.zk.get_children(EVENTS) or []
                              if c.startswith(PREFIX))
            excess = children[:max(0, len(children) - self.settings.max_entries)]
            for child in excess:
                try:
                    self.zk.delete(f"{EVENTS}/{child}")
                except errors.NoNodeError:
                    pass  # another launcher trimmed it
            return len(excess)
        except Exception as exc:  # noqa: BLE001 - best effort by contract
            log.debug("Could not trim the event log: %s", exc)
            return 0


# -- reading -------------------------------------------------------------------------------

def read_events(zk: ZkClient) -> list[dict[str, Any]]:
    """Every stored event, oldest first (by time, then by entry order)."""
    children = sorted(c for c in zk.get_children(EVENTS) or [] if c.startswith(PREFIX))
    out: list[dict[str, Any]] = []
    for path, found in zk.get_many([f"{EVENTS}/{c}" for c in children]):
        if found is None:
            continue
        try:
            out.extend(records.check_events(records.load_json(found[0])))
        except records.Malformed as exc:
            # Written by something else (every batch we write passes): skipped whole.
            records.REPORTS.report("event batch", path, found[1].version, exc.reason)
    out.sort(key=lambda e: float(e["time"]))
    return out


def select(events: Iterable[Mapping[str, Any]], *, provider: str | None = None,
           pool: str | None = None, node: str | None = None,
           since: float | None = None) -> list[dict[str, Any]]:
    """The events matching every given filter (node ids compare without leading zeros)."""
    want_node = node.lstrip("0") if node is not None else None
    out = []
    for e in events:
        if provider is not None and e.get("provider") != provider:
            continue
        if pool is not None and e.get("pool") != pool:
            continue
        if want_node is not None and str(e.get("node") or "").lstrip("0") != want_node:
            continue
        if since is not None and float(e.get("time") or 0.0) < since:
            continue
        out.append(dict(e))
    return out
