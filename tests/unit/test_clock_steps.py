"""Wall-clock steps, without ZooKeeper: the worker loop and the clock helpers.

Aspects: the worker loop's back-off after a failed pass and its wait are on monotonic time
(a wall clock that steps back an hour on every read does not stretch a one-second back-off
to the loop's longest wait); `ManualClock.step_wall` moves wall time alone; `StampAges`
judges a stamp by the wall clock once and by the monotonic clock after (steps change no
age, a stamp from our future is new, a new stamp starts afresh, forgotten keys go);
`wall_deadline`; a circuit breaker entry written by a clock a year ahead of ours suspends
its label for one back-off from when we first see it, not for a year.
"""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from nodepool_k8s.runtime.clock import ManualClock, StampAges, wall_deadline
from nodepool_k8s.launcher import breaker
from nodepool_k8s.launcher import worker as worker_module
from nodepool_k8s.launcher.worker import Worker

HOUR = 3600.0
DAY = 86400.0


class SteppingBack(ManualClock):
    """A wall clock that steps back an hour each time it is read: anything that schedules
    on it waits an hour (or the loop's longest wait) instead of what it meant."""

    def time(self) -> float:
        now = super().time()
        self.step_wall(-HOUR)
        return now


class FailsOnce(Worker):
    def __init__(self, clock: ManualClock) -> None:
        super().__init__("FailsOnce", clock)
        self.calls = 0
        self.retried = threading.Event()

    def run_once(self) -> float | None:
        self.calls += 1
        if self.calls == 1:
            raise ValueError("first pass fails")
        self.retried.set()
        return None


def test_step_wall_moves_wall_time_alone() -> None:
    clock = ManualClock(start=1000.0)
    mono = clock.monotonic()
    clock.step_wall(-HOUR)
    assert clock.time() == 1000.0 - HOUR and clock.monotonic() == mono
    clock.advance(5)
    assert clock.time() == 1005.0 - HOUR and clock.monotonic() == mono + 5


def test_error_backoff_is_not_stretched_by_a_backward_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "ERROR_BACKOFF", 0.05)
    clock = SteppingBack()
    worker = FailsOnce(clock)
    worker.start()
    try:
        # MAX_WAIT (60 s) is what a wall-time deadline turned into; 0.05 s is meant. The
        # manual monotonic clock never moves, so the back-off's floor (5 ms) applies.
        assert worker.retried.wait(15), "the retried pass"
    finally:
        worker.stop()
        worker.join(10)


def test_stamp_ages_ignore_steps_after_the_first_look() -> None:
    clock = ManualClock(start=10_000.0)
    ages = StampAges(clock)
    assert ages.age("n", 9_900.0) == 100.0  # first look: the wall clock's word
    clock.step_wall(DAY)
    assert ages.age("n", 9_900.0) == 100.0  # a forward step ages nothing
    clock.step_wall(-DAY - HOUR)
    assert ages.age("n", 9_900.0) == 100.0  # nor does a backward one make it younger
    clock.advance(5)
    assert ages.age("n", 9_900.0) == 105.0  # time passing does
    # A new stamp under the key (a node in a new state) is judged afresh, by the wall
    # clock as it is now.
    assert ages.age("n", clock.time() - 7) == 7.0


def test_a_stamp_from_our_future_is_new() -> None:
    clock = ManualClock(start=10_000.0)
    ages = StampAges(clock)
    assert ages.age("ahead", 10_000.0 + 365 * 86400.0) == 0.0
    clock.advance(30)
    assert ages.age("ahead", 10_000.0 + 365 * 86400.0) == 30.0


def test_stamp_ages_forget_what_is_not_kept() -> None:
    clock = ManualClock(start=10_000.0)
    ages = StampAges(clock)
    for key in ("a", "b", "c"):
        ages.age(key, 9_000.0)
    ages.keep({"a", "b"})
    ages.forget("b")
    assert len(ages) == 1
    clock.step_wall(HOUR)
    assert ages.age("a", 9_000.0) == 1_000.0
    assert ages.age("c", 9_000.0) == 1_000.0 + HOUR  # forgotten: judged afresh


def test_wall_deadline() -> None:
    clock = ManualClock(start=10_000.0)
    assert wall_deadline(clock, 10_060.0) == clock.monotonic() + 60
    clock.step_wall(-HOUR)  # the moment is now an hour further off: derived afresh
    assert wall_deadline(clock, 10_060.0) == clock.monotonic() + 60 + HOUR


def test_breaker_entry_from_a_clock_ahead_suspends_for_one_backoff() -> None:
    clock = ManualClock(start=10_000.0)
    limits = breaker.Thresholds(threshold=1, backoff=60.0)
    entry: dict[str, Any] = {"state": breaker.CLOSED, "failures": 0, "trips": 0,
                             "config": "c"}
    year = 365 * 86400.0
    breaker.on_failure(entry, "c", "ErrImagePull", "m", clock.time() + year, limits)
    pool = breaker.PoolBreaker(cast(Any, None), cast(Any, None), "p", "main", "id", clock)

    def admitted() -> str:
        now = clock.time()
        return breaker.admit(entry, "c", pool.judged_now("small", entry, now), limits)

    assert admitted() == breaker.DENY
    assert pool.probe_in("small", entry, clock.time()) == 60.0
    clock.advance(59)
    assert admitted() == breaker.DENY
    clock.step_wall(-HOUR)  # a backward step changes nothing either
    clock.advance(1)
    assert admitted() == breaker.PROBE
    assert pool.probe_in("small", entry, clock.time()) == 0.0
