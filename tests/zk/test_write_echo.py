"""Own writes echoed into the caches (zk/echo.py): the answer to a write of ours is the new
data, so the persistent watch's event for it costs no read.

Aspects: own writes (transactions and single writes) are seen without a read, another
client's writes still are read; a change by someone else that lands while our write is
unanswered is read after the answer (whatever order the answer and the events reach the
cache in); a failed write holds nothing back; with one-shot watches every change is read
as before.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.cache import NodeCache, RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.txn import Txn
from tests.zk.support import drained
from tests.helpers import Signal, submissions


def node_json(state: str) -> bytes:
    return json.dumps({"state": state, "type": ["small"], "provider": "p"}).encode()


def write(zkc: ZkClient, path: str, state: str, version: int = -1) -> None:
    """As the launcher writes a node: a transaction checking its lock (here: the znode)."""
    txn = Txn()
    txn.check(path)
    txn.set(path, node_json(state), version)
    txn.commit(zkc)


class Node:
    def __init__(self, kazoo_client: KazooClient, cache: NodeCache) -> None:
        kazoo_client.ensure_path(paths.NODES)
        self.path = kazoo_client.create(f"{paths.NODES}/", node_json("building"),
                                        sequence=True)
        self.id = self.path.rsplit("/", 1)[1]
        self.cache = cache
        self.changes = Signal()
        # Never removed: the cache lives no longer than the test.
        cache.add_listener(self.changes)
        self.wait("building")

    def state(self) -> str | None:
        node = self.cache.get(self.id)
        return node.state if node is not None else None

    def wait(self, state: str) -> None:
        self.changes.until(lambda: self.state() == state, 10,
                           message=f"the cache to show {state}")


@pytest.fixture
def cache(zkc: ZkClient) -> Iterator[NodeCache]:
    cache = NodeCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "one-shot"])
def test_own_writes_are_seen_without_a_read(zkc: ZkClient, kazoo_client: KazooClient,
                                            persistent: bool) -> None:
    zkc.persistent_watches = persistent
    cache = NodeCache(zkc)
    cache.start()
    try:
        assert cache.wait_synced(10)
        assert cache._mirror._tree is persistent
        node = Node(kazoo_client, cache)
        before = cache._mirror.reads
        for state in ("ready", "in-use", "used"):
            write(zkc, node.path, state)
            node.wait(state)
        zkc.set(node.path, node_json("deleting"))  # a single write
        node.wait("deleting")
        # Another client's write is read; once it is seen, every event before it was too.
        kazoo_client.set(node.path, node_json("hold"))
        node.wait("hold")
        reads = cache._mirror.reads - before
        if persistent:
            assert reads == 1
        else:
            assert reads >= 5  # each change re-arms the one-shot watch with a read
    finally:
        cache.stop()


@pytest.mark.parametrize("answer", ["ours", "failed"])
def test_a_change_by_someone_else_while_ours_is_unanswered_is_read(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache, answer: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other client's write comes after ours (version 2 after 1): our answer must not
    pass for the latest data. The cache's thread is held so that our write's expectation,
    both events and our answer are all queued before it looks at any of them."""
    node = Node(kazoo_client, cache)
    mirror = cache._mirror
    queued = submissions(mirror, monkeypatch)
    held = threading.Event()
    mirror._submit(held.wait, 30)
    try:
        if answer == "ours":
            write(zkc, node.path, "ready")  # answered: version 1
        else:
            # As the echo does for a write whose outcome is unknown (a lost connection).
            assert mirror.expect_write(node.id)
        kazoo_client.set(node.path, node_json("in-use"))
        # The expectation, two change events (one, if ours was never sent) and the
        # settling of our write.
        queued.until(lambda: mirror._tasks.qsize() >= (4 if answer == "ours" else 2), 10,
                     message="the queued events")
        if answer == "failed":
            mirror.settle_write(node.id, node_json("ready"), None)
    finally:
        held.set()
    node.wait("in-use")
    kazoo_client.set(node.path, node_json("used"))  # and it goes on following the node
    node.wait("used")
    assert mirror._expected == {} and mirror._deferred == set()


def test_a_write_that_is_refused_holds_nothing_back(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache) -> None:
    node = Node(kazoo_client, cache)
    with pytest.raises(errors.TxnFailed):
        write(zkc, node.path, "ready", version=99)
    with pytest.raises(errors.VersionConflict):
        zkc.set(node.path, node_json("ready"), 99)
    kazoo_client.set(node.path, node_json("in-use"))
    node.wait("in-use")
    assert cache._mirror._expected == {} and cache._mirror._deferred == set()
    write(zkc, node.path, "used")  # and our own writes go on being seen
    node.wait("used")


