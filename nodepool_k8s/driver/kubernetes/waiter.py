"""Event-driven waiting: shared list+watch caches, and watching one namespace disappear.

Owns: `ObjectWatch`, one background thread per (provider, resource kind) that lists every
object carrying the provider's ownership label across all namespaces (in pages of
`LIST_PAGE_SIZE`), then watches from the list's resourceVersion (with bookmarks) and keeps
the latest copy of each object it is told to keep (`keep`: the provider keeps only what it
created; anything else is dropped where it arrives) as a slim copy (`slim`: only the fields
the driver reads), within bounds: a copy above `MAX_OBJECT_BYTES` and copies of new names
past `MAX_OBJECTS` are not kept (counted in `refused`, logged at WARNING at most every
`REPEAT_LOG_INTERVAL`). What a job writes into its namespace so costs the launcher the
time to decode it, not memory. Launches
block in `ObjectWatch.wait` until their object satisfies a check; they are woken by events
for their own object only, so a launch costs no API calls while it waits. The namespace watch
also keeps tombstones (uids of recently deleted namespaces), and `wait_namespace_deleted`
confirms a deletion through it: no API call unless the watch cannot answer, then one read.
`ObjectWatch.notify_gone` tells a caller when an object leaves the cache without any thread
waiting for it (the deleter's many Terminating namespaces); `ObjectWatch.add_listener` tells of
every change of the cache at all (what tests and diagnostics wait on instead of polling).
`wait_namespace_gone` watches one namespace by name (field selector) until it is deleted: the
fallback for a namespace without our labels, which the shared watch never sees.

How it fails: a watch that ends is resumed from the last resourceVersion; 410 Gone (or an
ERROR event with code 410, or a list's continue token the server has compacted away)
triggers a fresh list that replaces the cache (objects missing from it count as deleted);
any other error is logged and the list+watch is restarted after a
backoff (refused credentials only at DEBUG: `credentials` reports those once for the whole
provider). The backoff grows with consecutive failures and is only reset by a watch that
delivered events and lasted `MIN_HEALTHY_WATCH` seconds: a watch that fails while the list
succeeds (e.g. watch forbidden, list allowed) does not relist every 0.2 s forever, and
neither does a server that ends every watch at once, with or without an event first. One
event line may be at most `MAX_EVENT_BYTES`; the stream is read `READ_BYTES` at a time.
`wait` raises BootTimeout at its deadline and LaunchCancelled as soon as `cancel` is set;
the check itself may raise LaunchError to fail early. Nothing is polled: a waiter sleeps
until an event for its object, the provider's stop, its cancel event (a `CancelEvent` wakes
it; the core always passes one), its deadline, or the time its check asks to be run again
(`recheck_in`: the unschedulable grace, the namespace wait's `ask_after`). Only a plain
`threading.Event` as cancel (some tests and callers) or an explicit `tick` (tests on a
`ManualClock`, whose time moves without waking anyone) makes a waiter also look every
`tick` (default `PLAIN_EVENT_TICK`) seconds.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, TypeVar

from nodepool_k8s.core import records
from nodepool_k8s.runtime.cancel import CancelEvent
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.driver.kubernetes.client import KubeClient
from nodepool_k8s.driver.kubernetes.errors import Gone, map_api_error
from nodepool_k8s.driver.kubernetes.slim import encoded_size
from nodepool_k8s.core.errors import (BootTimeout, LaunchCancelled, LaunchError, NotFound,
                                      ProviderUnavailable, TemporaryError)

log = logging.getLogger(__name__)

T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)
Check = Callable[[dict[str, Any] | None], T | None]
"""Inspects the cached object (None if not seen): a result ends the wait, None keeps waiting."""


class _Wakeable(Protocol):
    def set(self) -> None: ...


class _GoneNotice:
    """A one-shot `notify_gone` listener, woken like a waiter (under the watch's lock)."""

    def __init__(self, watch: "ObjectWatch", key: Key, uid: str,
                 fn: Callable[[], None]) -> None:
        self._watch, self._key, self._uid, self._fn = watch, key, uid, fn
        self._fired = False

    def repeats(self, uid: str, fn: Callable[[], None]) -> bool:
        """Whether registering `fn` for `uid` again would ask for what this notice does."""
        return not self._fired and self._uid == uid and self._fn == fn

    def set(self) -> None:
        current = self._watch._objects.get(self._key)
        if self._fired or (current is not None and object_uid(current) == self._uid
                           and not self._watch._stopped.is_set()):
            return
        self._fired = True
        waiters = self._watch._waiters.get(self._key)
        if waiters is not None:
            waiters.discard(self)
            if not waiters:
                del self._watch._waiters[self._key]
        try:
            self._fn()
        except Exception:  # noqa: BLE001 - a listener must not break the watch
            log.exception("%s watch: gone listener failed", self._watch.kind)


RESTART_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A watch event is one object (a pod is a few KB); a line this long is garbage or an attack.
MAX_EVENT_BYTES = 4 * 1024 * 1024
# A watch must have lasted this long (and delivered events) to count as healthy and reset
# the restart backoff: a server (or proxy) that sends one event, a bookmark say, and ends
# every watch at once would otherwise be re-watched many times a second.
MIN_HEALTHY_WATCH = 5.0
# What one read of a watch stream may return: a server's chunk of any size is taken in
# pieces, so memory stays bounded by MAX_EVENT_BYTES plus this, not by the chunk.
READ_BYTES = 65536
# How often a waiter whose cancel event cannot wake it (a plain threading.Event) looks at it.
PLAIN_EVENT_TICK = 0.1
# A watch failing the same way again (RBAC cut, say) is logged at WARNING once, then at most
# this often; every round is at DEBUG. A new error text, or a recovery, is logged at once.
REPEAT_LOG_INTERVAL = 600.0
# Objects per page of a (re)list: what one page costs in memory while it is decoded is
# this many objects as the server sends them (annotations and all), not slim copies.
LIST_PAGE_SIZE = 100
# The largest slim copy a cache keeps (compact JSON bytes); a larger one is not kept.
MAX_OBJECT_BYTES = 64 * 1024
# The most objects one cache holds; past it, objects of new names are not kept.
MAX_OBJECTS = 50_000


def restart_delay(failures: int) -> float:
    """The pause before the next list+watch after `failures` consecutive failures."""
    return RESTART_BACKOFF[min(failures, len(RESTART_BACKOFF) - 1)]


def metadata(obj: Any) -> dict[str, Any]:
    """`obj`'s metadata; {} when the server sent something else (a list, a string): API
    answers are data from outside, read with this instead of trusting their shape."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def object_uid(obj: dict[str, Any]) -> str:
    return str(metadata(obj).get("uid") or "")


def object_key(obj: dict[str, Any]) -> Key:
    meta = metadata(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def iter_events(response: Any) -> Iterator[dict[str, Any]]:
    """Decoded watch events from a streaming urllib3 response (one JSON object per line)."""
    buffer = b""
    chunks: Iterator[bytes]
    if getattr(response, "chunked", False):
        # At most READ_BYTES of the current chunk per read (a small chunk, one event, is
        # returned whole and at once): a huge chunk is never held whole in memory.
        chunks = response.stream(READ_BYTES, decode_content=True)
    else:
        chunks = iter(lambda: response.read1(READ_BYTES), b"")
    for chunk in chunks:
        buffer += chunk
        if b"\n" in chunk:
            # All complete lines at once: splitting one line off at a time copied the
            # rest of the buffer per line (a chunk of newlines spun a core for minutes).
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)
        if len(buffer) > MAX_EVENT_BYTES:
            raise TemporaryError(f"watch event longer than {MAX_EVENT_BYTES} bytes")
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
                 tick: float | None = None, tombstones: int = 0,
                 owned: Callable[[dict[str, Any]], bool] | None = None,
                 on_change: Callable[[dict[str, Any] | None, dict[str, Any] | None], None]
                 | None = None, *, slim: Callable[[dict[str, Any]], dict[str, Any]],
                 keep: Callable[[dict[str, Any]], bool] | None = None,
                 page_size: int = LIST_PAGE_SIZE, max_objects: int = MAX_OBJECTS,
                 max_object_bytes: int = MAX_OBJECT_BYTES) -> None:
        """`on_change(old, new)`: called (outside the lock, on the watch thread) after every
        applied ADDED/MODIFIED/DELETED event, and with (None, None) after every (re)list.
        `tombstones`: remember the uids of up to this many deleted objects (0: none), so
        a waiter that arrives after the DELETED event can still tell the object is gone.
        `owned`: whether an object still carries the selected labels (a DELETED event for
        one that does not only means it left the selector, not that it is gone).
        `slim`: the copy of an object that is kept (see `slim`); `keep`: whether an object
        (as the server sent it) is kept at all (None: everything the selector returns).
        An object not kept is dropped where it arrives, as if the selector had not
        matched it: never stored, never passed to waiters or `on_change`. Lists are read
        `page_size` objects at a time; at most `max_objects` copies of at most
        `max_object_bytes` are kept (see `_admit`)."""
        self.kind = kind
        self._client = client
        self._list_fn = list_fn
        self._selector = label_selector
        self._clock = clock
        self._watch_timeout = max(1, int(watch_timeout))
        self._tick = tick
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._waiters: dict[Key, set[_Wakeable]] = {}
        # key -> (uid, confirmed): confirmed = a DELETED event of an object still labelled
        # ours; unconfirmed = left the selector, or missing from a re-list (gone or relabelled).
        self._tombstones: OrderedDict[Key, tuple[str, bool]] = OrderedDict()
        self._max_tombstones = max(0, int(tombstones))
        self._owned = owned
        self._on_change = on_change
        # Replaced, never changed in place: the watch thread iterates without a lock.
        self._listeners: tuple[Callable[[], None], ...] = ()
        self._slim = slim
        self._keep = keep
        self._page_size = max(1, int(page_size))
        self._max_objects = max(1, int(max_objects))
        self._max_object_bytes = max(1, int(max_object_bytes))
        self._refusal_logged: dict[str, float] = {}  # why -> when last logged at WARNING
        self._stopped = threading.Event()
        self._synced = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self.lists = 0  # how often the cache was (re)built; tests and stats read it
        self.events = 0  # watch events applied (bookmarks included): progress
        self.watches = 0
        self.dropped = 0  # objects not kept: not ours (`keep`)
        self.refused = 0  # objects ours but not kept: too large, or the cache is full

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

    def objects(self) -> list[dict[str, Any]]:
        """A snapshot of every cached object."""
        with self._lock:
            return list(self._objects.values())

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call `listener()` on the watch thread, outside the lock, after every change a
        reader of this watch can see: an applied event (after `on_change`), a (re)list, a
        watch request answered. It must be quick (set an event): what waits on the watch
        without being one object's waiter (the tests, diagnostics) sleeps on it instead of
        polling."""
        with self._lock:
            self._listeners = self._listeners + (listener,)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners = tuple(fn for fn in self._listeners if fn != listener)

    def _tell(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener must not break the watch
                log.exception("%s watch: listener failed", self.kind)

    def _changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if self._on_change is not None:
            try:
                self._on_change(old, new)
            except Exception:  # noqa: BLE001 - a listener must not break the watch
                log.exception("%s watch: change listener failed", self.kind)
        self._tell()

    def tombstone(self, namespace: str, name: str) -> tuple[str, bool] | None:
        """(uid, confirmed) of the last deletion of (namespace, name) seen, if remembered."""
        with self._lock:
            return self._tombstones.get((namespace, name))

    def owns(self, obj: dict[str, Any]) -> bool:
        """Whether this watch reports `obj`: selected (`owned`) and kept (`keep`)."""
        return (self._owned is None or bool(self._owned(obj))) \
            and (self._keep is None or bool(self._keep(obj)))

    def _admit(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The slim copy of `obj` to keep, or None: not ours (`keep`), or its copy is
        larger than `max_object_bytes`. Called outside the lock (`keep` may read another
        watch)."""
        try:
            kept = self._keep is None or bool(self._keep(obj))
        except Exception as exc:  # noqa: BLE001 - a predicate that fails keeps nothing
            self._log_limited("predicate", "%s watch: not keeping an object the predicate "
                              "cannot judge: %r", self.kind, exc)
            kept = False
        if not kept:
            self.dropped += 1
            return None
        copy = self._slim(obj)
        size = encoded_size(copy)
        if size > self._max_object_bytes:
            namespace, name = object_key(copy)
            self._refuse("large", f"%s watch: not keeping %s/%s: %d bytes even slimmed, more "
                         f"than {self._max_object_bytes}", self.kind,
                         records.clip(namespace), records.clip(name), size)
            return None
        return copy

    def _refuse(self, why: str, message: str, *args: Any) -> None:
        """Count a refused object and log it (`_log_limited`)."""
        self.refused += 1
        self._log_limited(why, message + " (%d refused so far)", *args, self.refused)

    def _log_limited(self, why: str, message: str, *args: Any) -> None:
        """Log at WARNING at most every REPEAT_LOG_INTERVAL per `why`, else at DEBUG: a
        flood of objects is one line, not one per object."""
        now = self._clock.monotonic()
        last = self._refusal_logged.get(why)
        level = logging.DEBUG
        if last is None or now - last >= REPEAT_LOG_INTERVAL:
            self._refusal_logged[why] = now
            level = logging.WARNING
        log.log(level, message, *args)

    def _full(self, size: int, key: Key) -> bool:
        """Whether a copy for a new `key` would exceed `max_objects` (and log that)."""
        if size < self._max_objects:
            return False
        self._refuse("full", "%s watch: not keeping %s/%s: the cache holds its maximum of"
                     " %d objects", self.kind, records.clip(key[0]), records.clip(key[1]),
                     self._max_objects)
        return True

    def _bury(self, key: Key, obj: dict[str, Any], confirmed: bool) -> None:
        """Remember a deletion (lock held)."""
        if not self._max_tombstones:
            return
        self._tombstones.pop(key, None)
        self._tombstones[key] = (object_uid(obj), confirmed)
        while len(self._tombstones) > self._max_tombstones:
            self._tombstones.popitem(last=False)

    # -- waiting -----------------------------------------------------------------------------

    def wait(self, namespace: str, name: str, check: Check[T], deadline: float,
             cancel: threading.Event, what: str,
             recheck_in: Callable[[], float | None] | None = None) -> T:
        """Block until `check(object)` returns a result, the deadline passes or `cancel`.

        `recheck_in()`, for a check whose answer changes with time alone (a grace period),
        says in how many seconds to run the check again without an event (None: only on
        events); asked after every check that returned None."""
        key = (namespace, name)
        woken = threading.Event()
        with self._lock:
            self._waiters.setdefault(key, set()).add(woken)
        unsubscribe: Callable[[], None] | None = None
        tick = self._tick
        if isinstance(cancel, CancelEvent):
            unsubscribe = cancel.subscribe(woken.set)
        elif tick is None:
            tick = PLAIN_EVENT_TICK
        try:
            while True:
                woken.clear()
                result = check(self.get(namespace, name))
                if result is not None:
                    return result
                if cancel.is_set():
                    raise LaunchCancelled(f"cancelled while waiting for {what}")
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    raise BootTimeout(f"timed out waiting for {what}")
                if self._stopped.is_set():
                    raise LaunchCancelled(f"provider stopped while waiting for {what}")
                sleep = remaining if tick is None else min(tick, remaining)
                again = recheck_in() if recheck_in is not None else None
                if again is not None:
                    sleep = min(sleep, max(again, 0.001))
                woken.wait(sleep)
        finally:
            if unsubscribe is not None:
                unsubscribe()
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiters[key]

    def notify_gone(self, namespace: str, name: str, uid: str,
                    fn: Callable[[], None]) -> bool:
        """Call `fn()` once when the cached object of `uid` leaves the cache (a DELETED
        event, a re-list without it, or another object of that name), or when this watch
        stops (it will tell nothing more; the caller asks again): no thread waits.

        `fn` runs on the watch thread with the watch's lock held: it must only hand work
        on (submit, set an event), never block or call back into this watch. False, with
        nothing registered, when the watch cannot tell: not synced, or it holds no copy
        of that uid (the caller then waits or asks the API itself).

        Registering an equal `fn` for the same uid again adds nothing: a deletion that is
        asked about again and again (a namespace stuck Terminating past its timeout) keeps
        one notice, not one more per round for as long as it stays."""
        key = (namespace, name)
        with self._lock:
            current = self._objects.get(key)
            if not self._synced.is_set() or current is None or object_uid(current) != uid:
                return False
            waiting = self._waiters.setdefault(key, set())
            if not any(isinstance(w, _GoneNotice) and w.repeats(uid, fn) for w in waiting):
                waiting.add(_GoneNotice(self, key, uid, fn))
            return True

    def _wake(self, key: Key) -> None:
        for event in list(self._waiters.get(key, ())):
            event.set()

    def _wake_all(self) -> None:
        with self._lock:
            # Copies: a `_GoneNotice` that fires takes itself out of these.
            for events in list(self._waiters.values()):
                for event in list(events):
                    event.set()

    # -- the list+watch loop -----------------------------------------------------------------

    def _run(self) -> None:
        # Consecutive list+watch rounds without progress. Only a watch that delivered
        # events resets it (a successful list alone does not: see the module docstring).
        failures = 0
        reported: tuple[str, float] | None = None  # the failure last told at WARNING, when
        while not self._stopped.is_set():
            try:
                version = self._relist()
                while not self._stopped.is_set():
                    before, started = self.events, self._clock.monotonic()
                    version = self._watch(version)
                    if self.events > before \
                            and self._clock.monotonic() - started >= MIN_HEALTHY_WATCH:
                        if reported is not None:
                            log.info("%s watch works again after %d failed round(s)",
                                     self.kind, failures)
                            reported = None
                        failures = 0
                    else:  # ended (almost) at once: do not hammer the server
                        delay = restart_delay(failures)
                        failures += 1
                        if failures == len(RESTART_BACKOFF):  # once, when it gets slow
                            log.warning("%s watch keeps ending at once; restarting it every"
                                        " %.0fs at most", self.kind, RESTART_BACKOFF[-1])
                        self._stopped.wait(delay)
            except Gone as exc:
                log.debug("%s watch expired, listing again: %s", self.kind, exc)
                if failures:  # repeated 410s: the same backoff as any failure
                    self._stopped.wait(restart_delay(failures))
                failures += 1
            except Exception as exc:  # noqa: BLE001 - the loop must survive anything
                if self._stopped.is_set():
                    break
                delay = restart_delay(failures)
                failures += 1
                text, now = str(exc), self._clock.monotonic()
                level = logging.DEBUG
                if isinstance(exc, ProviderUnavailable):
                    pass  # refused credentials: reported once by the client, not per watch
                elif reported is None or reported[0] != text \
                        or now - reported[1] >= REPEAT_LOG_INTERVAL:
                    level, reported = logging.WARNING, (text, now)
                log.log(level, "%s watch failed (#%d), restarting in %.1fs: %s", self.kind,
                        failures, delay, exc)
                self._stopped.wait(delay)

    def _relist(self) -> str:
        """Replace the cache with a fresh list, read page by page (`limit` + `continue`);
        the resourceVersion to watch from is the first page's (the server's snapshot: all
        pages name it). A continue token the server no longer knows (410 Expired) raises
        Gone: `_run` lists again from the start."""
        fresh: dict[Key, dict[str, Any]] = {}
        version = ""
        token = ""
        while True:
            kwargs: dict[str, Any] = {"label_selector": self._selector,
                                      "limit": self._page_size}
            if token:
                kwargs["_continue"] = token
            body = self._client.call(f"list {self.kind}", self._list_fn,
                                     sleep=self._stopped.wait, **kwargs)
            version = version or resource_version(body)
            items = body.get("items")
            # Only objects: anything else would sit in the cache for its readers to trip on.
            for item in items if isinstance(items, list) else ():
                if not isinstance(item, dict):
                    continue
                copy = self._admit(item)
                if copy is None:
                    continue
                key = object_key(copy)
                if key not in fresh and self._full(len(fresh), key):
                    continue
                fresh[key] = copy
            token = metadata(body).get("continue") or ""
            # This page's objects as sent (annotations and all) go before the next is read.
            del body, items
            if not isinstance(token, str) or not token:
                break
            if self._stopped.is_set():
                raise TemporaryError(f"list {self.kind}: stopped between pages")
        with self._lock:
            changed = set(self._objects) | set(fresh)
            for key, old in self._objects.items():
                if key not in fresh:
                    self._bury(key, old, confirmed=False)
            self._objects = fresh
            self.lists += 1
            for key in changed:
                self._wake(key)
        self._synced.set()
        self._changed(None, None)
        return version

    def _watch(self, version: str) -> str:
        """Apply events from `version` until the server ends the watch; the last version."""
        response = self._client.stream(
            f"watch {self.kind}", self._list_fn, label_selector=self._selector,
            resource_version=version or None, allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout, read_timeout=self._watch_timeout + 30)
        self.watches += 1
        with self._lock:
            self._response = response
        self._tell()
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
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(obj, dict):
            # Not an event about an object: the stream cannot be trusted; list again.
            raise TemporaryError(f"watch {self.kind}: an event without an object "
                                 f"(type {records.clip(repr(kind))})")
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise Gone(f"watch {self.kind}: {obj.get('message', 'too old')}")
            raise TemporaryError(f"watch {self.kind}: error event {code}: "
                                 f"{obj.get('message', '')}")
        new_version = resource_version(obj) or version
        self.events += 1
        if kind == "BOOKMARK":
            return new_version
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return new_version
        key = object_key(obj)
        # Both judged outside the lock: `keep` may take other locks (another watch's).
        copy = self._admit(obj) if kind != "DELETED" else None
        confirmed = kind == "DELETED" and self.owns(obj)
        with self._lock:
            old = self._objects.get(key)
            if copy is None:
                if old is None:
                    # Never kept (not ours, too large), or a deletion of such: nothing to
                    # store, bury or tell anyone about.
                    return new_version
                # Deleted, or no longer kept: treated like leaving the selector.
                self._objects.pop(key, None)
                self._bury(key, obj, confirmed=confirmed)
            elif old is not None or not self._full(len(self._objects), key):
                self._objects[key] = copy
            else:
                return new_version
            self._wake(key)
        self._changed(old, copy)
        return new_version


def deletion_finished(response: dict[str, Any]) -> bool:
    """Whether a namespace DELETE response says the namespace is already gone.

    The API answers with a Status when the object was removed at once, and with the object
    itself (now Terminating, with a resourceVersion) when finalization is still running.
    """
    return response.get("kind") == "Status"


def resource_version(obj: dict[str, Any]) -> str:
    return str(metadata(obj).get("resourceVersion") or "")


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


# How long a waiter trusts a synced watch that has not (yet) seen a namespace before it reads
# the namespace once: the watch normally trails the API by milliseconds.
ASK_AFTER = 1.0
_GONE = "gone"
_ASK = "ask"
_NEVER = CancelEvent()  # never set; a CancelEvent, so waiting on it does not tick


@dataclass
class _DeletionWait:
    """What `wait_namespace_deleted` knows so far about the namespace it waits for."""

    uid: str | None  # the namespace's uid (None: not known yet, e.g. after a 409)
    since: float  # time.monotonic() when the wait began
    asked: int | None = None  # `watch.lists` when the namespace was last read directly


def wait_namespace_deleted(watch: ObjectWatch, client: KubeClient, name: str,
                           uid: str | None, deadline: float, clock: Clock,
                           ask_after: float = ASK_AFTER) -> None:
    """Return once namespace `name` is gone, as seen by the shared namespace `watch`.

    `uid` is the namespace's uid from the DELETE response (None after a 409: whichever
    namespace of that name is Terminating). Gone means: a DELETED event of that uid (also one
    that arrived before this call: the watch keeps tombstones), or a namespace of that name
    with another uid. When the watch cannot answer (not synced, has not seen the namespace
    within `ask_after`, re-listed without it, or no uid is known) the namespace is read once
    (again only after a further re-list): 404 or another uid is gone; a namespace without
    our labels, which the watch never reports, is confirmed by `wait_namespace_gone`.
    TemporaryError at the deadline, or when the watch stops.
    """
    state = _DeletionWait(uid=uid or None, since=time.monotonic())

    def check(obj: dict[str, Any] | None) -> str | None:
        if obj is not None:
            if state.uid is None and (obj.get("metadata") or {}).get("deletionTimestamp"):
                state.uid = object_uid(obj)
            if state.uid is not None:
                return None if object_uid(obj) == state.uid else _GONE
        else:
            tomb = watch.tombstone("", name)
            if state.uid is not None and tomb == (state.uid, True):
                return _GONE
        if state.asked is not None:
            # The read showed it exists: the watch will report it, unless it re-lists.
            return _ASK if watch.lists > state.asked and obj is None else None
        if obj is None and watch.synced and time.monotonic() - state.since < ask_after:
            return None  # the watch probably trails the API by a few milliseconds
        return _ASK

    def recheck_in() -> float | None:
        """Until `ask_after` has passed, check again then even without an event."""
        if state.asked is not None:
            return None
        return state.since + ask_after - time.monotonic()

    while True:
        try:
            verdict = watch.wait("", name, check, deadline, _NEVER,
                                 what=f"namespace {name} to go", recheck_in=recheck_in)
        except BootTimeout as exc:
            raise TemporaryError(
                f"namespace {name} still exists after its deletion timeout") from exc
        except LaunchError as exc:
            raise TemporaryError(f"stopped waiting for namespace {name} to go: {exc}") from exc
        if verdict == _GONE:
            return
        state.asked = watch.lists
        try:
            obj = client.call(f"read namespace {name}", client.core.read_namespace, name)
        except NotFound:
            return
        if state.uid is not None and object_uid(obj) != state.uid:
            return  # ours is gone; this one is a newer namespace of the same name
        state.uid = object_uid(obj)
        if not watch.owns(obj):
            # Not labelled ours (a name collision): the shared watch never reports it.
            log.info("namespace %s is not labelled for provider watch; watching it alone", name)
            wait_namespace_gone(client, name, resource_version(obj), deadline, clock)
            return
