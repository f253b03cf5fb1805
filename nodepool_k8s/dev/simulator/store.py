"""The object store: objects by resource and (namespace, name), resourceVersions, watch fan-out.

Owns: the one global resourceVersion counter, system metadata (uid, resourceVersion,
creationTimestamp, generation), a bounded history of change events (so watches can resume
from a resourceVersion) and the per-watcher queues that fan events out.

Concurrency: one re-entrant lock guards everything; callers that need check-then-act (e.g.
"namespace exists and is not terminating, then create") hold `store.lock` around both.
Stored dicts are never modified after insertion (every change stores a new dict), so readers
may serialize them outside the lock; callers must treat returned objects as read-only, and
`Simulator` hands deep copies to users. Listeners (the controllers; watch-count listeners) are
called under the lock and must only schedule work, never block.

Finalizers: `delete_or_mark` removes an object only when its `metadata.finalizers` is empty;
otherwise it sets `deletionTimestamp` and keeps it (readable, updatable). An update of a
deleting object that leaves `finalizers` empty removes it (one DELETED event, as the real
registry deletes during such an update); adding a finalizer to a deleting object is refused.

Failure modes: `ApiError` 404/409 (missing object, name taken, resourceVersion conflict), 422
(a new finalizer on a deleting object) and 410 Expired for a watch (or a list's continue token)
that asks for history older than the retained window.
"""

from __future__ import annotations

import builtins
import os
import secrets
import socket
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.data import clone
from nodepool_k8s.dev.simulator.resources import STORED, ResourceType

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
Matcher = Callable[[Obj], bool]

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
# Kinds whose metadata.generation counts spec changes.
_GENERATION_KINDS = frozenset({"pods"})
_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the real server uses


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def finalizers(obj: Obj) -> list[str]:
    """`metadata.finalizers` as a list of strings (what holds a deleted object back)."""
    found = obj.get("metadata", {}).get("finalizers") or []
    return [str(f) for f in found] if isinstance(found, list) else []


def held_back(resource: str, obj: Obj) -> bool:
    """Whether a deleting object must stay: finalizers remain, or (a pod) its kubelet has
    not yet finished the grace period (`deletionGracePeriodSeconds` > 0)."""
    if finalizers(obj):
        return True
    return resource == "pods" and bool(obj["metadata"].get("deletionGracePeriodSeconds"))


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    resource: str
    obj: Obj          # the object after the change (for DELETED: its last state, new rv)
    old: Obj | None   # the object before the change (None for ADDED)


class Watcher:
    """One watch's queue of (type, object) pairs, with a socket to wake a select() loop.

    The wake socket lets the HTTP thread wait for "new events" and "client went away" in one
    select() call instead of polling.
    """

    def __init__(self, store: "Store", resource: str, namespace: str | None,
                 matcher: Matcher) -> None:
        self.store = store
        self.resource = resource
        self.namespace = namespace
        self.matcher = matcher
        self._queue: deque[tuple[str, Obj]] = deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.closed = False

    def _in_scope(self, obj: Obj) -> bool:
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        return self.matcher(obj)

    def offer(self, event: Event) -> None:
        """Queue `event` as this watch sees it (called with the store lock held)."""
        if event.resource != self.resource or self.closed:
            return
        if event.type == DELETED:
            if self._in_scope(event.obj):
                self._push(DELETED, event.obj)
            return
        now_in = self._in_scope(event.obj)
        was_in = event.old is not None and self._in_scope(event.old)
        # Objects moving in or out of a selector show up as ADDED/DELETED, as in the real
        # server's watch cache.
        if now_in and was_in:
            self._push(MODIFIED, event.obj)
        elif now_in:
            self._push(ADDED, event.obj)
        elif was_in and event.old is not None:
            gone = clone(event.old)
            gone["metadata"]["resourceVersion"] = str(event.rv)
            self._push(DELETED, gone)

    def _push(self, kind: str, obj: Obj) -> None:
        self._queue.append((kind, obj))
        self.wake()

    def wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # buffer full (a wake-up is pending anyway) or already closed

    def fileno(self) -> int:
        return self._wake_r.fileno()

    def clear_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def drain(self) -> tuple[list[tuple[str, Obj]], int]:
        """Everything queued so far and the resourceVersion it brings the watch up to."""
        with self.store.lock:
            events = list(self._queue)
            self._queue.clear()
            return events, self.store.current_rv

    def close(self) -> None:
        self.closed = True
        self.wake()

    def release(self) -> None:
        """Unregister and free the wake sockets (by the thread serving the watch; idempotent)."""
        self.closed = True
        self.store.remove_watcher(self)
        self._wake_r.close()
        self._wake_w.close()


