"""Circuit breaker for a failing label in one pool.

Owns: counting consecutive launch failures of one label in one pool for reasons retrying
will not fix (image pull errors, Invalid, Forbidden by admission, Unschedulable past the
driver's grace, boot timeouts, ...), suspending the label for a back-off that doubles with
each trip (`breaker-backoff` up to `breaker-backoff-max`), letting exactly one probe launch
through once the back-off ran out, and resuming on its success. Transient errors (API
errors, cancellations, our objects raced away) neither count nor reset.

The state is shared by every launcher serving the pool: one persistent JSON record per pool
(`zk.pool_status.breaker_path`), label -> entry, changed with versioned read-modify-write
and read from a watch-driven cache. An entry remembers a digest of the label's
configuration; a different configuration (the image fixed) resets it, whoever reads it.

Entry states: `closed` (counting failures), `open` (suspended until `until`), `probing`
(one launch by `probe` in flight since `probe_at`; a probe that never reports, e.g. its
launcher died, is given up after one more back-off).

The decisions (`admit`, `on_failure`, `on_success`) are pure functions of an entry, so
they are unit-tested without ZooKeeper.

Time: `since`, `until` and `probe_at` are wall time, written by whichever launcher's clock.
A reader judges a back-off by the age of the stamp that started it (`since`, or `probe_at`
while probing) through `clock.StampAges` (`PoolBreaker.judged_now`): a backward step of its
own wall clock does not add the step to the suspension, a forward one does not end it
early, and an entry written by a clock far ahead of ours suspends the label for one
back-off from when we first see it, not until that clock's future.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import cast

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock, StampAges
from nodepool_k8s.config.model import PoolConfig, PoolLabel
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.core.pool_records import BreakerEntry
from nodepool_k8s.zk.pool_status import BreakerRecord, JsonDirCache, breaker_key, update_breaker

log = logging.getLogger("nodepool_k8s.launcher.breaker")

CLOSED, OPEN, PROBING = "closed", "open", "probing"
ALLOW, PROBE, DENY = "allow", "probe", "deny"

# LaunchError reasons that say nothing about the label: retrying may well work.
TRANSIENT_REASONS = frozenset({"Cancelled", "NotFound", "Conflict", "PodDeleted"})
_REASON_RE = re.compile(r"LaunchError\((\w+)\)")
# Doublings of the back-off counted at most (2**64 times any back-off is past any maximum).
MAX_DOUBLINGS = 64


def failure_reason(error: str) -> str | None:
    """The tripping reason of a failed launch's error text, None when transient.

    Only LaunchErrors count (the driver's classified failures); TemporaryError and
    unexpected exceptions are API or infrastructure trouble, never the label's fault.
    """
    match = _REASON_RE.match(error)
    if match is None or match[1] in TRANSIENT_REASONS:
        return None
    return match[1]


# The breaker checks a request's labels at every pass of the pool worker (a burst: requests
# x passes) and the digest is a hash of the label's whole repr: remembered per label object
# (a reload makes new ones; identity-checked, bounded, cleared when full).
_DIGESTS_MAX = 256
_digests: dict[int, tuple[PoolLabel, str]] = {}


def digest(label: PoolLabel) -> str:
    known = _digests.get(id(label))
    if known is not None and known[0] is label:
        return known[1]
    value = hashlib.sha256(repr(label).encode("utf8")).hexdigest()[:16]
    if len(_digests) >= _DIGESTS_MAX:
        _digests.clear()
    _digests[id(label)] = (label, value)
    return value


@dataclass(frozen=True)
class Thresholds:
    threshold: int = 3  # 0 disables the breaker
    backoff: float = 60.0
    backoff_max: float = 3600.0

    @classmethod
    def of(cls, pool: PoolConfig) -> "Thresholds":
        return cls(pool.breaker_threshold, pool.breaker_backoff, pool.breaker_backoff_max)

    def delay(self, trips: int) -> float:
        # `trips` comes from a shared record: an exponent capped long past `backoff_max`
        # keeps a huge count from costing an enormous power or a float overflow.
        return float(min(self.backoff_max,
                         self.backoff * 2 ** min(MAX_DOUBLINGS, max(0, trips - 1))))


def current(entry: BreakerEntry | None, config: str) -> BreakerEntry:
    """The entry as it applies to the label's current configuration (reset if changed)."""
    if not entry or entry.get("config") != config:
        return {"state": CLOSED, "failures": 0, "trips": 0, "config": config}
    return entry


def admit(entry: BreakerEntry | None, config: str, now: float,
          limits: Thresholds) -> str:
    """ALLOW, PROBE (the caller must claim the probe) or DENY a new launch of the label."""
    state = current(entry, config)
    if limits.threshold <= 0 or state.get("state", CLOSED) == CLOSED:
        return ALLOW
    if state["state"] == OPEN:
        return PROBE if now >= float(state.get("until", 0.0)) else DENY
    # PROBING: give up on a probe that never reported after one more back-off.
    stale = float(state.get("probe_at", 0.0)) + limits.delay(int(state.get("trips", 1)))
    return PROBE if now >= stale else DENY


def _replace(entry: BreakerEntry, fresh: BreakerEntry) -> None:
    """Make `entry` equal to `fresh` in place (the caller's record holds `entry`)."""
    plain = cast(dict[str, object], entry)
    plain.clear()
    plain.update(fresh)


def on_failure(entry: BreakerEntry, config: str, reason: str, message: str, now: float,
               limits: Thresholds) -> bool:
    """Count one failed launch (in place); True if the entry changed."""
    fresh = current(entry, config)
    if fresh is not entry:
        _replace(entry, fresh)
    entry["failures"] = int(entry.get("failures", 0)) + 1
    entry["reason"], entry["message"] = reason, message[:300]
    state = entry.get("state", CLOSED)
    # Launches already running when the label tripped may fail too: they do not trip it again.
    if limits.threshold > 0 and (state == PROBING or (
            state == CLOSED and entry["failures"] >= limits.threshold)):
        entry["trips"] = int(entry.get("trips", 0)) + 1
        entry["state"] = OPEN
        entry["since"] = now
        entry["until"] = now + limits.delay(entry["trips"])
        entry.pop("probe", None)
        entry.pop("probe_at", None)
    return True


def on_success(entry: BreakerEntry, config: str) -> bool:
    """A launch succeeded: close the breaker (in place); True if the entry changed."""
    fresh = current(entry, config)
    if fresh is entry and entry.get("state", CLOSED) == CLOSED \
            and not entry.get("failures"):
        return False
    _replace(entry, {"state": CLOSED, "failures": 0, "trips": 0, "config": config})
    return True


def claim_probe(entry: BreakerEntry, config: str, pool_id: str, now: float,
                limits: Thresholds, judged: float | None = None) -> bool:
    """`judged`: the time the back-off is judged by (default `now`, the probe's stamp)."""
    if admit(entry, config, now if judged is None else judged, limits) != PROBE:
        return False
    entry["state"], entry["probe"], entry["probe_at"] = PROBING, pool_id, now
    return True


class PoolBreaker:
    """The breaker of one pool, as one pool worker uses it (reads from the shared cache)."""

    def __init__(self, zk: ZkClient, cache: JsonDirCache[BreakerRecord], provider: str,
                 pool: str, pool_id: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.zk = zk
        self._ages = StampAges(clock)
        self.cache = cache
        self.provider = provider
        self.pool = pool
        self.pool_id = pool_id
        self.key = breaker_key(provider, pool)

    def entries(self) -> BreakerRecord:
        return self.cache.get(self.key) or {}

    def judged_now(self, name: str, entry: BreakerEntry | None, now: float) -> float:
        """`now` (wall) as `entry`'s back-off is judged: its starting stamp plus that
        stamp's step-proof age (see the module docstring); `now` itself for an entry
        without a back-off running."""
        entry = entry or {}
        state = entry.get("state")
        field = "since" if state == OPEN else "probe_at" if state == PROBING else None
        stamp = entry.get("since") if state == OPEN else \
            entry.get("probe_at") if state == PROBING else None
        if field is None or not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            return now
        return float(stamp) + self._ages.age((name, field), float(stamp))

    def probe_in(self, name: str, entry: BreakerEntry, now: float) -> float | None:
        """Seconds until a suspended label's probe is due; None when not `open`."""
        until = entry.get("until")
        if entry.get("state") != OPEN or not isinstance(until, (int, float)) \
                or isinstance(until, bool):
            return None
        return max(0.0, float(until) - self.judged_now(name, entry, now))

    def suspended(self, pool: PoolConfig, now: float) -> dict[str, BreakerEntry]:
        """Labels currently not admitting launches, with their (current) entries."""
        limits = Thresholds.of(pool)
        out = {}
        entries = self.entries()
        for name, label in pool.labels.items():
            entry = entries.get(name)
            config = digest(label)
            if entry and current(entry, config).get("state", CLOSED) != CLOSED \
                    and limits.threshold > 0:
                out[name] = entry
        return out

    def quiet(self) -> bool:
        """Whether no label of this pool is suspended or probing: `check` then answers
        (None, False) for any labels at any time."""
        return all(entry.get("state", CLOSED) == CLOSED
                   for entry in self.entries().values() if entry)

    def check(self, labels: list[str], pool: PoolConfig, now: float,
              accepting: bool) -> tuple[str | None, bool]:
        """(why a request for `labels` must not be launched here now, None to go ahead;
        whether it goes ahead as the probe of a suspended label).

        With `accepting`, a due probe is claimed in ZooKeeper (one launcher wins); without,
        a due probe is neither claimed nor refused (the request waits)."""
        probe = False
        entries = self.entries()
        if not entries:
            return None, False  # nothing ever failed here: every label is admitted
        limits = Thresholds.of(pool)
        for name in sorted(set(labels)):
            label = pool.labels.get(name)
            entry = entries.get(name)
            if label is None or not entry or entry.get("state", CLOSED) == CLOSED:
                continue  # `admit` allows a closed entry, whatever the configuration
            config = digest(label)
            verdict = admit(entries.get(name), config,
                            self.judged_now(name, entries.get(name), now), limits)
            if verdict == ALLOW:
                continue
            if verdict == PROBE and not accepting:
                return None, False
            if verdict == PROBE and self._claim(name, config, now, limits):
                log.info("Pool %s/%s: probing suspended label %s with one launch",
                         self.provider, self.pool, name)
                probe = True
                continue
            entry = entries.get(name) or {}
            return (f"label {name} is suspended in this pool after"
                    f" {entry.get('failures', 0)} failed launches"
                    f" ({entry.get('reason', 'unknown')})"), False
        return None, probe

    def _claim(self, name: str, config: str, now: float, limits: Thresholds) -> bool:
        won = [False]

        def change(data: BreakerRecord) -> bool:
            entry = data.setdefault(name, {})
            won[0] = claim_probe(entry, config, self.pool_id, now, limits,
                                 judged=self.judged_now(name, entry, now))
            return won[0]

        update_breaker(self.zk, self.provider, self.pool, change)
        if won[0]:
            self._ages.age((name, "probe_at"), now)  # our own stamp: its age is 0 now
        return won[0]

    def record(self, label: PoolLabel, pool: PoolConfig, error: str | None,
               now: float) -> None:
        """A launch of `label` finished: `error` None for success, else its error text."""
        config = digest(label)
        limits = Thresholds.of(pool)
        if error is None:
            entry = self.entries().get(label.name)
            if entry is None or not on_success(entry.copy(), config):
                return  # nothing to reset: no write

            def close(data: BreakerRecord) -> bool:
                return on_success(data.setdefault(label.name, {}), config)

            update_breaker(self.zk, self.provider, self.pool, close)
            log.info("Pool %s/%s: label %s launches succeed again", self.provider,
                     self.pool, label.name)
            return
        reason = failure_reason(error)
        if reason is None or limits.threshold <= 0:
            return

        def fail(data: BreakerRecord) -> bool:
            return on_failure(data.setdefault(label.name, {}), config, reason, error, now,
                              limits)

        stored = update_breaker(self.zk, self.provider, self.pool, fail).get(label.name, {})
        if stored.get("state") == OPEN and stored.get("since") == now:
            self._ages.age((label.name, "since"), now)  # our own stamp: its age is 0 now
            log.warning("Pool %s/%s: suspending label %s for %.0fs after %d failed launches"
                        " (%s)", self.provider, self.pool, label.name,
                        float(stored["until"]) - now, stored.get("failures", 0), reason)
