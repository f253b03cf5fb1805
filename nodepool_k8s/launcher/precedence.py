"""Launch first: whether housekeeping may wait for this launcher's launches.

Owns: the count of launches queued or running in this process (every provider's
`LaunchPool` reports each one from its submission until its pool worker was told it
returned) and, per pool, whether a request waits for quota or capacity (its pool worker says
so after each pass; another launcher's pool says so through its registration's `paused`,
asked through `others_waiting`).

On two cores a burst is CPU-bound: a deletion started while launches run takes its share
of the interpreter from launches a job waits for. A deletion is urgent only when someone
waits for what it frees, so the deleter and the cleanup worker ask `may_defer(provider)`
before starting work nobody waits for, and hold it while the answer is yes; each holder
bounds the wait itself (`EngineSettings.delete_defer_max`), so a steady stream of launches
cannot starve housekeeping. `subscribe` tells them the moment the answer may have turned
(the last launch returned, a pool began to wait).

Fails open: anything unknown (no provider, no launch counted) answers "do not defer", so
the worst a missed signal costs is the old order, never a deletion held past its bound.
Callbacks run outside this object's lock, in whichever thread changed the state.
"""

from __future__ import annotations

import threading
from typing import Callable


class LaunchFirst:
    def __init__(self, others_waiting: Callable[[str], bool] = lambda provider: False) -> None:
        """`others_waiting(provider)`: whether a pool of another launcher sharing that
        provider waits for quota or capacity (its registration says `paused`)."""
        self._others_waiting = others_waiting
        self._lock = threading.Lock()
        self._launches = 0
        self._waiting: dict[str, str] = {}  # pool id -> its provider, while it waits
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever deferred work may start now (quick; any thread)."""
        with self._lock:
            self._listeners.append(listener)

    def _notify(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    # -- what the launch pools and the pool workers say -----------------------------------
    def launch_queued(self) -> None:
        with self._lock:
            self._launches += 1

    def launch_returned(self) -> None:
        with self._lock:
            self._launches = max(0, self._launches - 1)
            idle = self._launches == 0
        if idle:
            self._notify()

    def set_waiting(self, pool_id: str, provider: str, waits: bool) -> None:
        """A pool's pass ended with a request waiting for quota or capacity (`waits`), or
        not."""
        with self._lock:
            began = waits and pool_id not in self._waiting
            if waits:
                self._waiting[pool_id] = provider
            else:
                self._waiting.pop(pool_id, None)
        if began:
            self._notify()

    # -- what housekeeping asks -----------------------------------------------------------
    @property
    def launching(self) -> bool:
        """Launches are queued or running in this launcher."""
        with self._lock:
            return self._launches > 0

    def waiting(self, provider: str) -> bool:
        """A pool sharing `provider` (ours or another launcher's) waits for quota."""
        with self._lock:
            ours = provider in self._waiting.values()
        return ours or self._others_waiting(provider)

    @property
    def housekeeping_waits(self) -> bool:
        """Housekeeping of no particular provider (a full cleanup pass, the leak sweep)
        may wait: launches run and none of this launcher's pools waits for quota."""
        with self._lock:
            return self._launches > 0 and not self._waiting

    def may_defer(self, provider: str | None) -> bool:
        """Work that frees `provider`'s quota may wait: launches run and no pool of that
        provider waits for quota (None, an unknown provider: no)."""
        return provider is not None and self.launching and not self.waiting(provider)
