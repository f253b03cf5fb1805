"""Event-driven read caches of nodes (with lock contenders), requests and components.

Owns: what the engine knows about ZooKeeper between reads. Nodes and requests are mirrored
by `mirror.ChildMirror` (a persistent recursive watch, or one-shot watches on a server
older than 3.6; one thread, tombstones against stale results); nodes are kept as slim
`Node` records (the fields decisions need, strings interned) so ten thousand nodes cost a
few MB. The node cache does not read the changes of a node while it is locked (whoever
holds the lock reads it under the lock, and everything that acts locks first), nor those of
a node another live launcher built (`NodeCache.left_to_builder`, the engine's rule): such
entries keep their last read record, marked stale, until the lock goes, the rule stops
holding at a later change or a reader that needs them current calls `refresh` (mirror.py,
"Reads skipped"; `left_unread` tells since when, for the cleanup). Provider, pool, label,
type and resources never change after creation, so quota counting is exact with the first
read. The request cache follows the request locks (`/nodepool/requests-lock`, a second
persistent watch, no data read) and does not read a request's changes while a contender
that is not this client's own live work is in its lock dir; it reads them once that lock
goes or when asked, not at all when the lock's holder closed the request and removed the
lock dir with its release (`is_closed`: the pool pass leaves such an entry alone; cleanup's
full pass reads those still there, so one wrongly taken as closed waits at most one pass).
The component cache mirrors `/nodepool/components/launcher` and `/pool` the same way
(one mirror each), so a registration is read once per change and our own are not read
back.

Listeners are called on the cache's thread with `(kind, key)` (kind: changed, removed,
lock, synced, reconnected); they must be quick (set an event, no ZooKeeper calls). Reads
return snapshots and are safe from any thread. A cache can lag: find candidates here, then
lock and re-read before acting. Unusable znodes are logged with their path and skipped
(empty node znodes are remembered for cleanup).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from nodepool_k8s.core import model, records
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.zk import locks, paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.mirror import CacheEvent as CacheEvent
from nodepool_k8s.zk.mirror import ChildMirror, Listener

log = logging.getLogger("nodepool_k8s.zk.cache")

T = TypeVar("T")


def decode_summary(node_id: str, raw: bytes, stat: Any) -> Node:
    """The cache's entry of a node znode: the strict decoder (`records.decode_node`) into a
    `model.Node` summary; `records.Malformed` otherwise (the mirror reports it)."""
    return records.guarded(lambda data: Node.from_dict(node_id, records.decode_node(data),
                                                       stat.version, summary=True), raw)


class MirroredCache(Generic[T]):
    """Lifecycle and listener plumbing shared by the caches built on a ChildMirror."""

    name = "cache"
    _mirror: ChildMirror[T]

    def start(self) -> None:
        self._mirror.start()

    def stop(self) -> None:
        self._mirror.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._mirror.wait_synced(timeout)

    @property
    def synced(self) -> bool:
        return self._mirror.synced

    def add_listener(self, listener: Listener) -> None:
        self._mirror.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._mirror.remove_listener(listener)

    def evict(self, key: str) -> None:
        """Forget an entry ZooKeeper no longer has (found by a reconciliation)."""
        self._mirror.evict(key)

    def ids(self) -> list[str]:
        with self._mirror._lock:
            return list(self._mirror.items)

    def malformed(self) -> dict[str, str]:
        """Children whose data is not a usable record: id -> reason (skipped by the engine)."""
        with self._mirror._lock:
            return dict(self._mirror.malformed)

    def stale(self) -> set[str]:
        """Ids whose entry is older than ZooKeeper's record (changes left unread)."""
        return self._mirror.stale()

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool:
        """Make the stale ones of `ids` (every stale entry without it) current: one read
        each, shared with a read already in flight; False if some answer did not come in
        `timeout`. Never from a cache listener."""
        return self._mirror.refresh(ids, timeout)


