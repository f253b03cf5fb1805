"""A lean, event-driven mirror of one znode's children (and, optionally, of each child's
lock contenders), built on one persistent recursive watch (ZooKeeper 3.6+) or, without
one, on plain one-shot kazoo watches.

Owns: keeping `items` (child name -> decoded record) and `contenders` (child name -> lock
contender names under `<child>/lock`) in step with ZooKeeper, and telling listeners about
every change. Why not kazoo's TreeCache: it keeps raw bytes, a stat and a tree node for
every znode (about 10 KB per Nodepool node including our record, 136 MB RSS at 10,000
nodes), re-walks with two requests per znode (12 s at 10,000 nodes), and applies a deletion
seen on kazoo's event thread while an older read result is still queued on its own thread,
which resurrects deleted znodes ("ghosts").

With a persistent recursive watch on the root (`persistent=True` and a server that has
them), one event tells of each child created, changed or deleted and of each lock contender
created or deleted: a child's data is read once per change and nothing is listed, where
one-shot watches cost a listing of the root per child added or removed and a listing of a
child's lock dir per lock change. The server forgets the watch when the connection ends,
so every resync adds it again before it reads.

How it stays correct: all state changes run on one thread, fed by watch callbacks and read
completions. kazoo delivers those on two different threads, so their relative order is not
the server's: a deleted child is remembered (a tombstone; names of sequential znodes never
come back) and any later read result for it is ignored; data results older (by mzxid) than
what is stored are ignored. kazoo drops every watch on a connection loss, so after each
reconnect the mirror re-reads everything (one pipelined request per watched znode). Lock
contenders follow the persistent watch's events, which arrive in the server's order;
a contender event that arrives while a listing of that child's lock dir is in flight
waits and is applied after the listing (contender names are never reused, so applying
every event after any listing taken since the watch was added gives the right set).
Locks kept in a tree of their own (`lock_root`: request locks) are followed the same way
through a second persistent recursive watch on that root, whose events kazoo delivers on
the same thread and in the server's order with the children's (so a contender created
in the transaction that writes the child is known before that change is looked at).
A persistent watch reports every write, where a one-shot watch missed those made before
it was set again; each write adds one to the znode's version, so an answer whose version
counts every change event seen since the child's creation is current, and a change event
it already answered costs no read. This client's own data writes and creations count as
such answers (zk/echo.py): a change or creation event that arrives while one of ours to
that child is unanswered (for a sequential creation: one with the child's name prefix)
waits for the answer, and is read only if the answer does not account for it.

Reads skipped (`skip_read`): with those counts a mirror knows that a child changed and to
which version, without its data. A child whose last-read record the owner's `skip_read`
rule accepts (a node locked by someone: its holder reads it under the lock; a record left
to another live process) is not read when it changes: it stays `stale` (counted, behind)
and is read once when the rule stops holding (its lock goes away: the rule is asked again,
after the events queued by then, as a removal releases the lock in the transaction that
deletes the child; or at its next change) or when someone asks (`refresh`, which waits
for the answers; a read already in flight is shared, not repeated; without a connection
it returns at once). Only counted children are skipped: a child whose creation this
connection did not see is read on every change, as before; a reconnect's resync reads
everything. What a skipped child's entry shows is its last read record, older than
ZooKeeper's: readers that act on a record lock it and read it fresh anyway; readers that
decide from the cache what may need acting on (cleanup, views) `refresh` first where a
skipped change could matter to them. The rule must be quick and read no ZooKeeper.
`left_unread` tells since when each such child has been left unread without a lock (the
owner's clock), so an owner can read the ones left for long (the cleanup does).

Closed by the taker (`may_close`, locks in a tree of their own): a taker that closes a child
for good (a request fulfilled or failed) deletes the child's lock dir in the transaction
that writes the child and deletes its contender. The events come in that order: the change
(left unread: locked), the contender's deletion (which schedules the read at the release,
after the events queued by then) and the dir's deletion. A dir deleted while the child is
`stale` with no contender left marks it `closed`: the read at the release does not go out
(it is queued behind the dir's event when both came in one network read; when the dir's
event comes later, the read has gone out: correct, only not saved). A closed child keeps
its last read record, stale, until its deletion; it is read when someone asks (`refresh`),
at a change made after the close, when a contender comes back into its lock dir, and at a
reconnect's resync. Only a child left stale counts: nothing is inferred from a dir whose
child was current or is being read. An owner must make sure a wrongly inferred close is
read in time (the request cache's users: cleanup's full pass refreshes every closed entry).

First look (`first_look`): with lock following, a new child (a creation the watch
reported on the connection it counts on) may be left unread for a while for another
process to take first: `first_look(key)` says how many seconds (0: read it now, as
always). Such a child is in `unread_new`, behind and without a record: not in `items`, but
in `stale`, `behind` and `refresh` (which reads it, as any stale child). When the time is
up it is read, unless someone holds its lock by then: then it stays unread like a change
left under another's lock, and is read when that lock goes without closing it (a taker
that closes it deletes its lock dir: "Closed by the taker") or at its next change without
a lock. Changes while the time runs are not read (the time's end reads what is there).
A reconnect's resync reads everything, these too.

Which children exist (`children_through`): with the persistent watch the mirror keeps
every child's name, read or not: the resync's listing, then each creation and deletion
event applied by the watch's listener on kazoo's connection thread as it reads the event,
before it reads the next message. So whoever holds an answer read on that connection
finds the names as of that answer or later: every child created before it is there
(zk/quota_guard.py decides quota on this instead of listing the nodes). Events that arrive
while a resync's listing is in flight are logged and applied to the listing when it comes
(whether a name is there is decided by its last event, so applying again an event the
listing already reflects changes nothing).

Failure modes: read errors other than "no node" are logged and the child is re-read at the
next resync; listeners that raise are logged. A decoder that raises (any exception) marks
the child `malformed` with the reason, reported once per version with its path through
`records.REPORTS`; so is a child whose ACL does not let us read it (another client's);
empty children are remembered as `empty` (for cleanup). Neither is in
`items`, so nothing acts on them. Session and connection events (no path) reaching a watch
are ignored here: the state listener resyncs after a reconnect.
"""

