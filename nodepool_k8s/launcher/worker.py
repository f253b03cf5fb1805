"""A long-lived worker thread that sleeps until woken or until its next deadline.

Owns: the loop every engine worker shares. `wake()` (from cache listeners, other workers,
the session supervisor) runs the next pass at once; passes coalesce, so a burst of events
costs one pass (a worker may also ask for a short gap between passes: `coalesce`).
`run_once()` returns the monotonic time (`clock.monotonic()`) of the next timed work (or
None) and the loop waits exactly until then: no fixed sleep tick. Monotonic, because the
wall clock steps: on wall time, a backward step of an hour stretched a one-second back-off
to the longest wait, and held the workers' stored deadlines for the hour. A worker that
schedules on a wall-clock moment turns it into a monotonic deadline on every pass
(`clock.wall_deadline`). A pass that raises is logged with its traceback (once while it
keeps failing the same way, then a count per minute) and retried after a short backoff (a
temporary error, such as ZooKeeper being unreachable, with a WARNING line instead); the
loop itself runs inside the thread guard (`nodepool_k8s/runtime/threads.py`: logged, counted in
stats, restarted), so the thread never dies silently.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable

from nodepool_k8s.runtime import threads
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.zk import paths

# Upper bound of one wait, so a worker re-evaluates even if a deadline computation was off.
MAX_WAIT = 60.0
ERROR_BACKOFF = 1.0
# The gap the cleanup and min-ready workers leave between passes: they react to every node
# and request change, and in a burst one pass per 20 ms serves them all (without the gap,
# a burst costs them several passes per node).
PASS_COALESCE = 0.02
# A pass failing the same way again is logged with its traceback once, then one line per
# this many seconds with the count: a poisoned pass retried every second must not fill
# the log (the traceback is the same every time).
REPEAT_LOG_INTERVAL = 60.0


class Worker:
    def __init__(self, name: str, clock: Clock,
                 report_crash: Callable[[str], None] | None = None,
                 coalesce: float = 0.0) -> None:
        """`coalesce`: after a pass, gather wakes for this long before the next one (a
        worker that reacts to every node change, but need not within milliseconds, then
        makes one pass per burst of changes instead of one per change)."""
        self.name = name
        self.clock = clock
        self.coalesce = coalesce
        self._report_crash = report_crash
        self.log = logging.getLogger(f"nodepool_k8s.{name}")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.failures = 0  # passes that raised something other than a TemporaryError
        self._failing: tuple[str, str] | None = None  # (type, message) of the last failure
        self._repeats = 0
        self._reported_at = 0.0

    def start(self) -> None:
        self._thread = threads.start(
            self.name, self._run, on_crash=threads.Crash.RESTART, stopping=self._stop,
            report=self._report_crash or threads.no_report)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        signature = (type(exc).__name__, str(exc)[:500])
        now = self.clock.monotonic()
        if signature != self._failing:
            self._failing, self._repeats, self._reported_at = signature, 0, now
            self.log.exception("%s pass failed; retrying", self.name)
            return
        self._repeats += 1
        if now - self._reported_at >= REPEAT_LOG_INTERVAL:
            self.log.error("%s pass still failing (%d more times in %.0fs): %s: %s",
                           self.name, self._repeats, now - self._reported_at, *signature)
            self._repeats, self._reported_at = 0, now

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run_once(self) -> float | None:
        """One pass; the monotonic time of the next timed work, None for none."""
        raise NotImplementedError

    def _run(self) -> None:
        self.log.debug("%s started", self.name)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                deadline = self.run_once()
                self._failing = None
            except TemporaryError as exc:
                # ZooKeeper or the API went away mid-pass (a failover, a lost reply): an
                # expected condition, logged as such; the pass is retried after a backoff.
                self.log.warning("%s pass interrupted (%s); retrying", self.name, exc)
                deadline = self.clock.monotonic() + ERROR_BACKOFF
            except Exception as exc:
                self._failed(exc)
                deadline = self.clock.monotonic() + ERROR_BACKOFF
            self.passes += 1
            if self.coalesce > 0 and self._stop.wait(self.coalesce):
                break
            if self._stop.is_set():
                break
            timeout = MAX_WAIT
            if deadline is not None and not math.isinf(deadline):
                # A small floor keeps a deadline that is already due from spinning the CPU.
                timeout = min(MAX_WAIT, max(0.005, deadline - self.clock.monotonic()))
            self._wake.wait(timeout)
        self.log.debug("%s stopped", self.name)


class RefusedRequests:
    """Requests ZooKeeper would not let us lock or write (another client's ACL), by the
    version refused: skipped until they change, and reported once per version. Otherwise
    one such request would fail every pass of the step that met it, with a traceback each
    time, and nothing after it in that pass would be done."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger]) -> None:
        self._log = log
        self._versions: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._versions)

    def skip(self, request: NodeRequest) -> bool:
        return self._versions.get(request.id) == request.version

    def refuse(self, request: NodeRequest, exc: Exception) -> None:
        if self._versions.get(request.id) != request.version:
            self._versions[request.id] = request.version
            self._log.warning("Skipping request %s until it changes: %s",
                              paths.request_path(request.id), exc)

    def keep_only(self, live: set[str]) -> None:
        """Forget requests that are gone."""
        if self._versions:
            self._versions = {k: v for k, v in self._versions.items() if k in live}