class NodeCache(MirroredCache[Node]):
    """Nodes by id, with their lock contenders (a cheap "probably locked")."""

    name = "node cache"

    def __init__(self, zk: ZkClient, monotonic: Callable[[], float] = time.monotonic) -> None:
        """`monotonic`: the clock of `left_unread`'s times (the engine's)."""
        self._by_request: dict[str, set[str]] = {}
        # Whether a node is left to the live launcher that built it (the engine's rule; on
        # the cache's thread, quick): its changes are not read until someone asks.
        self.left_to_builder: Callable[[Node], bool] = lambda node: False
        self._mirror: ChildMirror[Node] = ChildMirror(
            zk, paths.NODES, decode_summary, name="node-cache", accept=paths.is_node_id,
            with_locks=True, lock_expected=lambda n: n.state == model.NodeState.INIT,
            on_change=self._index, persistent=True, skip_read=self._skip_read,
            monotonic=monotonic, keep_names=True)

    def _skip_read(self, node: Node, locked: bool) -> bool:
        return locked or self.left_to_builder(node)

    def _index(self, node_id: str, old: Node | None, new: Node | None) -> None:
        before = old.allocated_to if old is not None else None
        after = new.allocated_to if new is not None else None
        if before == after:
            return
        if isinstance(before, str) and before in self._by_request:
            self._by_request[before].discard(node_id)
            if not self._by_request[before]:
                del self._by_request[before]
        if isinstance(after, str):
            self._by_request.setdefault(after, set()).add(node_id)

    def get(self, node_id: str) -> Node | None:
        with self._mirror._lock:
            return self._mirror.items.get(node_id)

    def nodes(self) -> list[Node]:
        with self._mirror._lock:
            return list(self._mirror.items.values())

    def allocated_to(self, request_id: str) -> list[str]:
        """Ids of cached nodes whose `allocated_to` is `request_id`."""
        with self._mirror._lock:
            return list(self._by_request.get(request_id, ()))

    def is_stale(self, node_id: str) -> bool:
        """Whether the entry lacks changes ZooKeeper has (left unread: `stale`)."""
        return self._mirror.behind(node_id)

    def left_unread(self) -> dict[str, float]:
        """Stale entries whose changes were left unread with no lock held (left to their
        builder, or the lock came after) -> since when (monotonic; see
        `ChildMirror.left_unread`)."""
        return self._mirror.left_unread()

    def is_locked(self, node_id: str) -> bool:
        """Probably locked: some contender znode exists under `<node>/lock`."""
        with self._mirror._lock:
            return bool(self._mirror.contenders.get(node_id))

    def held(self) -> dict[str, frozenset[str]]:
        """Node id -> its lock contenders' names, for every node that has any (a copy)."""
        with self._mirror._lock:
            return dict(self._mirror.contenders)

    def unusable(self, node_id: str) -> bool:
        """Whether the node's znode holds no usable record (malformed or unreadable)."""
        with self._mirror._lock:
            return node_id in self._mirror.malformed

    def empty_ids(self) -> list[str]:
        with self._mirror._lock:
            return list(self._mirror.empty)

    def __len__(self) -> int:
        with self._mirror._lock:
            return len(self._mirror.items)

    @property
    def zk(self) -> ZkClient:
        return self._mirror.zk

    def ids_through(self, connection: int) -> list[str] | None:
        """Ids of every node created before this client read an answer on `connection`
        and not deleted since, perhaps with a few newer ones; None when the cache cannot
        tell (`ChildMirror.children_through`). Quick: reads nothing, waits for nothing."""
        return self._mirror.children_through(connection)


@dataclass(frozen=True)
class _CachedRequest:
    request: NodeRequest
    owner: int  # ephemeral owner session (0 for persistent requests)