from __future__ import annotations

import collections
import enum
import heapq
import logging
import queue
import threading
import time
from typing import Any, Callable, Generic, TypeVar

from kazoo import exceptions as kex
from kazoo.protocol.states import EventType

from nodepool_k8s.core import records
from nodepool_k8s.zk import errors, locks, multiread
from nodepool_k8s.zk.client import ConnectionState, ZkClient

log = logging.getLogger("nodepool_k8s.zk.mirror")

T = TypeVar("T")
Decoder = Callable[[str, bytes, Any], T]
"""`decode(key, data, stat)`: the record, or an exception (records.Malformed) if unusable."""


class CacheEvent(enum.Enum):
    """What a cache listener is told: `listener(event, key)` (key "" for SYNCED/RECONNECTED)."""

    CHANGED = "changed"  # a record was added or changed
    REMOVED = "removed"  # a record is gone
    LOCK = "lock"  # a record's lock (contenders) changed
    SYNCED = "synced"  # the initial listing (or a resync) is complete
    RECONNECTED = "reconnected"  # the session came back: records may have changed unseen


Listener = Callable[[CacheEvent, str], None]
"""`listener(event, key)`, called on the cache's thread; must be quick."""

TOMBSTONE_TTL = 60.0
MAX_TOMBSTONES = 4_000
MAX_IN_FLIGHT = 256
NO_CONTENDERS: frozenset[str] = frozenset()
# How long a reused-names mirror waits for one read (a lost connection answers sooner;
# an unanswered read is skipped and the resync after the reconnect reads it again).
SYNC_READ_TIMEOUT = 30.0


class _Unanswered:
    """A read that got no answer in time, as `_apply_data` sees it."""

    def get_nowait(self) -> Any:
        raise kex.ConnectionLoss("no answer in time")


class _Written:
    """The answer to one of our own writes, as `_apply_data` sees a read's."""

    def __init__(self, data: bytes, stat: Any) -> None:
        self._answer = (data, stat)

    def get_nowait(self) -> tuple[bytes, Any]:
        return self._answer


