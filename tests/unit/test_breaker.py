"""The circuit breaker's pure decisions (launcher.breaker)."""

from __future__ import annotations

import json
from typing import Any

from nodepool_k8s.launcher import breaker as b
from nodepool_k8s.zk import pool_status

LIMITS = b.Thresholds(threshold=2, backoff=10.0, backoff_max=25.0)


def test_only_classified_non_transient_failures_count() -> None:
    assert b.failure_reason("LaunchError(ErrImagePull): pod x: ErrImagePull") == "ErrImagePull"
    assert b.failure_reason("LaunchError(BootTimeout): timed out") == "BootTimeout"
    assert b.failure_reason("LaunchError(Cancelled): cancelled") is None
    assert b.failure_reason("LaunchError(Conflict): raced") is None
    assert b.failure_reason("TemporaryError: 503 from the API") is None
    assert b.failure_reason("ApiError: boom") is None


def test_trip_backoff_probe_and_reset() -> None:
    entry: dict[str, Any] = {}
    b.on_failure(entry, "c1", "ErrImagePull", "x", 100.0, LIMITS)
    assert b.admit(entry, "c1", 100.0, LIMITS) == b.ALLOW
    b.on_failure(entry, "c1", "ErrImagePull", "x", 101.0, LIMITS)
    assert entry["state"] == b.OPEN and entry["until"] == 111.0
    assert b.admit(entry, "c1", 105.0, LIMITS) == b.DENY
    # A launch already running when it tripped fails too: no second trip.
    b.on_failure(entry, "c1", "ErrImagePull", "x", 102.0, LIMITS)
    assert entry["trips"] == 1 and entry["until"] == 111.0
    assert b.admit(entry, "c1", 111.0, LIMITS) == b.PROBE
    assert b.claim_probe(entry, "c1", "pool-1", 111.0, LIMITS)
    assert b.admit(entry, "c1", 112.0, LIMITS) == b.DENY  # one probe only
    # The probe fails: the back-off doubles (capped).
    b.on_failure(entry, "c1", "ErrImagePull", "x", 113.0, LIMITS)
    assert entry["state"] == b.OPEN and entry["until"] == 113.0 + 20.0
    assert b.claim_probe(entry, "c1", "pool-1", 200.0, LIMITS)
    b.on_failure(entry, "c1", "ErrImagePull", "x", 201.0, LIMITS)
    assert entry["until"] == 201.0 + 25.0
    # A probe that never reports is given up after one more back-off.
    assert b.claim_probe(entry, "c1", "pool-1", 300.0, LIMITS)
    assert b.admit(entry, "c1", 300.0 + 25.0, LIMITS) == b.PROBE
    # Success closes it.
    assert b.on_success(entry, "c1") and entry["state"] == b.CLOSED
    assert not b.on_success(entry, "c1")  # nothing to write


def test_config_change_resets() -> None:
    entry: dict[str, Any] = {}
    for now in (1.0, 2.0):
        b.on_failure(entry, "old", "Invalid", "x", now, LIMITS)
    assert b.admit(entry, "old", 3.0, LIMITS) == b.DENY
    assert b.admit(entry, "new", 3.0, LIMITS) == b.ALLOW
    b.on_failure(entry, "new", "Invalid", "x", 4.0, LIMITS)
    assert entry["failures"] == 1 and entry["state"] == b.CLOSED


def test_threshold_zero_disables() -> None:
    off = b.Thresholds(threshold=0)
    entry: dict[str, Any] = {}
    for now in range(5):
        b.on_failure(entry, "c", "Invalid", "x", float(now), off)
    assert b.admit(entry, "c", 5.0, off) == b.ALLOW


