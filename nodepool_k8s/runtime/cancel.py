"""Cancellation that wakes waiters instead of being polled.

Owns: `CancelEvent`, a `threading.Event` (so every `cancel.is_set()` / `cancel.wait()` of a
driver keeps working) whose `set()` also calls the callbacks subscribed to it. A driver that
blocks on its own condition (e.g. the Kubernetes watch cache) subscribes the condition's wake
to the cancel event, so a cancelled launch returns at once without a periodic tick.

How it fails: a callback that raises is logged and does not stop the others (`set()` never
raises). Callbacks run on the thread that sets the event and must be quick (set an event).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger(__name__)


class CancelEvent(threading.Event):
    """A `threading.Event` whose `set()` also calls its subscribers."""

    def __init__(self) -> None:
        super().__init__()
        self._subscribers_lock = threading.Lock()
        self._subscribers: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        with self._subscribers_lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback()
            except Exception:  # noqa: BLE001 - set() must reach every subscriber
                log.exception("Cancel callback %r failed", callback)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when the event is set (at once if it already is); returns the
        function that unsubscribes it."""
        with self._subscribers_lock:
            self._subscribers.append(callback)
        if self.is_set():
            callback()

        def unsubscribe() -> None:
            with self._subscribers_lock:
                try:
                    self._subscribers.remove(callback)
                except ValueError:
                    pass

        return unsubscribe
