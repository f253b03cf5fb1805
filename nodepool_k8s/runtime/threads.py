"""One guard for every long-lived thread body: nothing dies silently.

Owns: `start(name, body, on_crash=..., report=..., stop=...)`, which runs `body` on a daemon
thread inside a guard. When the body raises (anything, BaseException included, except a
normal return) the guard logs the traceback with the thread's name, calls `report(name)`
(the launcher counts it in stats) and then, by `Crash` policy:

- RESTART: runs the body again after `backoff` seconds (the stop event, when given, ends
  the wait and the thread); for loops that must keep running (the provider retry, the
  engine workers);
- STOP: calls `stop()` (the daemon stops: better than running without a vital thread);
- END: ends the thread (one-shot bodies such as retiring a replaced provider).

A body that returns normally ends its thread; it is not restarted.

`fixed_pool(workers, name)`: a thread pool whose threads all start at once (bounded pools
of launches and deletions).

How it fails: `report` and `stop` are called inside their own try (a failing stats client
does not hide the crash); the guard itself never raises.
"""

from __future__ import annotations

import enum
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

log = logging.getLogger("nodepool_k8s.runtime.threads")

DEFAULT_BACKOFF = 1.0


class Crash(enum.Enum):
    """What the guard does when a thread body raises."""

    RESTART = "restart"
    STOP = "stop"
    END = "end"


def no_report(name: str) -> None:
    pass


def guard(name: str, body: Callable[[], None], *, on_crash: Crash,
          report: Callable[[str], None] = no_report, stop: Callable[[], None] | None = None,
          stopping: threading.Event | None = None,
          backoff: float = DEFAULT_BACKOFF) -> Callable[[], None]:
    """`body` wrapped by the guard (what `start` runs on the thread)."""
    if on_crash is Crash.STOP and stop is None:
        raise ValueError("Crash.STOP needs a stop callback")

    def run() -> None:
        while True:
            try:
                body()
                return
            except BaseException:  # noqa: BLE001 - the guard's whole point
                log.exception("Thread %s crashed (%s)", name, on_crash.value)
                try:
                    report(name)
                except Exception:  # noqa: BLE001 - reporting must not hide the crash
                    log.exception("Could not report the crash of thread %s", name)
            if on_crash is Crash.RESTART:
                waiter = stopping if stopping is not None else threading.Event()
                if waiter.wait(backoff):
                    return
                log.info("Restarting thread %s", name)
                continue
            if on_crash is Crash.STOP and stop is not None:
                try:
                    stop()
                except Exception:  # noqa: BLE001 - we are already failing
                    log.exception("Stopping after the crash of thread %s failed", name)
            return

    return run


def start(name: str, body: Callable[[], None], *, on_crash: Crash,
          report: Callable[[str], None] = no_report, stop: Callable[[], None] | None = None,
          stopping: threading.Event | None = None,
          backoff: float = DEFAULT_BACKOFF) -> threading.Thread:
    """Start `body` on a daemon thread named `name`, inside the guard."""
    thread = threading.Thread(
        target=guard(name, body, on_crash=on_crash, report=report, stop=stop,
                     stopping=stopping, backoff=backoff),
        name=name, daemon=True)
    thread.start()
    return thread


def fixed_pool(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool with all `workers` threads started now, not as work first overlaps.

    A bounded pool that grows to its bound only under load would add threads hours into a
    run (a burst, a slow API); started at once, a launcher's thread count is known from
    the start and never changes, so a new thread always means something is wrong. Each
    thread is started by a task that waits until all have started, so the executor has to
    make one per task."""
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
    everyone = threading.Barrier(workers + 1)
    for _ in range(workers):
        executor.submit(everyone.wait)
    everyone.wait()
    return executor