class RequestCache(MirroredCache[_CachedRequest]):
    """Requests by id, with the session that owns each ephemeral request."""

    name = "request cache"

    def __init__(self, zk: ZkClient, monotonic: Callable[[], float] = time.monotonic) -> None:
        """`monotonic`: the clock a first look's time runs on (real time: it is a wait)."""
        self.zk = zk
        # Seconds a new request is left to another launcher before this one reads it (its
        # owner's rule, `Engine._request_first_look`; zk/mirror.py "First look").
        self.first_look: Callable[[str], float] = lambda request_id: 0.0
        # Told how each first look ended: whether someone had taken the request by then.
        self.look_over: Callable[[str, bool], None] = lambda request_id, taken: None
        self._mirror: ChildMirror[_CachedRequest] = ChildMirror(
            zk, paths.REQUESTS, self._decode, name="request-cache",
            accept=paths.is_request_id, persistent=True, skip_read=self._skip_read,
            lock_root=paths.REQUEST_LOCKS, may_close=self._may_close,
            first_look=lambda request_id: self.first_look(request_id), monotonic=monotonic,
            look_over=lambda request_id, taken: self.look_over(request_id, taken))

    def _skip_read(self, item: _CachedRequest, locked: bool) -> bool:
        """A change made while a contender not of this client's own live work is in the
        request's lock dir: its holder (another launcher, Zuul) reads it under the lock,
        and its write and release come to us as one change and one lock event."""
        return locked and self._held_elsewhere(item.request.id)

    def _held_elsewhere(self, request_id: str) -> bool:
        lock_dir = paths.request_lock_path(request_id)
        return any(not locks.held_here(self.zk, f"{lock_dir}/{name}")
                   for name in self._mirror.contenders.get(request_id, ()))

    @staticmethod
    def _may_close(item: _CachedRequest) -> bool:
        """Not min-ready requests: their owner must read the close to delete them, and
        min-ready counts them by state (few; read as before)."""
        return item.request.requestor != model.MIN_READY_REQUESTOR

    @staticmethod
    def _decode(request_id: str, raw: bytes, stat: Any) -> _CachedRequest:
        return _CachedRequest(request_codec.decode(request_id, raw, stat.version),
                              stat.ephemeralOwner)

    def get(self, request_id: str) -> NodeRequest | None:
        with self._mirror._lock:
            item = self._mirror.items.get(request_id)
        return item.request if item else None

    def requests(self) -> list[NodeRequest]:
        with self._mirror._lock:
            return [item.request for item in self._mirror.items.values()]

    def owner(self, request_id: str) -> int | None:
        with self._mirror._lock:
            item = self._mirror.items.get(request_id)
        return item.owner if item else None

    def __contains__(self, request_id: object) -> bool:
        """Whether the request exists as far as the cache knows, read or not (`unread`)."""
        with self._mirror._lock:
            return request_id in self._mirror.items or request_id in self._mirror.unread_new

    def unread(self) -> list[str]:
        """Ids of requests whose creation the cache has not read: left to another
        launcher's first look and, after it, to whoever holds or closed them (zk/mirror.py,
        "First look"). Not in `requests()`; `refresh` reads them."""
        with self._mirror._lock:
            return list(self._mirror.unread_new)

    def is_locked(self, request_id: str) -> bool:
        """Probably locked: some contender is in the request's lock dir (known only with
        persistent watches: otherwise always False)."""
        with self._mirror._lock:
            return bool(self._mirror.contenders.get(request_id))

    def held_elsewhere(self, request_id: str) -> bool:
        """Probably held by someone else: a contender not of this client's own live work
        is in the request's lock dir (another launcher, Zuul), so its changes are left
        unread (`_skip_read`). Known only with persistent watches (`follows_locks`)."""
        with self._mirror._lock:
            return self._held_elsewhere(request_id)

    def is_closed(self, request_id: str) -> bool:
        """Whether the entry's request was closed by the taker of its lock (fulfilled or
        failed, its lock dir removed) without the cache reading it: its record shows what it
        was before that lock; nothing needs doing for it (mirror.py, "Closed by the
        taker")."""
        with self._mirror._lock:
            return request_id in self._mirror.closed

    def closed(self) -> list[str]:
        """Ids of the entries taken as closed by their taker (`is_closed`)."""
        with self._mirror._lock:
            return list(self._mirror.closed)

    def is_stale(self, request_id: str) -> bool:
        """Whether the entry lacks changes ZooKeeper has (left unread or being read)."""
        return self._mirror.behind(request_id)

    def follows_locks(self) -> bool:
        """Whether lock contenders are followed (`is_locked` means something)."""
        return self._mirror._follows_locks()


@dataclass(frozen=True)
class Component:
    """A registered component (`/nodepool/components/<kind>/<name>`)."""

    kind: str
    znode: str
    hostname: str | None
    state: str | None
    data: dict[str, Any]
    # The session that registered it (components are ephemeral): 0 when unknown.
    owner: int = 0

    @property
    def id(self) -> str | None:
        value = self.data.get("id")
        return value if isinstance(value, str) else None

    @property
    def provider_name(self) -> str | None:
        return self.data.get("provider_name")

    @property
    def supported_labels(self) -> frozenset[str]:
        labels = self.data.get("supported_labels") or []
        return frozenset(x for x in labels if isinstance(x, str))

    @property
    def priority(self) -> int:
        value = self.data.get("priority", 100)
        return value if isinstance(value, int) else 100

    @property
    def paused(self) -> bool:
        return bool(self.data.get("paused", False))