def test_ours_answered_after_someone_elses_later_write_is_not_taken(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Our answer (version 1) reaching the cache after the other client's write (version
    2) was read must not bring the older data back."""
    node = Node(kazoo_client, cache)
    mirror = cache._mirror
    queued = submissions(mirror, monkeypatch)
    assert mirror.expect_write(node.id)  # our write, sent
    stat = kazoo_client.set(node.path, node_json("ready"))  # ... and applied: version 1
    kazoo_client.set(node.path, node_json("in-use"))  # someone else's, version 2

    def deferred() -> bool:
        drained(mirror)  # what is queued now has been handled: the thread is between tasks
        return node.id in mirror._deferred

    queued.until(deferred, 10, message="the deferred read")
    mirror.settle_write(node.id, node_json("ready"), stat)  # our answer, late
    node.wait("in-use")
    held = threading.Event()
    mirror._submit(held.set)
    assert held.wait(10)
    assert node.state() == "in-use"


def test_a_child_a_resync_listed_first_is_counted_from_its_creation(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resync on the same connection (here: queued just before the child is created)
    lists the child before its creation event is handled; the watch saw the creation, so
    the changes after it are counted and our own writes still cost no read."""
    mirror = cache._mirror
    changes = Signal().listen(cache)
    queued = submissions(mirror, monkeypatch)
    held = threading.Event()
    mirror._submit(held.wait, 30)
    mirror._submit(mirror._resync)
    path = kazoo_client.create(f"{paths.NODES}/", node_json("building"), sequence=True)
    node_id = path.rsplit("/", 1)[1]
    queued.until(lambda: mirror._tasks.qsize() >= 2, 10, message="the resync and the event")
    held.set()
    changes.until(lambda: (n := cache.get(node_id)) is not None and n.state == "building",
                  10, message="the new node")
    before = mirror.reads
    for state in ("ready", "in-use"):
        write(zkc, path, state)
        changes.until(lambda: (n := cache.get(node_id)) is not None and n.state == state,
                      10, message=state)
    kazoo_client.set(path, node_json("used"))  # someone else's: read
    changes.until(lambda: (n := cache.get(node_id)) is not None and n.state == "used", 10,
                  message="used")
    assert mirror.reads - before == 1


def test_a_resync_on_the_same_connection_keeps_the_counts(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache) -> None:
    """The counts stand for versions while the watch was there throughout: a resync that
    is not after a reconnect (the root deleted, a second one at start) keeps them."""
    node = Node(kazoo_client, cache)
    mirror = cache._mirror
    done = threading.Event()
    mirror._submit(mirror._resync)
    mirror._submit(done.set)
    assert done.wait(10) and cache.wait_synced(10)
    before = mirror.reads
    write(zkc, node.path, "ready")
    node.wait("ready")
    kazoo_client.set(node.path, node_json("in-use"))
    node.wait("in-use")
    assert mirror.reads - before == 1