class Store:
    def __init__(self, history_size: int = 1000) -> None:
        self.lock = threading.RLock()
        self._objects: dict[str, dict[Key, Obj]] = {plural: {} for plural in STORED}
        self._rv = 0
        self._history: deque[Event] = deque(maxlen=max(1, history_size))
        self._compacted_rv = 0
        self._watchers: set[Watcher] = set()
        self._listeners: list[Callable[[Event], None]] = []
        self._watch_listeners: list[Callable[[int], None]] = []

    # -- reads ------------------------------------------------------------------------------
    @property
    def current_rv(self) -> int:
        return self._rv

    @property
    def compacted_rv(self) -> int:
        """History up to this resourceVersion is gone: older watches and continues get 410."""
        return self._compacted_rv

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        with self.lock:
            return self._objects[resource].get((namespace or "", name))

    def require(self, resource: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.get(resource.plural, namespace, name)
        if obj is None:
            raise errors.not_found(resource.plural, name, resource.group)
        return obj

    def list(self, resource: str, namespace: str | None = None,
             matcher: Matcher | None = None) -> tuple[list[Obj], int]:
        """Matching objects sorted by (namespace, name), and the resourceVersion of the list."""
        with self.lock:
            items = [obj for key, obj in sorted(self._objects[resource].items())
                     if (namespace is None or key[0] == namespace)
                     and (matcher is None or matcher(obj))]
            return items, self._rv

    def namespaced_keys(self, namespace: str) -> builtins.list[tuple[str, str]]:
        """(resource, name) of every object stored in `namespace`."""
        with self.lock:
            return [(resource, key[1]) for resource, objs in self._objects.items()
                    for key in objs if key[0] == namespace]

    # -- writes -----------------------------------------------------------------------------
    def create(self, resource: ResourceType, obj: Obj) -> Obj:
        """Store a new object (a private copy is taken) and return the stored version."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            table = self._objects[resource.plural]
            namespace = meta.get("namespace") or ""
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generated_name(table, namespace, meta["generateName"])
            if (namespace, meta["name"]) in table:
                raise errors.already_exists(resource.plural, meta["name"], resource.group)
            obj["kind"] = resource.kind
            obj["apiVersion"] = resource.api_version
            for system_field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(system_field, None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            if resource.plural in _GENERATION_KINDS:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            self._commit(resource.plural, ADDED, obj, None)
            return obj

    def replace(self, resource: ResourceType, obj: Obj,
                expect_rv: str | None = None) -> Obj:
        """Replace an existing object. System metadata is kept; `expect_rv` guards races."""
        obj = clone(obj)
        meta = obj.setdefault("metadata", {})
        with self.lock:
            key = (meta.get("namespace") or "", meta["name"])
            old = self._objects[resource.plural].get(key)
            if old is None:
                raise errors.not_found(resource.plural, meta["name"], resource.group)
            if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
                raise errors.conflict(resource.plural, meta["name"], resource.group)
            old_meta = old["metadata"]
            obj["kind"] = resource.kind
            obj["apiVersion"] = resource.api_version
            for system_field in ("uid", "creationTimestamp", "deletionTimestamp",
                                 "deletionGracePeriodSeconds"):
                if system_field in old_meta:
                    meta[system_field] = old_meta[system_field]
                else:
                    meta.pop(system_field, None)
            if resource.plural in _GENERATION_KINDS:
                generation = old_meta.get("generation", 1)
                if obj.get("spec") != old.get("spec"):
                    generation += 1
                meta["generation"] = generation
            else:
                meta.pop("generation", None)
            if obj == old:
                return old  # a no-op update does not bump the resourceVersion
            if old_meta.get("deletionTimestamp"):
                added = [f for f in finalizers(obj) if f not in finalizers(old)]
                if added:
                    raise errors.invalid(resource.kind, meta["name"], [(
                        "metadata.finalizers", "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being "
                        f"deleted, found new finalizers {added!r}")], resource.group)
                if not held_back(resource.plural, obj):
                    # The last finalizer went: the update completes the deletion.
                    return self._commit(resource.plural, DELETED, obj, old)
            self._commit(resource.plural, MODIFIED, obj, old)
            return obj

    def mutate(self, resource: ResourceType, namespace: str | None, name: str,
               change: Callable[[Obj], Any], uid: str | None = None) -> Obj | None:
        """Read-modify-write for controllers: `change` edits a private copy in place.

        Returns the stored result, or None when the object is gone or was replaced by a
        different one (uid mismatch), which is how controllers notice they are late.
        """
        with self.lock:
            current = self.get(resource.plural, namespace, name)
            if current is None or (uid and current["metadata"]["uid"] != uid):
                return None
            draft = clone(current)
            change(draft)
            if draft == current:
                return current
            return self._commit(resource.plural, MODIFIED, draft, current)

    def delete(self, resource: ResourceType, namespace: str | None, name: str,
               uid: str | None = None) -> Obj:
        """Remove an object; the returned (and DELETED-event) copy carries a new rv."""
        with self.lock:
            key = (namespace or "", name)
            old = self._objects[resource.plural].get(key)
            if old is None or (uid and old["metadata"]["uid"] != uid):
                raise errors.not_found(resource.plural, name, resource.group)
            gone = clone(old)
            self._commit(resource.plural, DELETED, gone, old)
            return gone

    def delete_or_mark(self, resource: ResourceType, namespace: str | None, name: str,
                       uid: str | None = None) -> tuple[Obj, bool]:
        """Delete an object unless finalizers hold it: then set its `deletionTimestamp`
        (once) and keep it. (the object as stored or as removed, whether it was removed)"""
        with self.lock:
            current = self.get(resource.plural, namespace, name)
            if current is None or (uid and current["metadata"]["uid"] != uid):
                raise errors.not_found(resource.plural, name, resource.group)
            if not finalizers(current):
                return self.delete(resource, namespace, name, uid), True
            if current["metadata"].get("deletionTimestamp") and not current["metadata"].get(
                    "deletionGracePeriodSeconds"):
                return current, False

            def mark(draft: Obj) -> None:
                draft["metadata"].setdefault("deletionTimestamp", now_rfc3339())
                draft["metadata"]["deletionGracePeriodSeconds"] = 0
            marked = self.mutate(resource, namespace, name, mark, uid)
            assert marked is not None  # checked under the same lock hold
            return marked, False

    def _commit(self, resource: str, kind: str, obj: Obj, old: Obj | None) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        table = self._objects[resource]
        if kind == DELETED:
            del table[key_of(obj)]
        else:
            table[key_of(obj)] = obj
        event = Event(self._rv, kind, resource, obj, old)
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].rv
        self._history.append(event)
        for watcher in self._watchers:
            watcher.offer(event)
        for listener in self._listeners:
            listener(event)
        return obj

    def _generated_name(self, table: dict[Key, Obj], namespace: str, prefix: str) -> str:
        # The real server appends 5 random characters and retries on collision.
        for _ in range(100):
            name = prefix + "".join(secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5))
            if (namespace, name) not in table:
                return name
        return prefix + os.urandom(8).hex()

    # -- watching ---------------------------------------------------------------------------
    def subscribe(self, listener: Callable[[Event], None]) -> None:
        """Call `listener(event)` (under the lock) for every change from now on."""
        with self.lock:
            self._listeners.append(listener)

    def subscribe_watchers(self, listener: Callable[[int], None]) -> None:
        """Call `listener(count)` (under the lock) whenever a watch opens or ends."""
        with self.lock:
            self._watch_listeners.append(listener)

    def _watchers_changed(self) -> None:
        for listener in self._watch_listeners:
            listener(len(self._watchers))

    def watch(self, resource: str, namespace: str | None, matcher: Matcher,
              since_rv: int | None, initial: bool) -> Watcher:
        """Register a watch.

        `initial=True` queues synthetic ADDED events for every matching object first (what
        the real server does for resourceVersion "" or "0"); otherwise the history after
        `since_rv` is replayed. Registration and the snapshot happen under one lock hold, so
        no change can fall between them.
        """
        with self.lock:
            watcher = Watcher(self, resource, namespace, matcher)
            if initial:
                items, _ = self.list(resource, namespace, matcher)
                for obj in items:
                    watcher._push(ADDED, obj)
            elif since_rv is not None:
                if since_rv < self._compacted_rv:
                    watcher._wake_r.close()
                    watcher._wake_w.close()
                    raise errors.expired(
                        f"too old resource version: {since_rv} ({self._compacted_rv + 1})")
                for event in self._history:
                    if event.rv > since_rv:
                        watcher.offer(event)
            self._watchers.add(watcher)
            self._watchers_changed()
            return watcher

    def remove_watcher(self, watcher: Watcher) -> None:
        with self.lock:
            if watcher in self._watchers:
                self._watchers.discard(watcher)
                self._watchers_changed()

    def close_watchers(self) -> None:
        """End every open watch (used at shutdown)."""
        with self.lock:
            for watcher in list(self._watchers):
                watcher.close()

    def compact(self) -> int:
        """Forget all history (as etcd compaction would); returns the compacted revision."""
        with self.lock:
            self._history.clear()
            self._compacted_rv = self._rv
            return self._rv

    def watcher_count(self) -> int:
        with self.lock:
            return len(self._watchers)
