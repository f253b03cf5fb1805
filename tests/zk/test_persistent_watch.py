"""The caches on a persistent recursive watch (ZooKeeper 3.6+; the test server is 3.8).

Aspects: lock changes and new children are followed from the watch's events alone (no
listing of a lock dir or of the root after the initial sync: that is what the watch
saves); contender events that arrive while a lock-dir listing is in flight are applied
after it (else an older listing would bring back a released lock); the watch is added
again after a dropped connection and after a session expiry (the server forgets it with
the connection, and kazoo does not restore it); without persistent watches the caches
fall back to one-shot watches and still follow everything.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import NodeCache, RequestCache
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import Signal, ZkConnection, submissions
from tests.sessions import expire_session

NODE = "0000000011"


def node_json(state: str) -> bytes:
    return json.dumps({"state": state, "type": ["small"], "provider": "p"}).encode()


def request_json() -> bytes:
    return json.dumps({"state": "requested", "node_types": ["small"],
                       "requestor": "zuul"}).encode()


class Listings:
    """Counts the caches' listings (children reads) while passing them on unchanged."""

    def __init__(self, zkc: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self._lock = threading.Lock()
        real_async, real_sync = zkc.kazoo.get_children_async, zkc.kazoo.get_children

        def get_children_async(path: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.paths.append(path)
            return real_async(path, *args, **kwargs)

        def get_children(path: str, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.paths.append(path)
            return real_sync(path, *args, **kwargs)

        monkeypatch.setattr(zkc.kazoo, "get_children_async", get_children_async)
        monkeypatch.setattr(zkc.kazoo, "get_children", get_children)

    def count(self) -> int:
        with self._lock:
            return len(self.paths)


def lock_once(kazoo_client: KazooClient, cache: NodeCache, node_id: str) -> None:
    with Signal().listen(cache) as changes:
        contender = kazoo_client.create(f"{paths.node_lock_path(node_id)}/c__lock__", b"",
                                        ephemeral=True, sequence=True, makepath=True)
        changes.until(lambda: cache.is_locked(node_id), 10, message="the lock to be seen")
        kazoo_client.delete(contender)
        changes.until(lambda: not cache.is_locked(node_id), 10,
                      message="the unlock to be seen")


def test_changes_are_followed_from_events_without_listings(
        zkc: ZkClient, kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> None:
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.create(paths.node_path(NODE), node_json("ready"))
    listings = Listings(zkc, monkeypatch)
    cache = NodeCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        after_sync = listings.count()
        for _ in range(3):
            lock_once(kazoo_client, cache, NODE)
        other = "0000000012"
        kazoo_client.create(paths.node_path(other), node_json("building"))
        changes.until(lambda: cache.get(other) is not None, 10, message="the new node")
        lock_once(kazoo_client, cache, other)
        kazoo_client.set(paths.node_path(other), node_json("ready"))
        changes.until(lambda: (n := cache.get(other)) is not None and n.state == "ready", 10,
                      message="the data change")
        kazoo_client.delete(paths.node_path(other), recursive=True)
        changes.until(lambda: cache.get(other) is None, 10, message="the deletion")
        assert listings.count() == after_sync, listings.paths[after_sync:]
    finally:
        cache.stop()


def test_contender_events_during_a_listing_are_applied_after_it(
        zkc: ZkClient, kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> None:
    lock_dir = paths.node_lock_path(NODE)
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.create(paths.node_path(NODE), node_json("ready"))
    first = kazoo_client.create(f"{lock_dir}/a__lock__", b"", sequence=True, makepath=True)
    cache = NodeCache(zkc)
    queued = cache._mirror._tasks
    submitted = submissions(cache._mirror, monkeypatch)
    real = zkc.kazoo.get_children_async
    later: list[str] = []

    def get_children_async(path: str, *args: Any, **kwargs: Any) -> Any:
        result = real(path, *args, **kwargs)
        if path == lock_dir and not later:
            # The listing (with `first`) is answered; before the cache sees the answer,
            # the holder releases and another client locks. Their events reach the
            # cache's queue first: the answer is queued only once this returns.
            assert result.wait(10)
            kazoo_client.delete(first)
            later.append(kazoo_client.create(f"{lock_dir}/b__lock__", b"", sequence=True))
            submitted.until(lambda: queued.qsize() >= 2, 10,
                            message="the two contender events")
        return result

    monkeypatch.setattr(zkc.kazoo, "get_children_async", get_children_async)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        second = later[0].rsplit("/", 1)[1]
        changes.until(lambda: cache.held().get(NODE) == frozenset({second}), 10,
                      message="only the second contender")
        kazoo_client.delete(later[0])
        changes.until(lambda: not cache.is_locked(NODE), 10, message="the unlock")
    finally:
        cache.stop()


def drop_connection(zkc: ZkClient) -> None:
    """Cut the TCP connection under kazoo (the session lives on: kazoo reconnects)."""
    sock = zkc.kazoo._connection._socket
    assert sock is not None
    sock.shutdown(socket.SHUT_RDWR)


@pytest.mark.parametrize("fault", ["dropped connection", "expired session"])
def test_the_watch_is_added_again_after_a_reconnect(
        zk: ZkConnection, zkc: ZkClient, kazoo_client: KazooClient, fault: str) -> None:
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.ensure_path(paths.REQUESTS)
    kazoo_client.create(paths.node_path(NODE), node_json("ready"))
    nodes, requests = NodeCache(zkc), RequestCache(zkc)
    changes = Signal().listen(nodes).listen(requests).listen(zkc)
    nodes.start()
    requests.start()
    try:
        assert nodes.wait_synced(10) and requests.wait_synced(10)
        epoch = zkc.epoch
        if fault == "dropped connection":
            drop_connection(zkc)
        else:
            expire_session(zk, zkc)
            # Deadlines, not expectations: a busy machine delays the reconnect attempts.
            changes.until(lambda: zkc.epoch == epoch + 1, 60, message="the session loss")
        changes.until(lambda: zkc.connected, 60, message="the reconnect")
        changes.until(lambda: nodes.wait_synced(0) and requests.wait_synced(0), 20,
                      message="the resync")
        # Only the watches added again can tell of these.
        lock_once(kazoo_client, nodes, NODE)
        kazoo_client.create(paths.node_path("0000000013"), node_json("building"))
        changes.until(lambda: nodes.get("0000000013") is not None, 10, message="a new node")
        request = kazoo_client.create(f"{paths.REQUESTS}/100-", request_json(),
                                      sequence=True).rsplit("/", 1)[1]
        changes.until(lambda: any(r.id == request for r in requests.requests()), 10,
                      message="a new request")
    finally:
        changes.close()
        nodes.stop()
        requests.stop()


def test_one_shot_watches_when_persistent_ones_are_off(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    zkc.persistent_watches = False  # what a server older than 3.6 leads to
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.create(paths.node_path(NODE), node_json("ready"))
    kazoo_client.ensure_path(paths.node_lock_path(NODE))  # locked once before, as a real one
    cache = NodeCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        assert not cache._mirror._tree
        lock_once(kazoo_client, cache, NODE)
        kazoo_client.create(paths.node_path("0000000014"), node_json("ready"))
        changes.until(lambda: cache.get("0000000014") is not None, 10, message="a new node")
        kazoo_client.delete(paths.node_path(NODE), recursive=True)
        changes.until(lambda: cache.get(NODE) is None, 10, message="the deletion")
    finally:
        cache.stop()


def test_changes_during_a_read_are_read_once_more(
        zkc: ZkClient, kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> None:
    kazoo_client.ensure_path(paths.NODES)
    path = paths.node_path(NODE)
    kazoo_client.create(path, node_json("building"))
    cache = NodeCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        queued = cache._mirror._tasks
        submitted = submissions(cache._mirror, monkeypatch)
        real = zkc.kazoo.get_async
        reads: list[str] = []

        def get_async(read_path: str, *args: Any, **kwargs: Any) -> Any:
            result = real(read_path, *args, **kwargs)
            if read_path == path:
                reads.append(read_path)
                if len(reads) == 1:
                    # Five more writes while the first change's read is in flight.
                    assert result.wait(10)
                    for state in ("ready", "in-use", "used", "ready", "deleting"):
                        kazoo_client.set(path, node_json(state))
                    submitted.until(lambda: queued.qsize() >= 5, 10,
                                    message="five change events")
            return result

        monkeypatch.setattr(zkc.kazoo, "get_async", get_async)
        kazoo_client.set(path, node_json("init"))
        changes.until(lambda: (n := cache.get(NODE)) is not None and n.state == "deleting",
                      10, message="the last state")
        assert len(reads) == 2  # the first change, then once for the five
    finally:
        cache.stop()


def test_an_answer_that_has_the_changes_is_not_read_again(
        zkc: ZkClient, kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write adds one to a znode's version and sends one event: an answer whose
    version counts all the change events seen is current, however they interleave."""
    kazoo_client.ensure_path(paths.NODES)
    cache = NodeCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        queued = cache._mirror._tasks
        submitted = submissions(cache._mirror, monkeypatch)
        real = zkc.kazoo.get_async
        reads: list[str] = []
        path = f"{paths.NODES}/0000000000"  # the first sequential child of a new dir

        def get_async(read_path: str, *args: Any, **kwargs: Any) -> Any:
            if read_path == path:
                reads.append(read_path)
                if len(reads) == 1:
                    # Three writes land before the first read: its answer has them all.
                    for state in ("ready", "in-use", "used"):
                        kazoo_client.set(read_path, node_json(state))
                    submitted.until(lambda: queued.qsize() >= 3, 10,
                                    message="three change events")

            return real(read_path, *args, **kwargs)

        monkeypatch.setattr(zkc.kazoo, "get_async", get_async)
        assert kazoo_client.create(f"{paths.NODES}/", node_json("building"),
                                   sequence=True) == path
        node_id = path.rsplit("/", 1)[1]
        changes.until(lambda: (n := cache.get(node_id)) is not None and n.state == "used", 10,
                      message="the last state")
        kazoo_client.set(path, node_json("deleting"))  # and a later change is read
        changes.until(lambda: (n := cache.get(node_id)) is not None
                      and n.state == "deleting", 10, message="the change after")
        assert len(reads) == 2, reads
    finally:
        cache.stop()


def test_changes_missed_while_the_watch_was_gone_do_not_hide_later_ones(
        zk: ZkConnection, zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """Counts of change events since a child's creation stand for its version only while
    the watch was there throughout: two writes while it was gone (a session expiry) left
    the count two behind, and the next writes looked answered already (a request reset
    to `requested` stayed `pending` in the cache, and no launcher took it again)."""
    kazoo_client.ensure_path(paths.NODES)
    cache = NodeCache(zkc)
    changes = Signal().listen(cache).listen(zkc)
    cache.start()
    try:
        assert cache.wait_synced(10)
        path = kazoo_client.create(f"{paths.NODES}/", node_json("building"), sequence=True)
        node_id = path.rsplit("/", 1)[1]

        def state() -> str | None:
            node = cache.get(node_id)
            return node.state if node is not None else None

        kazoo_client.set(path, node_json("ready"))
        changes.until(lambda: state() == "ready", 10, message="ready")
        held = threading.Event()
        cache._mirror._submit(held.wait, 30)  # the cache's thread waits: no resync yet
        epoch = zkc.epoch
        expire_session(zk, zkc)
        changes.until(lambda: zkc.epoch == epoch + 1 and zkc.connected, 20,
                      message="a new session")
        kazoo_client.set(path, node_json("in-use"))  # unseen: no watch on the new session
        kazoo_client.set(path, node_json("used"))
        held.set()
        changes.until(lambda: state() == "used", 10, message="the resync's read")
        kazoo_client.set(path, node_json("deleting"))
        changes.until(lambda: state() == "deleting", 10, message="the change after the resync")
    finally:
        changes.close()
        cache.stop()