def test_a_creation_seen_on_the_connection_before_a_resync_is_not_counted(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resync that runs after a reconnect but was queued before it (here: the root's
    deletion and creation, seen on the old connection) leaves the old connection's events
    queued behind it. A creation event among them must not start a count: the changes made
    while no watch was there (two writes) are not in it, and the next change looked
    answered already (the cache kept showing the second write)."""
    mirror = cache._mirror
    drained(mirror)  # the start's own resyncs (the root created) are over
    changes = Signal().listen(cache).listen(zkc)
    queued = submissions(mirror, monkeypatch)
    held = threading.Event()
    mirror._submit(held.wait, 30)
    try:
        kazoo_client.delete(paths.NODES)  # a cleanup script, say: the root goes and comes
        kazoo_client.create(paths.NODES)
        path = kazoo_client.create(f"{paths.NODES}/", node_json("building"), sequence=True)
        node_id = path.rsplit("/", 1)[1]
        queued.until(lambda: mirror._tasks.qsize() >= 3, 10,
                     message="the root's deletion and creation and the node's creation")
        connections = zkc.connections
        zkc.kazoo._connection._socket.shutdown(socket.SHUT_RDWR)  # the session lives on
        changes.until(lambda: zkc.connections > connections and zkc.connected, 20,
                      message="the reconnect")
        # Unseen: the cache's thread has not added the watch on the new connection yet.
        kazoo_client.set(path, node_json("ready"))
        kazoo_client.set(path, node_json("in-use"))
    finally:
        held.set()

    def state() -> str | None:
        node = cache.get(node_id)
        return node.state if node is not None else None

    changes.until(lambda: state() == "in-use", 10, message="the resync's read")
    kazoo_client.set(path, node_json("used"))  # version 3, and the third change event
    changes.until(lambda: state() == "used", 10, message="the change after the reconnect")
    changes.close()


def test_one_transaction_writing_a_node_and_a_request_costs_no_read(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache) -> None:
    """Sets to children of two caches in one transaction (as a fulfilment writes a node
    and its request): each cache takes its own set's answer, and none is read."""
    requests = RequestCache(zkc)
    changes = Signal().listen(requests)
    requests.start()
    try:
        assert requests.wait_synced(10)
        node = Node(kazoo_client, cache)
        kazoo_client.ensure_path(paths.REQUESTS)
        body = {"state": "requested", "node_types": ["small"], "requestor": "zuul"}
        request_path = kazoo_client.create(f"{paths.REQUESTS}/100-",
                                           json.dumps(body).encode(), sequence=True)
        request_id = request_path.rsplit("/", 1)[1]

        def request_state() -> str | None:
            request = requests.get(request_id)
            return request.state if request is not None else None

        changes.until(lambda: request_state() == "requested", 10, message="the request")
        before = (cache._mirror.reads, requests._mirror.reads)
        txn = Txn()
        txn.check(node.path)
        txn.set(node.path, node_json("ready"), 0)
        txn.set(request_path, json.dumps({**body, "state": "pending"}).encode(), 0)
        txn.commit(zkc)
        node.wait("ready")
        changes.until(lambda: request_state() == "pending", 10, message="the pending request")
        drained(cache._mirror)
        drained(requests._mirror)
        assert (cache._mirror.reads, requests._mirror.reads) == before
        for mirror in (cache._mirror, requests._mirror):
            assert mirror._expected == {} and mirror._deferred == set()
        kazoo_client.set(node.path, node_json("used"))  # someone else's: read
        node.wait("used")
        assert cache._mirror.reads == before[0] + 1
    finally:
        requests.stop()


def test_change_events_that_come_after_our_answer_hide_nothing(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ZooKeeper sends the notification of our own write before its answer, but nothing
    may depend on it: here the node's change events (ours, then someone else's later
    write) reach the cache only after our answer was applied."""
    node = Node(kazoo_client, cache)
    mirror = cache._mirror
    submit = mirror._submit
    held: list[tuple[Any, ...]] = []
    holding_back = Signal()

    def holding(fn: Any, *args: Any) -> None:
        if fn == mirror._on_tree_event and args[1] == node.path:
            held.append(args)
            holding_back()
        else:
            submit(fn, *args)

    monkeypatch.setattr(mirror, "_submit", holding)
    before = mirror.reads
    write(zkc, node.path, "ready")  # version 1: answered, its event held back
    node.wait("ready")
    kazoo_client.set(node.path, node_json("in-use"))  # version 2, someone else's
    holding_back.until(lambda: len(held) == 2, 10, message="both change events")

    monkeypatch.undo()
    for args in held:
        submit(mirror._on_tree_event, *args)
    node.wait("in-use")
    assert mirror.reads - before == 1  # the other client's change, once
    write(zkc, node.path, "used")  # and ours go on costing nothing
    node.wait("used")
    drained(mirror)
    assert mirror.reads - before == 1
    assert mirror._expected == {} and mirror._deferred == set()


def test_a_child_set_twice_in_one_transaction_is_echoed_once(
        zkc: ZkClient, kazoo_client: KazooClient, cache: NodeCache) -> None:
    """Inside one transaction the first set's data never exists for any reader: only the
    last set's answer is echoed (and the two change events cost no read)."""
    node = Node(kazoo_client, cache)
    seen: list[str | None] = []
    cache.add_listener(lambda kind, key: seen.append(node.state()) if key == node.id else None)
    before = cache._mirror.reads
    txn = Txn()
    txn.set(node.path, node_json("ready"))
    txn.set(node.path, node_json("in-use"))
    txn.commit(zkc)
    node.wait("in-use")
    kazoo_client.set(node.path, node_json("used"))  # read; every event before it was seen
    node.wait("used")
    assert "ready" not in seen, seen
    assert cache._mirror.reads - before == 1
