"""A single background thread that runs callbacks at (or after) given times.

Owns: the controllers' notion of "later". One thread waits on a condition variable until the
earliest due callback (or until new work arrives), so delays cost no threads and no polling.
Callbacks run outside the scheduler's lock and one at a time; an exception in one is logged
and does not stop the others. `stop()` drops pending work and joins the thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, name: str = "k8s-sim-controllers") -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._running = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Scheduler":
        self._running = True
        self._thread.start()
        return self

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        """Run `callback` on the scheduler thread after `delay` seconds (0 = soon)."""
        with self._cond:
            if not self._running:
                return
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay), next(self._seq),
                                        callback))
            self._cond.notify()

    def idle(self) -> bool:
        """True when nothing is due now or running (used by tests and `Simulator.settle`)."""
        with self._cond:
            if self._busy:
                return False
            return not self._heap or self._heap[0][0] > time.monotonic()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._running = False
            self._heap.clear()
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._running:
                    if self._heap:
                        wait = self._heap[0][0] - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
                if not self._running:
                    return
                _, _, callback = heapq.heappop(self._heap)
                self._busy = True
            try:
                callback()
            except Exception:  # a broken controller step must not stop the others
                log.exception("simulator controller callback failed")
            finally:
                with self._cond:
                    self._busy = False
