"""Event-driven waiting: shared list+watch caches, and watching one namespace disappear.

Owns: `ObjectWatch`, one background thread per (provider, resource kind) that lists every
object carrying the provider's ownership label across all namespaces, then watches from the
list's resourceVersion (with bookmarks) and keeps the latest copy of each object. Launches
block in `ObjectWatch.wait` until their object satisfies a check; they are woken by events
for their own object only, so a launch costs no API calls while it waits. `wait_namespace_gone`
watches one namespace (field selector) until it is deleted.

How it fails: a watch that ends is resumed from the last resourceVersion; 410 Gone (or an
ERROR event with code 410) triggers a fresh list that replaces the cache (objects missing
from it count as deleted); any other error is logged and the list+watch is restarted after a
backoff. `wait` raises LaunchError("BootTimeout") at its deadline and
LaunchError("Cancelled") promptly after `cancel` is set; the check itself may raise
LaunchError to fail early. Waiters wake at least every `tick` seconds to notice cancellation
and deadlines (the injected clock decides deadlines, so tests can move time).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from typing import Any, Callable, Iterator, TypeVar

from nodepool_k8s.clock import Clock
from nodepool_k8s.driver.kubernetes.client import KubeClient
from nodepool_k8s.driver.kubernetes.errors import Gone, map_api_error
from nodepool_k8s.exceptions import LaunchError, NotFound, TemporaryError

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)
Check = Callable[[dict[str, Any] | None], T | None]
"""Inspects the cached object (None if not seen): a result ends the wait, None keeps waiting."""

RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0)


def object_key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def iter_events(response: Any) -> Iterator[dict[str, Any]]:
    """Decoded watch events from a streaming urllib3 response (one JSON object per line)."""
    buffer = b""
    chunks: Iterator[bytes]
    if getattr(response, "chunked", False):
        chunks = response.stream(None, decode_content=True)
    else:
        chunks = iter(lambda: response.read1(65536), b"")
    for chunk in chunks:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)
    if buffer.strip():
        yield json.loads(buffer)


def _close(response: Any) -> None:
    """Interrupt a blocked read from another thread, then drop the connection."""
    try:
        response.shutdown()
    except Exception:  # noqa: BLE001 - already closed or released
        pass
    try:
        response.close()
    except Exception:  # noqa: BLE001 - closing is best effort
        pass


class ObjectWatch:
    """A label-selected, all-namespaces cache of one kind, kept current by a watch."""

    def __init__(self, kind: str, client: KubeClient, list_fn: Callable[..., Any],
                 label_selector: str, clock: Clock, watch_timeout: int = 300,
                 tick: float = 0.1) -> None:
        self.kind = kind
        self._client = client
        self._list_fn = list_fn
        self._selector = label_selector
        self._clock = clock
        self._watch_timeout = max(1, int(watch_timeout))
        self._tick = tick
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._waiters: dict[Key, set[threading.Event]] = {}
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.lists = 0  # how often the cache was (re)built; tests and stats read it
        self.watches = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"k8s-watch-{self.kind}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        with self._lock:
            response = self._response
        if response is not None:
            _close(response)
        if self._thread is not None:
            self._thread.join(timeout)
        self._wake_all()

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    # -- waiting -----------------------------------------------------------------------------

    def wait(self, namespace: str, name: str, check: Check[T], deadline: float,
             cancel: threading.Event, what: str) -> T:
        """Block until `check(object)` returns a result, the deadline passes or `cancel`."""
        key = (namespace, name)
        woken = threading.Event()
        with self._lock:
            self._waiters.setdefault(key, set()).add(woken)
        try:
            while True:
                woken.clear()
                result = check(self.get(namespace, name))
                if result is not None:
                    return result
                if cancel.is_set():
                    raise LaunchError(f"cancelled while waiting for {what}", reason="Cancelled")
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise LaunchError(f"timed out waiting for {what}", reason="BootTimeout")
                if self._stopped.is_set():
                    raise LaunchError(f"provider stopped while waiting for {what}",
                                      reason="Cancelled")
                woken.wait(min(self._tick, remaining))
        finally:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiters[key]

    def _wake(self, key: Key) -> None:
        for event in list(self._waiters.get(key, ())):
            event.set()

    def _wake_all(self) -> None:
        with self._lock:
            for events in self._waiters.values():
                for event in events:
                    event.set()

    # -- the list+watch loop -----------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                version = self._relist()
                failures = 0
                while not self._stopped.is_set():
                    version = self._watch(version)
            except Gone as exc:
                log.debug("%s watch expired, listing again: %s", self.kind, exc)
            except Exception as exc:  # noqa: BLE001 - the loop must survive anything
                if self._stopped.is_set():
                    break
                delay = RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF) - 1)]
                failures += 1
                log.warning("%s watch failed (#%d), restarting in %.1fs: %s", self.kind,
                            failures, delay, exc)
                self._stopped.wait(delay)

    def _relist(self) -> str:
        body = self._client.call(f"list {self.kind}", self._list_fn,
                                 label_selector=self._selector,
                                 sleep=self._stopped.wait)
        self.lists += 1
        fresh = {object_key(item): item for item in body.get("items") or []}
        with self._lock:
            changed = set(self._objects) | set(fresh)
            self._objects = fresh
            for key in changed:
                self._wake(key)
        self._synced.set()
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """Apply events from `version` until the server ends the watch; the last version."""
        response = self._client.stream(
            f"watch {self.kind}", self._list_fn, label_selector=self._selector,
            resource_version=version or None, allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout, read_timeout=self._watch_timeout + 30)
        self.watches += 1
        with self._lock:
            self._response = response
        if self._stopped.is_set():
            _close(response)
        try:
            for event in iter_events(response):
                version = self._apply(event, version)
        except Gone:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream is a temporary problem
            if self._stopped.is_set():
                return version
            raise map_api_error(exc, f"watch {self.kind}") from exc
        finally:
            with self._lock:
                self._response = None
            response.release_conn()
        return version

    def _apply(self, event: dict[str, Any], version: str) -> str:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(f"watch {self.kind}: {obj.get('message', 'too old')}")
            raise TemporaryError(f"watch {self.kind}: error event {code}: "
                                 f"{obj.get('message', '')}")
        new_version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return new_version
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._objects[key] = obj
            self._wake(key)
        return new_version


def deletion_finished(response: dict[str, Any]) -> bool:
    """Whether a namespace DELETE response says the namespace is already gone.

    The API answers with a Status when the object was removed at once, and with the object
    itself (now Terminating, with a resourceVersion) when finalization is still running.
    """
    return response.get("kind") == "Status"


def resource_version(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def wait_namespace_gone(client: KubeClient, name: str, version: str, deadline: float,
                        clock: Clock) -> None:
    """Return once namespace `name` no longer exists; TemporaryError at the deadline.

    `version` is the resourceVersion of the DELETE response (the Terminating namespace), so
    no event between the delete and the watch is missed; "" lists that one name first (also
    the fallback after 410 Gone or a broken watch).
    """
    selector = f"metadata.name={name}"
    list_fn = client.core.list_namespace
    while True:
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            raise TemporaryError(f"namespace {name} still exists after its deletion timeout")
        try:
            if not version:
                body = client.call(f"list namespace {name}", list_fn, field_selector=selector)
                if not body.get("items"):
                    return
                version = resource_version(body)
            seconds = max(1, math.ceil(remaining))
            # The read timeout ends a quiet watch at our deadline even when the server's
            # (whole-second) timeout would run longer.
            response = client.stream(f"watch namespace {name}", list_fn,
                                     field_selector=selector, resource_version=version,
                                     timeout_seconds=seconds,
                                     read_timeout=min(seconds + 10.0, remaining + 0.05))
            try:
                for event in iter_events(response):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == 410:
                            raise Gone(str(obj.get("message", "")))
                        raise TemporaryError(f"watch namespace {name}: {obj.get('message')}")
                    if event.get("type") == "DELETED":
                        return
                    version = resource_version(obj) or version
            except (Gone, TemporaryError):
                raise
            except Exception as exc:  # noqa: BLE001 - a broken stream is temporary
                raise map_api_error(exc, f"watch namespace {name}") from exc
            finally:
                response.release_conn()
        except Gone:
            version = ""
        except NotFound:
            return
        except TemporaryError as exc:
            if clock.monotonic() >= deadline:
                raise
            log.info("still waiting for namespace %s to go: %s", name, exc)
            version = ""
            # Error backoff (not polling): the next list+watch starts after a short pause.
            threading.Event().wait(min(1.0, max(0.0, deadline - clock.monotonic())))