class ChildMirror(Generic[T]):
    def __init__(self, zk: ZkClient, root: str, decode: Decoder[T], *, name: str,
                 accept: Callable[[str], bool], with_locks: bool = False,
                 lock_expected: Callable[[T], bool] = lambda record: True,
                 on_change: Callable[[str, "T | None", "T | None"], None] | None = None,
                 reused_names: bool = False, persistent: bool = False,
                 skip_read: Callable[[T, bool], bool] | None = None,
                 lock_root: str | None = None,
                 may_close: Callable[[T], bool] | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 keep_names: bool = False, what: str | None = None,
                 first_look: Callable[[str], float] | None = None,
                 look_over: Callable[[str, bool], None] | None = None) -> None:
        """`lock_expected(record)`: a child without a lock dir will get one (watch for it).
        `on_change(key, old, new)` maintains derived indexes (called under the lock).
        `reused_names`: children come back under the same name after a deletion (a pool
        paused, resumed and paused again), so a deleted name must not be tombstoned; such
        a (small) mirror reads each child synchronously on its own thread instead, which
        keeps every answer in order without tombstones, and applies the answer to one of
        its own writes only to a child it knows exists (`_on_settle`).
        `persistent`: use a persistent recursive watch when the server has them.
        `skip_read(record, locked)`: a change of a child holding `record` (its last read
        data; `locked`: the child has lock contenders) need not be read now (module doc,
        "Reads skipped"); asked on the mirror's thread, must be quick.
        `lock_root`: the children's locks live in a tree of their own,
        `<lock_root>/<child>/<contender>` (request locks), not under `<child>/lock`; they
        are followed (as `with_locks`) through a second persistent recursive watch on that
        root, which reads no data. Without persistent watches they are not followed: no
        contenders are known and nothing is skipped for a lock.
        `may_close(record)`: with `lock_root`, a child whose lock dir itself is deleted
        while changes made under someone's lock are left unread is "closed by its taker"
        (module doc, "Closed by the taker") if this accepts its last read record.
        `monotonic`: the clock of `left_unread`'s times (the owner's, so it can step it).
        `keep_names`: keep every child's name on kazoo's connection thread for
        `children_through` (module doc, "Which children exist"); off, it returns None.
        `what`: how reports name an unusable child (default: `name` without "-cache").
        `first_look(key)`: seconds a new child is left unread for another process to take
        first (module doc, "First look"); asked on the mirror's thread, must be quick and
        read no ZooKeeper. Only with `lock_root` (its locks must be followed).
        `look_over(key, taken)`: a first look ended with the child still unread, `taken`
        whether someone held or closed it by then (on the mirror's thread, quick)."""
        self.zk = zk
        self.root = root
        self.name = name
        self._what = what or name.replace("-cache", "")
        self._decode = decode
        self._accept = accept
        self._with_locks = with_locks or lock_root is not None
        self._lock_root = lock_root
        self._lock_tree = False  # the lock root's persistent watch is in use
        self._lock_expected = lock_expected
        self._on_change = on_change
        self._reused_names = reused_names
        self.items: dict[str, T] = {}
        self.contenders: dict[str, frozenset[str]] = {}
        self.empty: set[str] = set()
        self.malformed: dict[str, str] = {}
        self._mzxid: dict[str, int] = {}
        self._dead: dict[str, float] = {}
        # When the root was created (its czxid): a root deleted and created again (by hand,
        # a cleanup script) starts its sequential names over, and a child older than it is
        # a stale answer.
        self._root_czxid: int | None = None
        self._lock = threading.RLock()
        self._tasks: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = \
            queue.Queue()
        self._thread: threading.Thread | None = None
        self._listeners: list[Listener] = []
        self._synced = threading.Event()
        self._pending = 0
        self._backlog: collections.deque[str] = collections.deque()
        self._queued: set[str] = set()  # in the backlog or being read through it
        self._resyncing = False
        self._want_tree = persistent
        self._tree = False  # the persistent watch is in use
        # child -> (listing number, contender events that arrived meanwhile)
        self._lock_listings: dict[str, tuple[int, list[tuple[str, str]]]] = {}
        self._listings = 0
        self._unlisted: set[str] = set()  # children whose lock dir a resync lists
        self._reading: set[str] = set()  # a change's read is in flight
        self._stale: set[str] = set()  # ... and another change came meanwhile
        # Children whose creation the watch reported: how many data changes since, which
        # is the version (every write adds one) their data must have to be current.
        self._changes: dict[str, int] = {}
        self._versions: dict[str, int] = {}  # the version of the data held
        self._counted_since = -1  # the connection (`ZkClient.connections`) they count on
        # Own writes of a child sent and not yet answered (see zk/echo.py), and the children
        # whose change events came meanwhile: their read waits for those answers.
        self._expected: dict[str, int] = {}
        self._deferred: set[str] = set()
        # Own creations of sequential children sent and not yet answered, by name prefix:
        # a child created with that prefix meanwhile waits for them (it may be ours).
        self._expected_seq: dict[str, int] = {}
        self._skip_read = skip_read
        self._may_close = may_close
        # Children closed by their taker (`may_close`): stale, and not read at their lock's
        # release; read when asked (`refresh`), at a new change or a new contender. Changed
        # on the mirror's thread under `_lock`.
        self.closed: set[str] = set()
        self.closings = 0  # children taken as closed (lock dir deleted while stale)
        self._monotonic = monotonic
        # Skipped children without a lock -> when (`monotonic`) that was last so: a change
        # left unread, or a lock that went while changes were unread (`left_unread`).
        self._left_at: dict[str, float] = {}
        # Children someone asked to have current (`refresh`): never skipped until read, and
        # the callers waiting for them (the keys still behind, the event to set).
        self._wanted: set[str] = set()
        self._waiters: list[tuple[set[str], threading.Event]] = []
        # With the persistent watch: every child known to exist, whose data is read or not
        # (listed by the last resync, then created and not deleted per the watch's events,
        # applied on kazoo's connection thread), the connection on which that resync added
        # the watch and listed the root (-1: none, or a resync under way), and the events
        # that arrived while its listing was in flight (None: no listing in flight). See
        # `children_through`.
        self._keep_names = keep_names
        self._names_lock = threading.Lock()
        self._names: set[str] = set()
        self._names_on = -1
        self._names_log: list[tuple[str, str]] | None = None
        # New children left unread for their first look (`first_look`): the ones whose
        # time still runs -> its end (`monotonic`), those ends in a heap, and every child
        # whose creation is not read yet this way (changed under `_lock`).
        self._first_look = first_look
        self._look_over = look_over
        self._looking: dict[str, float] = {}
        self._look_ends: list[tuple[float, str]] = []
        self.unread_new: set[str] = set()
        self._stopped = False
        self.skipped = 0  # change events left unread under `skip_read`
        self.looks = 0  # new children left to another's first look (`first_look`)
        self.events = 0  # answers applied (reads and own writes)
        self.reads = 0  # data reads sent

    # -- public ---------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}", daemon=True)
        self._thread.start()
        self.zk.add_listener(self._on_state)
        if self._want_tree:
            self.zk.echoes.add(self.root, self)
        self._submit(self._resync)

    def stop(self) -> None:
        self._stopped = True
        self.zk.remove_listener(self._on_state)
        self.zk.echoes.remove(self.root, self)
        if self._want_tree:
            self.zk.unwatch_tree(self.root, self._tree_watch)
        if self._lock_root is not None:
            self.zk.unwatch_tree(self._lock_root, self._lock_tree_watch)
        self._tasks.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self._synced.clear()
        for _, waiting in list(self._waiters):
            waiting.set()  # nothing will answer them now: what is held is what they get

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    def evict(self, key: str) -> None:
        """Forget a child ZooKeeper no longer has (found by a reconciliation)."""
        self._submit(self._remove, key)

    def stale(self) -> set[str]:
        """Children whose data held is older than ZooKeeper's (changes left unread)."""
        with self._lock:
            return {k for k in self.items if self._behind(k)} | set(self.unread_new)

    def behind(self, key: str) -> bool:
        """Whether the child's data held is older than ZooKeeper's (`stale`, for one)."""
        with self._lock:
            return (key in self.items or key in self.unread_new) and self._behind(key)

    def left_unread(self) -> dict[str, float]:
        """Children whose changes `skip_read` left unread -> since when (`monotonic`) they
        are so with no lock contender: the last skipped change, or the lock's going,
        whichever came later. Only those still behind and not locked (a lock takes a child
        out until it goes), so the set stays as small as what is left unread unlocked."""
        with self._lock:
            return {k: t for k, t in self._left_at.items()
                    if k in self.items and self._behind(k)}

    def refresh(self, keys: list[str] | None = None, timeout: float = 10.0) -> bool:
        """Read the stale ones of `keys` (all stale children without it), after the events
        queued before the call, and wait for the answers; False if some did not come
        within `timeout` (the entries then stay as they were). Without a connection, or
        once stopped, it returns at once with what is held. Not from a listener: the
        answers are applied on the mirror's thread.

        "After the events queued before the call" is what makes a refresh current as of
        an answer the caller holds: that answer was read after the events of every
        earlier change, whose tasks (queued on kazoo's connection thread by the persistent
        watch's listener) wait on this thread's queue until they are applied;
        a child they leave behind is not `_behind` before then (min-ready counted a
        spare from its `building` copy that way, its fulfilled request read fresh)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("refresh() from the mirror's own thread would wait forever")
        if keys is not None:
            with self._lock:
                # None of them behind and no event waiting to be applied, nothing to wait
                # for: callers ask for their whole scope and this costs them no trip
                # through the mirror's thread.
                idle = self._tasks.unfinished_tasks == 0
                behind = [k for k in keys
                          if (k in self.items or k in self.unread_new) and self._behind(k)]
            if idle and not behind:
                return True
            if idle:
                keys = behind
        # Without `keys` the trip is kept even when nothing is behind yet: the task runs
        # after the events already queued, so a view's reading is current as of the call.
        done = threading.Event()
        self._submit(self._on_refresh, keys, done)
        return done.wait(timeout)

    def children_through(self, connection: int) -> list[str] | None:
        """Every child created before this client read an answer on `connection` (a
        `ZkClient.connections` number) and still there then, perhaps with some created or
        deleted after: the names this mirror knows now. None when that does not hold: no
        persistent watch, another connection than the one the watch was added and the root
        listed on, the mirror not synced or resyncing, or stopped.

        Why it holds (the ordering argument in zk/quota_guard.py): the server sends a
        connection's watch events and answers in the order it applied the changes, and
        kazoo reads them one by one on its connection thread, where this mirror's watch
        listener applies each creation and deletion to the names before kazoo reads the
        next message. So by the time the caller holds an answer read on `connection`, every
        creation before it is among the names; those before the watch was added are in the
        resync's listing, taken after it on the same connection. Quick: no ZooKeeper read,
        no trip through the mirror's thread, a copy of the names."""
        with self._names_lock:
            if self._stopped or self._names_on != connection \
                    or self.zk.connections != connection \
                    or self._resyncing or not self._synced.is_set():
                return None
            return list(self._names)

    # -- own writes (zk/echo.py; the writer's or kazoo's thread: enqueue only) -------------
    def expect_write(self, key: str, sequence: bool = False) -> bool:
        if not self._want_tree or not self._accept(key + "0" * 10 if sequence else key):
            return False  # one-shot watches: the read after a change also re-arms them
        self._submit(self._on_expect, key, sequence)
        return True

    def settle_write(self, key: str, data: bytes, stat: Any,
                     created: str | None = None) -> None:
        self._submit(self._on_settle, key, data, stat, created)

    # -- plumbing -------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._tasks.put((fn, args))

    def _run(self) -> None:
        while True:
            queued = True
            try:
                task = self._tasks.get(timeout=self._next_look_end())
            except queue.Empty:
                task, queued = (self._looks_ended, ()), False
            if task is None:
                return
            fn, args = task
            try:
                fn(*args)
                if self._look_ends and fn is not self._looks_ended:
                    self._looks_ended()
            except Exception:
                log.exception("%s: error while applying a change", self.name)
            finally:
                if queued:
                    self._tasks.task_done()  # `refresh` reads the count

    def _next_look_end(self) -> float | None:
        """Seconds until the next first look ends (None: no first look runs)."""
        if not self._look_ends:
            return None
        return max(0.0, self._look_ends[0][0] - self._monotonic())

    def _notify(self, kind: CacheEvent, key: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, key)
            except Exception:
                log.exception("%s listener failed", self.name)

    def _on_state(self, state: ConnectionState, epoch: int) -> None:
        if state is ConnectionState.CONNECTED:
            self._submit(self._resync)
            self._notify(CacheEvent.RECONNECTED, "")
        elif state is ConnectionState.LOST:
            self._synced.clear()

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def _lock_path(self, key: str) -> str:
        if self._lock_root is not None:
            return f"{self._lock_root}/{key}"
        return f"{self.root}/{key}/lock"

    def _follows_locks(self) -> bool:
        """Whether contenders are followed (a separate lock root: only by its watch)."""
        return self._with_locks and (self._lock_root is None or self._lock_tree)

    def _key_of(self, path: str) -> str:
        return path[len(self.root) + 1:].split("/", 1)[0]

    def _watched_key(self, event: Any) -> str | None:
        """The child a watch event is about; None for session/connection events, which
        carry no path (kazoo delivers those to data watches too)."""
        path = getattr(event, "path", None)
        if not isinstance(path, str) or not path.startswith(self.root + "/"):
            return None
        return self._key_of(path)

    def _is_dead(self, key: str) -> bool:
        return key in self._dead

    # -- watches (kazoo's threads: enqueue only) ------------------------------------------
    def _root_watch(self, event: Any) -> None:
        self._submit(self._refresh_root)

    def _data_watch(self, event: Any) -> None:
        key = self._watched_key(event)
        if key is None:
            return
        if event.type == EventType.DELETED:
            self._submit(self._remove, key)
        else:
            self._submit(self._fetch, key, False, False)

    def _lock_watch(self, event: Any) -> None:
        key = self._watched_key(event)
        if key is not None:
            self._submit(self._fetch_lock, key)

    def _tree_watch(self, kind: str, path: str) -> None:
        """The persistent watch's listener (kazoo's connection thread): queues what
        `_on_tree_event` acts on, and drops the rest here (a lock dir's own creation and
        deletion, contenders' data, anything deeper) at the cost of one count. Each event
        goes with the connection it came on: `ZkClient.connections` counts a new one on this
        thread before any of its events is read."""
        depth = path.count("/", len(self.root))
        if depth == 1 and kind != EventType.CHANGED and self._keep_names:
            key = path[len(self.root) + 1:]
            if self._accept(key):
                with self._names_lock:
                    if self._names_log is not None:
                        self._names_log.append((kind, key))
                    self._apply_name(self._names, kind, key)
        if depth <= 1 or (depth == 3 and self._with_locks and self._lock_root is None
                          and kind != EventType.CHANGED):
            self._submit(self._on_tree_event, kind, path, self.zk.connections)

    def _on_tree_event(self, kind: str, path: str, connection: int) -> None:
        if not self._tree:
            return
        if path == self.root:
            if kind in (EventType.CREATED, EventType.DELETED):
                # Deleted: the resync creates it again (the launcher's creates need it).
                # Created again: its sequential names start over, which the resync's
                # listing notices (a new czxid), forgetting the old names.
                self._resync()
            return
        if not path.startswith(self.root + "/"):
            return
        parts = path[len(self.root) + 1:].split("/")
        key = parts[0]
        if not self._accept(key):
            return
        if len(parts) == 1:
            if kind == EventType.DELETED:
                self._remove(key)
            elif kind == EventType.CHANGED:
                if key in self._changes:
                    self._changes[key] += 1
                with self._lock:
                    self.closed.discard(key)  # written after its close: read it as it comes
                self._read_change(key)
            elif kind == EventType.CREATED and not self._is_dead(key):
                # The watch saw the creation, so it sees every change after it (also of a
                # child a resync's listing found first); not if it saw it on a connection
                # before the one counted on (a resync queued ahead of the old connection's
                # events ran after the reconnect): that watch missed the changes since.
                if connection == self._counted_since:
                    self._changes[key] = 0
                if self._current(key):
                    return  # the answer to our creation, or a read after it, has it
                if self._awaited(key):
                    self._deferred.add(key)  # probably our own creation (zk/echo.py)
                    return
                if connection == self._counted_since and key not in self._queued \
                        and self._first_look is not None and self._follows_locks():
                    wait = self._first_look(key)
                    if wait > 0:
                        self._look_first(key, wait)
                        return
                if key not in self._queued:
                    # Through the bounded backlog, as a listing's new children are.
                    self._queued.add(key)
                    self._backlog.append(key)
                    self._pump()
            return
        if not self._with_locks or self._lock_root is not None or len(parts) != 3 \
                or parts[1] != "lock":
            return
        self._on_contender_event(key, kind, parts[2])

    def _lock_tree_watch(self, kind: str, path: str) -> None:
        """The lock root's persistent watch listener (kazoo's connection thread, in the
        server's order with the children's events): contenders' creations and deletions
        only; lock dirs come and go on their own, and contenders' data is not wanted."""
        assert self._lock_root is not None
        depth = path.count("/", len(self._lock_root))
        if (kind != EventType.CHANGED and depth == 2) or \
                (kind == EventType.DELETED and depth == 1 and self._may_close is not None):
            self._submit(self._on_lock_tree_event, kind, path)

    def _on_lock_tree_event(self, kind: str, path: str) -> None:
        assert self._lock_root is not None
        if not self._lock_tree or not path.startswith(self._lock_root + "/"):
            return
        key, _, name = path[len(self._lock_root) + 1:].partition("/")
        if self._accept(key):
            self._on_contender_event(key, kind, name)  # name "": the lock dir itself

    def _on_contender_event(self, key: str, kind: str, name: str) -> None:
        listing = self._lock_listings.get(key)
        if listing is not None:
            listing[1].append((kind, name))
        else:
            self._apply_contender(key, kind, name)

    def _on_expect(self, key: str, sequence: bool) -> None:
        expected = self._expected_seq if sequence else self._expected
        expected[key] = expected.get(key, 0) + 1

    def _on_settle(self, key: str, data: bytes, stat: Any, created: str | None) -> None:
        expected = self._expected if created is None else self._expected_seq
        left = expected.pop(key, 0) - 1
        if left > 0:
            expected[key] = left
        child = key if created is None else created
        if child and stat is not None and self._tree and self._exists(child):
            self._apply_data(child, _Written(data, stat))
        for waiting in sorted(k for k in self._deferred if not self._awaited(k)):
            self._deferred.discard(waiting)
            self._read_change(waiting)  # nothing, if the answers account for every change
        self._settle_waiters()

    def _awaited(self, key: str) -> bool:
        """Whether one of our writes that may have made the latest change of `key` is
        unanswered: a write of it, or a creation of a sequential child of its prefix."""
        if key in self._expected:
            return True
        return any(key.startswith(prefix) and key[len(prefix):].isdigit()
                   for prefix in self._expected_seq)

    def _exists(self, key: str) -> bool:
        """Whether an answer to our write of `key` may be applied. Without tombstones
        (`reused_names`) a child deleted after our write and before its answer got here
        would come back from it: only a child known to exist (its creation seen, or read)
        takes one. With tombstones `_apply_data` drops those of deleted children."""
        if not self._reused_names or key in self._changes:
            return True
        with self._lock:
            return key in self.items or key in self.empty or key in self.malformed

    def _behind(self, key: str) -> bool:
        """A counted child whose data held lacks changes the watch reported."""
        wanted = self._changes.get(key)
        return wanted is not None and self._versions.get(key, -1) < wanted

    def _skipped(self, key: str) -> bool:
        """Whether a change of `key` is left unread now (`skip_read`)."""
        if key in self._wanted or key not in self._changes:
            return False
        if key in self._looking or key in self.closed:
            return True  # its first look is someone else's, or its taker closed it
        with self._lock:
            unread = key in self.unread_new
            locked = bool(self.contenders.get(key))
        if unread:
            return locked  # never read, and in someone's hands: read when they let go
        if self._skip_read is None:
            return False
        with self._lock:
            record = self.items.get(key)
            locked = bool(self.contenders.get(key))
        return record is not None and self._skip_read(record, locked)

    def _on_refresh(self, keys: list[str] | None, done: threading.Event) -> None:
        if not self.zk.connected:
            done.set()  # no answer would come before the reconnect's resync re-reads all
            return
        with self._lock:
            candidates = list(self.items) + list(self.unread_new) if keys is None else keys
            behind = {k for k in candidates if self._behind(k) and not self._is_dead(k)}
        if not behind:
            done.set()
            return
        self._wanted |= behind
        self._waiters.append((behind, done))
        for key in sorted(behind):
            self._read_change(key)

    def _settle_waiters(self) -> None:
        """Release the `refresh` callers whose children are now current (or gone)."""
        if not self._waiters:
            return
        done = {k for k in self._wanted if not self._behind(k) or self._is_dead(k)}
        self._wanted -= done
        left = []
        for keys, event in self._waiters:
            keys -= done
            keys &= self._wanted
            if keys:
                left.append((keys, event))
            else:
                event.set()
        self._waiters = left

    def _current(self, key: str) -> bool:
        """Whether the data held for `key` has every change the watch reported."""
        wanted = self._changes.get(key)
        return wanted is not None and self._versions.get(key, -1) >= wanted

    def _read_change(self, key: str) -> None:
        """Read a changed child; changes while that read is in flight are read once more
        after it, unless its answer already has them (one read for a burst of writes, as
        a one-shot watch coalesces them)."""
        if self._is_dead(key) or self._current(key):
            return  # gone, or an answer that overtook this event has the change already
        if self._awaited(key):
            self._deferred.add(key)  # probably our own write, whose answer has the data
            return
        if self._skipped(key):
            self.skipped += 1
            with self._lock:
                if not self.contenders.get(key):  # a locked one is timed from its release
                    self._left_at[key] = self._monotonic()
            return  # stale until its lock goes or someone asks (module doc)
        if key in self._reading:
            self._stale.add(key)
            return
        if key in self._queued:
            return  # waiting in the backlog: its read is sent later, and sees this change
        self._fetch(key, with_lock=False)

    def _look_first(self, key: str, wait: float) -> None:
        """Leave a new child unread for `wait` seconds (module doc, "First look")."""
        end = self._monotonic() + wait
        self._looking[key] = end
        heapq.heappush(self._look_ends, (end, key))
        with self._lock:
            self.unread_new.add(key)
        self.looks += 1

    def _looks_ended(self) -> None:
        """Read the new children whose first look is over, unless someone holds them."""
        now = self._monotonic()
        while self._look_ends and self._look_ends[0][0] <= now:
            end, key = heapq.heappop(self._look_ends)
            if self._looking.get(key) != end:
                continue  # read, gone or resynced meanwhile
            del self._looking[key]
            with self._lock:
                unread = key in self.unread_new
                locked = bool(self.contenders.get(key))
            if unread and not self._is_dead(key):
                self._looked(key, locked)
                self._read_change(key)  # left unread if locked now (`_skipped`)

    def _looked(self, key: str, taken: bool) -> None:
        if self._look_over is not None:
            try:
                self._look_over(key, taken)
            except Exception:
                log.exception("%s: first-look listener failed", self.name)

    def _apply_contender(self, key: str, kind: str, name: str) -> None:
        if not name and kind == EventType.DELETED:
            self._lock_dir_deleted(key)
            return
        if self._is_dead(key) or not locks.contenders([name]):
            return
        with self._lock:
            held = self.contenders.get(key, NO_CONTENDERS)
        if kind == EventType.CREATED:
            with self._lock:
                self.closed.discard(key)  # someone works on it again: read at its release
            self._set_contenders(key, held | {name})
        elif kind == EventType.DELETED:
            self._set_contenders(key, held - {name})

    # -- reads ----------------------------------------------------------------------------
    def _resync(self) -> None:
        """Re-read everything and re-arm every watch (kazoo drops them on disconnect)."""
        if not self.zk.connected:
            return
        # Counts of change events are only good while the watch was there throughout:
        # changes made while it was gone (a reconnect) would be missing from them. A resync
        # on the same connection (the root deleted, a second one at start) keeps them.
        if self.zk.connections != self._counted_since:
            self._counted_since = self.zk.connections
            self._changes.clear()
            with self._lock:
                self.closed.clear()  # everything is read again below
                self._left_at.clear()
            # Nothing is counted now, so nothing is behind: whoever waits for a refresh
            # gets what the re-reads below bring (or what was held).
            self._settle_waiters()
        # Everything is read again below; answers to writes still outstanding (failed by
        # the disconnect) must not hold back a read, nor a first look.
        self._expected.clear()
        self._expected_seq.clear()
        self._deferred.clear()
        self._looking.clear()
        self._look_ends = []
        with self._lock:
            self.unread_new.clear()
        listing_on = self.zk.connections
        with self._names_lock:
            self._names_on = -1
            if self._keep_names:
                self._names_log = []  # the events from now on, for the listing below
        try:
            if self._want_tree:
                # Before the listing, so no change after it goes unseen.
                self._tree = self.zk.watch_tree(self.root, self._tree_watch)
                if not self._tree:
                    self._want_tree = False
                    log.info("%s: ZooKeeper has no persistent watches (3.6+); using "
                             "one-shot watches", self.name)
                elif self._lock_root is not None:
                    # Before the listings of the lock dirs (the resync's, below).
                    self._lock_tree = self.zk.watch_tree(self._lock_root,
                                                         self._lock_tree_watch)
            children, stat = self.zk.kazoo.get_children(
                self.root, watch=None if self._tree else self._root_watch, include_data=True)
        except kex.NoNodeError:
            self._listed(None, listing_on)
            self.zk.ensure_path(self.root)
            if not self._tree:
                # With the persistent watch the root's creation (ours or anyone's) comes as
                # an event, which resyncs: a second resync queued here as well would read
                # again every child created by the time it runs.
                self._submit(self._resync)
            return
        except (kex.NoAuthError, kex.AuthFailedError) as exc:
            self._listed(None, listing_on)
            log.error("%s: %s", self.name, errors.ZkAuthError(type(exc).__name__, self.root))
            return
        except kex.KazooException as exc:
            self._listed(None, listing_on)
            log.warning("%s: resync failed (%s); waiting for the connection", self.name, exc)
            return
        present = {c for c in children if self._accept(c)}
        self._listed(present, listing_on)
        with self._lock:
            gone = [k for k in self.items if k not in present] + \
                [k for k in self.empty if k not in present] + \
                [k for k in self.malformed if k not in present]
        for key in gone:
            self._remove(key)
        if self._root_recreated(stat):
            self._dead.clear()  # the names of the new root's children may be old ones
        self._resyncing = True
        self._pending = 0
        self._backlog = collections.deque(sorted(present))
        self._queued = set(present)
        self._unlisted = set(present) if self._tree else set()
        self._pump()
        if self._pending == 0:
            self._finish_sync()

    def _listed(self, present: set[str] | None, connection: int) -> None:
        """The resync's listing (None: none came): the names are what it shows, with the
        events logged since before the watch was added applied in their order. The listing
        shows the children as of some of those events; a name with no event since is as it
        shows, and a name with events is there if its last one is a creation, whatever the
        listing showed (so an event the listing already reflects changes nothing)."""
        with self._names_lock:
            log_, self._names_log = self._names_log or [], None
            if present is None or not self._keep_names:
                return
            names = set(present)
            for kind, key in log_:
                self._apply_name(names, kind, key)
            self._names = names
            if self._tree and self.zk.connections == connection:
                # The watch was added and the root listed after it, both on this connection.
                self._names_on = connection

    @staticmethod
    def _apply_name(names: set[str], kind: str, key: str) -> None:
        if kind == EventType.CREATED:
            names.add(key)
        elif kind == EventType.DELETED:
            names.discard(key)

    def _pump(self) -> None:
        """Issue queued resync reads, at most MAX_IN_FLIGHT at a time: answers carry the
        whole znode, and ten thousand of them in flight at once would set the process's
        memory high-water mark."""
        while self._backlog and self._pending < MAX_IN_FLIGHT:
            key = self._backlog.popleft()
            # A persistent watch reports a new child's contenders; a resync lists them.
            with_lock = not self._tree or key in self._unlisted
            self._unlisted.discard(key)
            self._fetch(key, counted=True, with_lock=with_lock)

    def _finish_sync(self) -> None:
        self._resyncing = False
        self._synced.set()
        self._notify(CacheEvent.SYNCED, "")

    def _root_recreated(self, stat: Any) -> bool:
        """Whether the root is another znode than the one listed before (and remember it)."""
        old, self._root_czxid = self._root_czxid, stat.czxid
        return old is not None and old != stat.czxid

    def _refresh_root(self) -> None:
        try:
            children, stat = self.zk.kazoo.get_children(self.root, watch=self._root_watch,
                                                        include_data=True)
        except kex.NoNodeError:
            # The root itself was deleted, and our watch with it: without a resync (which
            # creates it again and watches it) nothing was seen until the next reconnect.
            self._resync()
            return
        except kex.KazooException as exc:
            log.debug("%s: root listing failed (%s); resync follows reconnect", self.name, exc)
            return
        if self._root_czxid is not None and stat.czxid != self._root_czxid:
            self._resync()  # deleted and created again since we looked
            return
        present = {c for c in children if self._accept(c)}
        with self._lock:
            known = set(self.items) | self.empty | set(self.malformed)
        for key in known - present:
            self._remove(key)
        # New children are read through the bounded backlog, like a resync: thousands
        # created at once (a bulk import, a burst of requests) must not put thousands of
        # answers in flight, and a child already queued or being read is not read twice.
        for key in sorted(present - known - self._queued):
            if not self._is_dead(key):
                self._queued.add(key)
                self._backlog.append(key)
        self._pump()

    def _fetch(self, key: str, counted: bool = False, with_lock: bool = True) -> None:
        if self._is_dead(key):
            self._queued.discard(key)
            return
        if counted:
            self._pending += 1
        self.reads += 1
        if self._tree:
            self._reading.add(key)  # changes meanwhile: read once more (`_read_change`)
        result = self.zk.kazoo.get_async(self._path(key),
                                         watch=None if self._tree else self._data_watch)
        if self._reused_names:
            # Answered before this thread does anything else: no older answer can arrive
            # after a newer event (what the tombstones guard against otherwise).
            result.wait(SYNC_READ_TIMEOUT)
            self._on_data(key, result if result.ready() else _Unanswered(), counted)
        else:
            result.rawlink(lambda r: self._submit(self._on_data, key, r, counted))
        if with_lock and self._follows_locks():
            self._fetch_lock(key)

    def _fetch_lock(self, key: str) -> None:
        if self._is_dead(key):
            return
        if self._tree:
            # Events of this lock dir from now on wait for the listing (see the module doc);
            # a newer listing supersedes an older one still in flight.
            self._listings += 1
            number = self._listings
            self._lock_listings[key] = (number, [])
            listing = self.zk.kazoo.get_children_async(self._lock_path(key))
            listing.rawlink(lambda r: self._submit(self._on_lock_listing, key, number, r))
            return
        result = self.zk.kazoo.get_children_async(self._lock_path(key),
                                                  watch=self._lock_watch)
        result.rawlink(lambda r: self._submit(self._on_lock, key, r))

    # -- results (mirror thread) ----------------------------------------------------------
    def _on_data(self, key: str, result: Any, counted: bool) -> None:
        try:
            self._apply_data(key, result)
        finally:
            if counted:
                self._queued.discard(key)
                self._pending -= 1
                self._pump()
                if self._pending <= 0 and self._resyncing and not self._backlog:
                    self._finish_sync()
            if self._tree:
                self._reading.discard(key)
                if key in self._stale:
                    self._stale.discard(key)
                    self._read_change(key)  # nothing, if this answer has the changes
            self._settle_waiters()

    def _apply_data(self, key: str, result: Any) -> None:
        if self._is_dead(key):
            return
        try:
            data, stat = result.get_nowait()
        except kex.NoNodeError:
            self._remove(key)
            return
        except kex.NoAuthError:
            self._unreadable(key)
            return
        except kex.KazooException as exc:
            log.debug("%s: reading %s failed (%s)", self.name, key, exc)
            return
        if stat.mzxid < self._mzxid.get(key, -1):
            return  # an older answer overtaken by a newer one
        if self._root_czxid is not None and stat.czxid < self._root_czxid:
            return  # a child of a root that has since been deleted
        self.events += 1
        record: T | None = None
        reason: str | None = None
        if data:
            try:
                record = self._decode(key, data, stat)
            except Exception as exc:  # any decode failure: the record is malformed
                reason = records.describe(exc)
                records.REPORTS.report(self._what, self._path(key),
                                       stat.version, reason)
        with self._lock:
            self.closed.discard(key)  # read: what it shows is ZooKeeper's, closed or not
            self._mzxid[key] = stat.mzxid
            self._versions[key] = stat.version
            self._left_at.pop(key, None)
            self.unread_new.discard(key)
            old = self.items.pop(key, None)
            self.malformed.pop(key, None)
            if not data:
                self.empty.add(key)
            else:
                self.empty.discard(key)
                if record is not None:
                    self.items[key] = record
                else:
                    self.malformed[key] = reason or "unusable"
            if self._on_change is not None:
                self._on_change(key, old, record)
        self._notify(CacheEvent.CHANGED, key)

    def _unreadable(self, key: str) -> None:
        """A child we may not read: as unusable as a malformed one (reported once, with
        its path; the next resync reads it again, as no watch is set on it)."""
        multiread.report_unreadable(self._what, self._path(key))
        with self._lock:
            if self.malformed.get(key) == multiread.UNREADABLE:
                return
            old = self.items.pop(key, None)
            self.empty.discard(key)
            self.unread_new.discard(key)
            self.malformed[key] = multiread.UNREADABLE
            if self._on_change is not None:
                self._on_change(key, old, None)
        self._notify(CacheEvent.CHANGED, key)

    def _on_lock(self, key: str, result: Any) -> None:
        if self._is_dead(key):
            return
        try:
            children = result.get_nowait()
        except kex.NoNodeError:
            with self._lock:
                record = self.items.get(key)
                live = record is not None or key in self.empty
            if live and (record is None or self._lock_expected(record)):
                # No lock dir yet (a node still in `init`): watch for its creation. Not for
                # other nodes: a missing lock dir there means the node is being deleted,
                # and a watch on a path that never comes back would linger.
                exists = self.zk.kazoo.exists_async(self._lock_path(key),
                                                    watch=self._lock_watch)
                exists.rawlink(lambda r: self._submit(self._on_lock_exists, key, r))
            children = []
        except kex.KazooException as exc:
            log.debug("%s: reading the lock of %s failed (%s)", self.name, key, exc)
            return
        self._set_contenders(key, frozenset(locks.contenders(list(children))))

    def _on_lock_listing(self, key: str, number: int, result: Any) -> None:
        """A persistent-watch mirror's listing of a lock dir, then the contender events
        that arrived while it was in flight."""
        listing = self._lock_listings.get(key)
        if listing is None or listing[0] != number:
            return  # superseded by a newer listing, or the child is gone
        del self._lock_listings[key]
        try:
            children: list[str] | None = result.get_nowait()
        except kex.NoNodeError:
            children = []
        except kex.KazooException as exc:
            log.debug("%s: reading the lock of %s failed (%s)", self.name, key, exc)
            children = None  # the resync after the reconnect lists it again
        if children is not None and not self._is_dead(key):
            self._set_contenders(key, frozenset(locks.contenders(list(children))))
        for kind, name in listing[1]:
            self._apply_contender(key, kind, name)

    def _set_contenders(self, key: str, held: frozenset[str]) -> None:
        with self._lock:
            if self.contenders.get(key, NO_CONTENDERS) == held:
                return
            if held:
                self.contenders[key] = held
                self._left_at.pop(key, None)  # locked: timed again from its release
            else:
                self.contenders.pop(key, None)
        if not held and self._tree and self._behind(key):
            # Changes left unread while it was locked: read them, unless the rule still
            # holds without the lock. After the events queued by now: a removal releases
            # the lock in the transaction that deletes the child, whose deletion event is
            # most often among them, and a deleted child needs no read.
            if self._skip_read is not None:
                with self._lock:  # before the listeners hear of it
                    self._left_at[key] = self._monotonic()
            self._submit(self._unlocked, key)
        self._notify(CacheEvent.LOCK, key)

    def _unlocked(self, key: str) -> None:
        with self._lock:
            locked = bool(self.contenders.get(key))
        if not locked and key not in self.closed and self._behind(key):
            self._read_change(key)

    def _lock_dir_deleted(self, key: str) -> None:
        """The child's lock dir itself went (after its last contender: a dir with
        contenders cannot be deleted). Changes left unread under that lock mean its taker
        closed the child in the transaction that removed the dir (module doc)."""
        if self._is_dead(key) or self._may_close is None or key in self._wanted:
            return
        with self._lock:
            record = self.items.get(key)
            unread = key in self.unread_new
            locked = bool(self.contenders.get(key))
        if locked or not self._behind(key) or key in self._reading:
            return
        if not unread and (record is None or not self._may_close(record)):
            return
        with self._lock:
            self.closed.add(key)
        if self._looking.pop(key, None) is not None:
            self._looked(key, True)  # taken and closed within its first look: not read
        self.closings += 1

    def _on_lock_exists(self, key: str, result: Any) -> None:
        """The lock dir may have been created between our listing and the exists call:
        then the exists watch only reports the dir's own deletion, never its contenders,
        and lock changes of this node would go unnoticed (a released node would wait for
        the next full cleanup pass). List it now, which watches its children."""
        try:
            stat = result.get_nowait()
        except kex.KazooException:
            return
        if stat is not None:
            self._fetch_lock(key)

    def _remove(self, key: str) -> None:
        now = time.monotonic()
        if not self._reused_names:
            self._dead[key] = now
        self._lock_listings.pop(key, None)
        self._reading.discard(key)
        self._stale.discard(key)
        self._deferred.discard(key)
        if len(self._dead) > MAX_TOMBSTONES // 2:
            for dead in [k for k, t in self._dead.items() if now - t > TOMBSTONE_TTL]:
                del self._dead[dead]
            # A hard bound as well (oldest first: dicts keep insertion order), so a burst of
            # deletions cannot grow this past a fixed size within the TTL.
            for dead in list(self._dead)[:max(0, len(self._dead) - MAX_TOMBSTONES)]:
                del self._dead[dead]
        with self._lock:
            old = self.items.pop(key, None)
            existed = old is not None or key in self.empty
            if old is not None and self._on_change is not None:
                self._on_change(key, old, None)
            self.empty.discard(key)
            if self.malformed.pop(key, None) is not None:
                records.REPORTS.forget(self._path(key))
            self.contenders.pop(key, None)
            self.closed.discard(key)
            self.unread_new.discard(key)
            self._left_at.pop(key, None)
            self._mzxid.pop(key, None)
            self._versions.pop(key, None)
        self._changes.pop(key, None)
        self._looking.pop(key, None)
        self._settle_waiters()
        if existed:
            self._notify(CacheEvent.REMOVED, key)