def parse_component(kind: str, znode: str, raw: bytes, owner: int = 0) -> Component:
    """The registration in `raw`, through the strict gate (`records.check_component`);
    raises records.Malformed when it is unusable."""
    data = records.load_object(raw)
    records.check_component(data)
    return Component(kind=kind, znode=znode, hostname=data.get("hostname"),
                     state=data.get("state"), data=data, owner=owner)


def decode_component(kind: str, znode: str, raw: bytes, owner: int = 0,
                     version: int = -1) -> Component | None:
    """`parse_component`, or None, reported once per `version` with its path, when the
    registration is unusable."""
    try:
        return parse_component(kind, znode, raw, owner)
    except records.Malformed as exc:
        records.REPORTS.report("component", f"{paths.COMPONENTS}/{kind}/{znode}", version,
                               exc.reason)
        return None


class ComponentCache:
    """Registered launcher and pool components: one `ChildMirror` per kind
    (`/nodepool/components/launcher` and `/pool`), each on a persistent recursive watch
    (one-shot watches on a server older than 3.6). A registration is read once per change,
    and this process's own registrations and their updates (a pool paused or resumed) are
    not read back (zk/echo.py). Other kinds (Nodepool's builders) are not followed."""

    name = "component cache"
    KINDS = ("launcher", "pool")

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk
        self._listeners: list[Listener] = []
        self._ignored: set[str] = set()  # persistent pool registrations, reported once
        self._ignored_lock = threading.Lock()
        self._mirrors: dict[str, ChildMirror[Component]] = {
            kind: ChildMirror(
                zk, f"{paths.COMPONENTS}/{kind}", self._decoder(kind),
                name=f"{kind}-component-cache", what="component",
                accept=lambda child: bool(child), persistent=True,
                on_change=self._forget_ignored if kind == "pool" else None)
            for kind in self.KINDS}
        for kind, mirror in self._mirrors.items():
            mirror.add_listener(self._relay(kind))

    def _decoder(self, kind: str) -> Callable[[str, bytes, Any], Component]:
        def decode(znode: str, raw: bytes, stat: Any) -> Component:
            # Malformed: raised, and the mirror reports it once with its path.
            component = parse_component(kind, znode, raw, stat.ephemeralOwner)
            if kind == "pool" and component.id and not component.owner:
                path = f"{paths.COMPONENTS}/{kind}/{znode}"
                with self._ignored_lock:
                    seen = path in self._ignored
                    self._ignored.add(path)
                if not seen:
                    log.warning("Ignoring pool registration %s: it is not ephemeral, so no "
                                "live launcher stands behind it", path)
            return component
        return decode

    def _forget_ignored(self, znode: str, old: Component | None,
                        new: Component | None) -> None:
        if new is None:
            with self._ignored_lock:
                self._ignored.discard(f"{paths.POOL_COMPONENTS}/{znode}")

    def _relay(self, kind: str) -> Listener:
        def relay(event: CacheEvent, key: str) -> None:
            if event is CacheEvent.SYNCED and not self.synced:
                return  # told once every kind is synced
            self._notify(event, f"{kind}/{key}" if key else "")
        return relay

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def start(self) -> None:
        for mirror in self._mirrors.values():
            mirror.start()

    def stop(self) -> None:
        for mirror in self._mirrors.values():
            mirror.stop()

    def wait_synced(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for mirror in self._mirrors.values():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not mirror.wait_synced(left):
                return False
        return True

    @property
    def synced(self) -> bool:
        return all(mirror.synced for mirror in self._mirrors.values())

    @property
    def reads(self) -> int:
        """Registrations read so far (not counting our own writes' answers)."""
        return sum(mirror.reads for mirror in self._mirrors.values())

    def _notify(self, kind: CacheEvent, key: str) -> None:
        for listener in list(self._listeners):
            try:
                listener(kind, key)
            except Exception:
                log.exception("component cache listener failed")

    def components(self, kind: str | None = None) -> list[Component]:
        out: list[Component] = []
        for name, mirror in self._mirrors.items():
            if kind is None or kind == name:
                with mirror._lock:
                    out.extend(mirror.items.values())
        return out

    def pools(self) -> list[Component]:
        """Registered pools. Launchers register them as ephemeral znodes; a persistent one
        (left by a tool, or written by hand) outlives any launcher and would be yielded to,
        or waited for to decline, forever."""
        return [c for c in self.components("pool") if c.id and c.owner]

    def launchers(self) -> list[Component]:
        return self.components("launcher")
