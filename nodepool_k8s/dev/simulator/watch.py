"""Streaming one watch to one client: event lines, bookmarks, timeout, disconnects.

Owns: the loop that serves a `?watch=true` request after the HTTP headers are sent. It waits
in select() on two things at once — the watcher's wake socket (new events) and the client's
socket (readable during a watch means the client closed or misbehaves) — plus a deadline for
the next bookmark or the end of `timeoutSeconds`. So there is no polling, a client that goes
away is noticed at once, and shutdown (which closes every watcher) ends streams promptly.

Failure modes: write errors (client gone) propagate as OSError to the HTTP layer, which drops
the connection; the watcher is always unregistered.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, Callable

from nodepool_k8s.dev.simulator import tables
from nodepool_k8s.dev.simulator.data import dumps, encode_object
from nodepool_k8s.dev.simulator.errors import ApiError
from nodepool_k8s.dev.simulator.resources import ResourceType
from nodepool_k8s.dev.simulator.store import Obj, Watcher

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def _line(event_type: str, obj: Any, encoded: bytes | None = None) -> bytes:
    body = encoded if encoded is not None else dumps(obj)
    return b'{"type":"%s","object":%s}\n' % (event_type.encode(), body)


class WatchStream:
    def __init__(self, resource: ResourceType, watcher: Watcher | None, timeout: float,
                 bookmarks: bool, bookmark_interval: float, stop: threading.Event,
                 initial_events_end: bool = False, table_version: str | None = None,
                 error: ApiError | None = None) -> None:
        self.resource = resource
        self.watcher = watcher
        self.timeout = timeout
        self.bookmarks = bookmarks
        self.bookmark_interval = bookmark_interval
        self.stop = stop
        self.initial_events_end = initial_events_end
        self.table_version = table_version
        self.error = error
        self._sent_columns = False

    def _bookmark(self, rv: int, initial_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return _line("BOOKMARK", {"kind": self.resource.kind,
                                  "apiVersion": self.resource.api_version, "metadata": meta})

    def _encode(self, event_type: str, obj: Obj) -> bytes:
        if self.table_version is None:
            # Many watches stream the same stored object: serialize it once.
            return _line(event_type, obj, encode_object(obj))
        # kubectl get -w: each event carries a one-row Table; columns only on the first.
        table = tables.table(self.resource, [obj],
                             {"resourceVersion": obj["metadata"]["resourceVersion"]},
                             version=self.table_version)
        if self._sent_columns:
            table["columnDefinitions"] = []
        self._sent_columns = True
        return _line(event_type, table)

    def close(self) -> None:
        """Release the watcher even if `run` never ran (e.g. the headers could not be sent)."""
        if self.watcher is not None:
            self.watcher.release()

    def run(self, client: socket.socket, write: Callable[[bytes], None]) -> bool:
        """Stream until timeout, shutdown or client disconnect; True if the client left."""
        if self.error is not None or self.watcher is None:
            if self.error is not None:
                write(_line("ERROR", self.error.status()))
            return False
        watcher = self.watcher
        try:
            now = time.monotonic()
            deadline = now + self.timeout
            next_bookmark = now + self.bookmark_interval if self.bookmarks else float("inf")
            first = True
            while True:
                events, rv = watcher.drain()
                out = [self._encode(event_type, obj) for event_type, obj in events]
                if first and self.initial_events_end:
                    out.append(self._bookmark(rv, initial_end=True))
                first = False
                if out:
                    write(b"".join(out))
                if watcher.closed or self.stop.is_set():
                    return False
                now = time.monotonic()
                if now >= deadline:
                    if self.bookmarks:
                        write(self._bookmark(rv))  # lets the client resume without a relist
                    return False
                if now >= next_bookmark:
                    write(self._bookmark(rv))
                    next_bookmark = now + self.bookmark_interval
                    continue
                wait = min(deadline, next_bookmark) - now
                waitables: list[Any] = [client, watcher]
                readable, _, _ = select.select(waitables, [], [], wait)
                if client in readable:
                    return True  # EOF or unexpected bytes: the client is done with this watch
                if watcher in readable:
                    watcher.clear_wake()
        finally:
            watcher.release()
