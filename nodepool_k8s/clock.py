"""Time, injected: a real clock for the daemon and a manual one for tests.

Owns: `Clock` (wall time for timestamps written to ZooKeeper, monotonic time for deadlines)
and `ManualClock`, whose time moves only when a test advances it. Nothing else in the package
calls `time.time()` for decisions, so ages and expiries are testable without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (what is stored in `state_time`)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that tests move forward explicitly."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._mono = 1000.0
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            self._mono += seconds


SYSTEM_CLOCK: Clock = SystemClock()
