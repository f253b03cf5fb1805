"""Sending a launch's independent requests at once.

Owns: a provider's small fixed pool of threads (`Together`) that send the requests of a
launch step which do not depend on each other (the fences, the service account and the role
of a new namespace) beside the launch's own thread, so a step costs one API round trip
instead of one per object. The caller sends the first itself, so a step of one request
never changes threads, and with `workers` 0 every request goes out on the caller's thread,
one after the other.

The caller says whether a step goes out at once (`run(..., at_once=)`): the provider asks
for it only while few of its launches run (then a launch waits on the API server's round
trips, and sending its requests together shortens it); when many run (a burst), the
launches themselves keep the API server and the process busy, and handing requests to
other threads would only add thread switches.

How it fails: `run` returns only when every request of the step has ended, answered or
failed: nothing of a failed step is still in flight when the launch cleans up after it.
It then raises the first failure in the order the requests were given (the one a
one-after-the-other launch would have met first); the others were attempted as well. Each
request keeps its own retries and the launch's budget (deadline, cancel). Stopped, it
refuses steps it would send at once (`LaunchCancelled`; one going out on the caller's
thread is the launch's own, ended by its cancel) and cancels what waits for a thread (the
caller gets `LaunchCancelled` for those). No reference cycle holds a failure: the error raised is
dropped from every local first, as `KubeClient.call` does.
"""

from __future__ import annotations

import threading
from concurrent.futures import CancelledError
from typing import Callable

from nodepool_k8s.core.errors import LaunchCancelled
from nodepool_k8s.runtime import threads


class Together:
    """Steps of independent requests, sent at once (see the module docstring)."""

    def __init__(self, workers: int, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pool = threads.fixed_pool(workers, name) if workers > 0 else None
        self._stopped = False
        self.together = 0  # steps sent at once so far (for tests)

    def run(self, requests: list[Callable[[], object]], at_once: bool = True) -> None:
        """Send `requests` (at once unless `at_once` is False, or there are no workers)
        and wait for all of them; raise the first failure."""
        if self._pool is None or len(requests) < 2 or not at_once:
            for request in requests:
                request()  # one after the other: a failure ends the step there
            return
        with self._lock:
            if self._stopped:
                raise LaunchCancelled(f"{self._name}: stopped")
            futures = [self._pool.submit(request) for request in requests[1:]]
            self.together += 1
        failures: list[BaseException] = []
        try:
            requests[0]()
        except BaseException as exc:  # noqa: BLE001 - raised below, in order
            failures.append(exc)
        for future in futures:
            try:
                error = future.exception()  # waits for it to end
            except CancelledError:
                error = LaunchCancelled(f"{self._name}: stopped before it was sent")
            if error is not None:
                failures.append(error)
        futures.clear()
        if failures:
            first = failures[0]
            failures.clear()
            try:
                raise first
            finally:
                del first

    def stop(self) -> None:
        """Refuse new steps; cancel the requests that wait for a thread."""
        with self._lock:
            self._stopped = True
            pool = self._pool
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
