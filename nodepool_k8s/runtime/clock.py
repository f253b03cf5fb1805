"""Time, injected: a real clock for the daemon and a manual one for tests.

Owns: `Clock` (wall time for timestamps written to ZooKeeper, monotonic time for deadlines)
and `ManualClock`, whose time moves only when a test advances it (and whose wall clock a
test can step alone, as chrony's `makestep` or a resumed VM steps a real one). Nothing
else in the package calls `time.time()` for decisions, so ages and expiries are testable
without sleeping.

A machine's wall clock steps, forward or backward, by seconds or years. So:
- every deadline, back-off, retry and pass schedule of this process is monotonic time;
  a moment that only the wall clock names (a maintenance window's start) is turned into
  a monotonic deadline afresh on every pass (`wall_deadline`);
- an age of a timestamp another machine took (a node's `state_time`, a znode's mtime, a
  cloud resource's creation time, a circuit breaker's trip) is judged by `StampAges`:
  wall time once, when this process first looks at the stamp, monotonic time after, so a
  step never makes something older (deleted early) or younger (kept for ever).

Failure: none of this raises. A clock that is wrong before the first look at a stamp is
believed (nothing here can tell it from a right one); doc/operation.md ("Clock steps")
says what an operator should do about that.
"""

from __future__ import annotations

import threading
import time
from typing import Collection, Hashable, Protocol


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
        """Time passes: wall and monotonic clocks move together."""
        with self._lock:
            self._now += seconds
            self._mono += seconds

    def step_wall(self, seconds: float) -> None:
        """The wall clock steps (forward or, with a negative `seconds`, backward) while no
        time passes: what chrony's `makestep`, a resumed VM or an operator's `date -s` does
        to a real machine. The monotonic clock does not move."""
        with self._lock:
            self._now += seconds


SYSTEM_CLOCK: Clock = SystemClock()


def wall_deadline(clock: Clock, when: float) -> float:
    """The monotonic deadline of the wall-clock moment `when` (epoch seconds), as far as
    the wall clock tells now. A step moves it: callers derive it again on every pass
    (the engine's workers wait at most a minute, so a window starts at most that late)."""
    return clock.monotonic() + (when - clock.time())


class StampAges:
    """Ages of timestamps this process did not take on its own monotonic clock, judged so
    that a step of the wall clock changes none of them.

    The first time a stamp is looked at under its key, its age is what the wall clock
    says, but never below 0 (a stamp from our future, taken by a clock ahead of ours, is
    new); from then on the age grows with the monotonic clock alone. A forward step of a
    day therefore expires nothing early, and a backward step of an hour delays nothing.
    A different stamp under the same key (a node in a new state) starts afresh. What a
    wrong clock says at the first look is believed; a stamp from our future costs at most
    one whole limit more than it should.

    Thread-safe. One entry per key: `keep` forgets the keys no longer wanted.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # key -> (stamp, the monotonic time at which that stamp's age was 0)
        self._origins: dict[Hashable, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def age(self, key: Hashable, stamp: float) -> float:
        """Seconds since `stamp` (epoch seconds) as this process judges them (>= 0)."""
        mono = self._clock.monotonic()
        with self._lock:
            seen = self._origins.get(key)
            if seen is None or seen[0] != stamp:
                seen = (stamp, mono - max(0.0, self._clock.time() - stamp))
                self._origins[key] = seen
            return mono - seen[1]

    def keep(self, keys: Collection[Hashable]) -> None:
        """Forget every key not in `keys`."""
        with self._lock:
            if any(key not in keys for key in self._origins):
                self._origins = {k: v for k, v in self._origins.items() if k in keys}

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._origins.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._origins)
