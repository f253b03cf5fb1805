"""The quota guards' current versions, counted from a persistent watch instead of read.

Owns: one persistent recursive watch on `/nodepool_k8s/guards` per connection (added on
first use and again after each reconnect), and per guard the count of its data-change
events on that connection and a base (`version - count` at an `exists` answer read on it).
A quota decision (zk/quota_guard.py, step 1) takes a guard's version as base + count: no
request.

Why the count is the version: a persistent watch delivers every change of every znode under
it, one `NodeDataChanged` per version bump (no data, nothing coalesced), and ZooKeeper sends
a connection's watch events and answers in the order it applied the changes, a session's own
write's event before that write's answer. kazoo reads a connection's messages one at a time
on its connection thread, where the listener here counts each event before the next message
is read. So once an `exists` of a guard answered `v`, and no event of that guard was counted
between taking its count `n` before sending the `exists` and looking again after reading the
answer, the answer stands between the same events as the count: the guard's version is
`v - n + count` at any later moment on that connection, as of the last event counted by then.
A count that moved meanwhile sets no base (the answer might stand before or after the event);
the next decision reads again.

What it cannot tell, and then says so (None: the caller reads the guard as before): no
persistent watches (a server before 3.6, or switched off), the watch not yet added on the
current connection, a reconnect (events made while the connection was down are never
delivered: every base of the old connection is dropped), a guard never read on this
connection, a guard created or deleted since its base was taken (its version starts again:
the base is dropped and the guard read again), and a guard whose count a failed commit put
in doubt (`conflicted`: a wrong count, should one ever come, costs at most one more failed
commit and one read, never a loop of failed commits).

Cost: one `AddWatch` per connection; an event per guard bump, counted on kazoo's connection
thread under a lock (a few dict operations). Holds a count and a base per guard that exists
(one per provider and limited tenant, and min-ready).
"""

from __future__ import annotations

import logging
import threading

from kazoo import exceptions as kex
from kazoo.protocol.states import EventType

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import Stat, ZkClient

log = logging.getLogger("nodepool_k8s.zk.guard_versions")


class GuardVersions:
    """Counted versions of the guards under `paths.GUARDS`, on one client's connection."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk
        self._lock = threading.Lock()  # the counts and bases (kazoo's connection thread too)
        self._adding = threading.Lock()  # one `AddWatch` per connection
        # The connection (`ZkClient.connections`) the events are counted on (from just
        # before the watch is added), and the one whose watch the server has answered: the
        # counts and bases hold on it; -1: none.
        self._on = -1
        self._ready = -1
        # Per guard: data changes counted, and every event counted (a creation or deletion
        # too): an answer is taken as a base only while the latter stood still.
        self._changes: dict[str, int] = {}
        self._events: dict[str, int] = {}
        self._base: dict[str, int] = {}
        # False once the server turned persistent watches down (as the caches do).
        self._usable = True
        # Versions taken from counts, and guards read (for tests and the benchmark).
        self.counted = 0
        self.read = 0

    # -- kazoo's connection thread ----------------------------------------------------------
    def _event(self, kind: str, path: str) -> None:
        """The watch's listener: quick, no ZooKeeper calls."""
        with self._lock:
            if self.zk.connections != self._on:
                return  # a connection the counts do not belong to
            self._events[path] = self._events.get(path, 0) + 1
            if kind == EventType.CHANGED:
                self._changes[path] = self._changes.get(path, 0) + 1
            else:
                # Created or deleted: its version starts again; read it again.
                self._base.pop(path, None)

    # -- callers ----------------------------------------------------------------------------
    def watching(self) -> int | None:
        """The connection the counts hold on, adding the watch first on a new one (one
        round trip); None when they cannot (no persistent watches, no connection)."""
        connection = self.zk.connections
        if self._ready == connection:
            return connection
        if not self._usable or not self.zk.persistent_watches:
            return None
        with self._adding:
            connection = self.zk.connections
            if self._ready == connection:
                return connection
            with self._lock:
                # Counting starts before the watch is there: an event counted before it is
                # answered belongs to no base (none is taken before it is answered).
                self._on = connection
                self._changes, self._events, self._base = {}, {}, {}
            added: bool | None
            try:
                added = self.zk.watch_tree(paths.GUARDS, self._event)
            except (kex.NoAuthError, kex.AuthFailedError) as exc:
                # Not for this session: read the guards, without asking at every decision.
                log.warning("Guard versions are read, not counted: %s", exc)
                added = False
            except kex.KazooException as exc:
                log.debug("guard watch not added (%s): reading the guards", exc)
                added = None
            with self._lock:
                if not added or self.zk.connections != connection:
                    self._on = -1
                    self._usable = added is not False
                    return None
                self._ready = connection
            return connection

    def current(self, guard_paths: list[str]
                ) -> tuple[dict[str, int], dict[str, int], int | None]:
        """(versions counted, counts of the others to take with their read, connection);
        connection None when nothing holds (every guard to be read, no base to take)."""
        connection = self.watching()
        with self._lock:
            if connection is None or self._ready != connection \
                    or self.zk.connections != connection:
                return {}, {}, None
            versions: dict[str, int] = {}
            before: dict[str, int] = {}
            for path in guard_paths:
                base = self._base.get(path)
                if base is not None:
                    versions[path] = base + self._changes.get(path, 0)
                else:
                    before[path] = self._events.get(path, 0)
            self.counted += len(versions)
            return versions, before, connection

    def answered(self, guard_paths: list[str], found: list[Stat | None],
                 before: dict[str, int], asked_on: int | None,
                 connection: int | None) -> None:
        """`exists` answers of `guard_paths` read on `connection` (`ZkClient.exists_all`),
        sent after `current` gave `before` on `asked_on`: a base for each guard whose events
        stood still meanwhile, when both are the connection the counts hold on."""
        with self._lock:
            self.read += len(guard_paths)
            if connection is None or connection != asked_on or connection != self._ready \
                    or self.zk.connections != connection:
                return
            for path, stat in zip(guard_paths, found):
                if stat is not None and path in before \
                        and self._events.get(path, 0) == before[path]:
                    self._base[path] = stat.version - self._changes.get(path, 0)

    def holds(self, guard_paths: list[str]) -> bool:
        """Whether `current` would count every one of `guard_paths` (asks nothing)."""
        with self._lock:
            return self._ready == self.zk.connections \
                and all(path in self._base for path in guard_paths)

    def conflicted(self, path: str, used: int, again: bool) -> None:
        """A commit on version `used` of `path` failed on that version. Counted right, the
        count has moved past `used` by now (the bump that beat us was applied before our
        commit, so its event came before the failure's answer) and the retry takes it.
        A count that did not move, or a decision's second failed commit (`again`), says it
        may be wrong: the guard is read for the retry and counted from that answer on, so
        a wrong count costs at most one more failed commit, never a loop."""
        with self._lock:
            base = self._base.get(path)
            if again or base is None or base + self._changes.get(path, 0) <= used:
                self._base.pop(path, None)