def test_a_hostile_trip_count_costs_nothing_and_keeps_the_cap() -> None:
    # Any count from a shared record (at most 308 digits: the record gate) gives the
    # capped back-off at once: no huge power, no float overflow in the pool's pass.
    for trips in (1100, 5000, 10 ** 6):
        assert LIMITS.delay(trips) == 25.0
        entry: dict[str, Any] = {"state": b.PROBING, "config": "c1", "trips": trips,
                                 "probe_at": 100.0, "failures": trips}
        assert b.admit(entry, "c1", 124.0, LIMITS) == b.DENY
        assert b.admit(entry, "c1", 125.0, LIMITS) == b.PROBE
        assert b.on_failure(entry, "c1", "Invalid", "x", 130.0, LIMITS)
        assert entry["state"] == b.OPEN and entry["until"] == 155.0


def test_breaker_entries_with_times_out_of_range_start_afresh() -> None:
    # Near float's limit a back-off added to a time is lost (1e308 + 60 == 1e308): such
    # an entry would suspend its label for good; it is dropped (and reported) instead.
    raw = json.dumps({"small": {"state": "open", "since": 1e308, "until": 1e308 + 60},
                      "large": {"state": "open", "since": -5.0, "until": 10.0},
                      "ok": {"state": "open", "since": 100.0, "until": 160.0}}).encode()
    assert list(pool_status.decode_breakers("fake.main", raw, None)) == ["ok"]


def test_a_labels_digest_is_worked_out_once_per_label_object() -> None:
    """The breaker checks every waiting request's labels at every pass: the digest (a hash
    of the label's whole configuration) is remembered per label object, and a changed
    label (a reload makes a new object) gets its own."""
    from nodepool_k8s.config.model import PoolLabel
    label = PoolLabel(name="a", type="namespace")
    first = b.digest(label)
    assert b.digest(label) is first
    changed = PoolLabel(name="a", type="namespace", cpu=2)
    assert b.digest(changed) != first
    assert b.digest(PoolLabel(name="a", type="namespace")) == first


def test_check_of_a_pools_labels_by_entry() -> None:
    """`PoolBreaker.check` answers every waiting request at every pass, and goes straight
    past labels whose entry is missing or closed: an open entry (of the label's current
    configuration) still refuses, or waits for its due probe when not accepting, and one of
    an older configuration still admits."""
    from typing import cast

    from nodepool_k8s.config.model import PoolConfig, PoolLabel
    from nodepool_k8s.runtime.clock import ManualClock

    labels = {name: PoolLabel(name=name, type="namespace") for name in ("a", "b")}
    pool = PoolConfig(name="main", provider="p", labels=labels, breaker_threshold=2)
    record: dict[str, Any] = {}

    class Cache:
        def get(self, key: str) -> dict[str, Any]:
            return record

    clock = ManualClock(start=1_000.0)
    pool_breaker = b.PoolBreaker(cast(Any, None), cast(Any, Cache()), "p", "main", "id",
                                 clock)
    now = clock.time()
    assert pool_breaker.check(["a", "b"], pool, now, accepting=True) == (None, False)
    record["a"] = {"state": b.CLOSED, "failures": 1, "trips": 0,
                   "config": b.digest(labels["a"])}
    assert pool_breaker.check(["a", "b"], pool, now, accepting=True) == (None, False)
    record["b"] = {"state": b.OPEN, "failures": 2, "trips": 1, "reason": "ErrImagePull",
                   "since": now, "until": now + 60, "config": b.digest(labels["b"])}
    refusal, probe = pool_breaker.check(["a", "b"], pool, now, accepting=True)
    assert refusal is not None and "label b is suspended" in refusal and not probe
    assert pool_breaker.check(["a"], pool, now, accepting=True) == (None, False)
    clock.advance(60)  # the probe is due: without accepting, neither claimed nor refused
    assert pool_breaker.check(["b"], pool, clock.time(), accepting=False) == (None, False)
    record["b"]["config"] = "an older configuration"
    assert pool_breaker.check(["b"], pool, clock.time(), accepting=True) == (None, False)
