"""Changes the node cache leaves unread (mirror.py, "Reads skipped"), on a real ZooKeeper
with another session as the writer: a change of a node another session holds locked is
counted, not read; the entry is stale until the lock goes (then one read brings every
change made under it) or someone asks (`refresh`: one read, shared by concurrent askers);
a node left to its builder (`left_to_builder`) stays stale after the lock goes, until
asked, and the cache tells since when it has been left so without a lock (`left_unread`,
on the owner's clock).
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any, Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.client import ZkClient
from tests.zk.support import drained, held_up, write_counted
from tests.helpers import Signal, submissions


def record(state: str, **extra: Any) -> bytes:
    return json.dumps({"state": state, "type": ["small"], "provider": "p", "pool": "main",
                       **extra}).encode()


class Other:
    """Another session's node: created, locked, written and unlocked by `kazoo_client`."""

    def __init__(self, kazoo_client: KazooClient, cache: NodeCache, **extra: Any) -> None:
        self.kazoo, self.cache, self.mirror = kazoo_client, cache, cache._mirror
        self.changes = Signal()  # never removed: the cache lives no longer than the test
        cache.add_listener(self.changes)
        kazoo_client.ensure_path(paths.NODES)
        self.path = kazoo_client.create(f"{paths.NODES}/", record("building", **extra),
                                        sequence=True)
        self.id = self.path.rsplit("/", 1)[1]
        self.contender: str | None = None
        self.until(lambda: self.state() == "building")

    def until(self, predicate: Any) -> None:
        self.changes.until(predicate, 10, message="the cache to show it")

    def state(self) -> str | None:
        node = self.cache.get(self.id)
        return node.state if node is not None else None

    def lock(self) -> None:
        self.contender = self.kazoo.create(
            f"{self.path}/lock/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}", ephemeral=True,
            sequence=True, makepath=True)
        self.until(lambda: self.cache.is_locked(self.id))

    def unlock(self) -> None:
        assert self.contender is not None
        self.kazoo.delete(self.contender)
        self.contender = None

    def write(self, state: str, **extra: Any) -> None:
        """Write a new state and wait until the cache has counted the change (a skipped
        change tells the listeners nothing: polled)."""
        write_counted(self.kazoo, self.mirror, self.id, self.path, record(state, **extra))


@pytest.fixture
def cache(zkc: ZkClient) -> Iterator[NodeCache]:
    cache = NodeCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


def test_changes_of_a_node_locked_by_another_session_are_not_read(
        cache: NodeCache, kazoo_client: KazooClient) -> None:
    node = Other(kazoo_client, cache)
    node.lock()
    before = cache._mirror.reads
    node.write("ready")
    node.write("in-use")
    assert cache._mirror.reads == before
    assert node.state() == "building"  # the record as read before the lock
    assert cache.stale() == {node.id}


def test_a_stale_entry_is_read_once_on_demand(cache: NodeCache,
                                              kazoo_client: KazooClient) -> None:
    node = Other(kazoo_client, cache)
    node.lock()
    node.write("ready")
    node.write("in-use")
    before = cache._mirror.reads
    answers: list[bool] = []
    askers = [threading.Thread(target=lambda: answers.append(cache.refresh()))
              for _ in range(2)]
    askers.append(threading.Thread(target=lambda: answers.append(cache.refresh([node.id]))))
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(15)
    assert answers == [True, True, True]
    assert node.state() == "in-use"
    assert cache.stale() == set()
    assert cache._mirror.reads == before + 1  # three askers, one read
    assert cache.refresh() and cache._mirror.reads == before + 1  # current: no read


def test_the_entry_is_current_once_the_lock_goes(cache: NodeCache,
                                                 kazoo_client: KazooClient) -> None:
    node = Other(kazoo_client, cache)
    node.lock()
    before = cache._mirror.reads
    node.write("ready")
    node.write("in-use")
    node.write("used")
    node.unlock()
    node.until(lambda: node.state() == "used")
    drained(cache._mirror)
    assert cache._mirror.reads == before + 1  # three changes under the lock, one read
    assert cache.stale() == set()
    node.write("deleting")  # unlocked: read as it comes
    node.until(lambda: node.state() == "deleting")


def test_a_node_left_to_its_builder_is_read_only_when_asked(
        cache: NodeCache, kazoo_client: KazooClient) -> None:
    cache.left_to_builder = lambda n: n.launcher == "theirs" and bool(n.allocated_to)
    node = Other(kazoo_client, cache, launcher="theirs", allocated_to="200-0000000001")
    spare = Other(kazoo_client, cache, launcher="theirs")  # no request: may be handed out
    before = cache._mirror.reads
    node.lock()
    node.write("ready", launcher="theirs", allocated_to="200-0000000001")
    node.unlock()
    node.write("used", launcher="theirs", allocated_to="200-0000000001")
    node.until(lambda: not cache.is_locked(node.id))
    drained(cache._mirror)
    assert cache._mirror.reads == before
    assert node.state() == "building" and cache.stale() == {node.id}
    spare.write("ready", launcher="theirs")  # not left to the builder: read at once
    spare.until(lambda: spare.state() == "ready")
    assert cache.refresh([node.id]) and node.state() == "used"
    assert cache._mirror.reads == before + 2


def test_a_node_left_unread_tells_since_when_it_is_so_without_a_lock(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """The time of the last change left unread, or of the lock's going after changes made
    under it, whichever is later (the cleanup reads such an entry a grace after it); a
    locked entry is not listed until its lock goes, a read one no longer."""
    clock = ManualClock()
    cache = NodeCache(zkc, clock.monotonic)
    cache.left_to_builder = lambda n: n.launcher == "theirs" and bool(n.allocated_to)
    cache.start()
    try:
        assert cache.wait_synced(10)
        node = Other(kazoo_client, cache, launcher="theirs", allocated_to="200-0000000001")
        ours = Other(kazoo_client, cache, launcher="ours", allocated_to="200-0000000002")
        assert cache.left_unread() == {}
        start = clock.monotonic()
        node.lock()
        ours.lock()
        node.write("ready", launcher="theirs", allocated_to="200-0000000001")
        ours.write("ready", launcher="ours", allocated_to="200-0000000002")
        assert cache.left_unread() == {}  # both locked: timed from their release
        clock.advance(5)
        node.unlock()
        ours.unlock()  # not left to anyone: read once its lock goes
        ours.until(lambda: ours.state() == "ready")
        drained(cache._mirror)
        assert cache.left_unread() == {node.id: start + 5}
        clock.advance(5)
        node.write("used", launcher="theirs", allocated_to="200-0000000001")
        assert cache.left_unread() == {node.id: start + 10}
        assert cache.refresh([node.id]) and node.state() == "used"
        assert cache.left_unread() == {}
    finally:
        cache.stop()


def test_a_refresh_with_nothing_behind_costs_no_trip_through_the_mirrors_thread(
        cache: NodeCache, kazoo_client: KazooClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Callers ask for their whole scope (min-ready, reclaim, the quota yield): current
    entries must not cost each of them a task on the mirror's thread and a wait."""
    node = Other(kazoo_client, cache)
    tasks: list[object] = []  # the refreshes handed to the mirror's thread
    submit = cache._mirror._submit

    def recording(fn: Any, *args: Any) -> None:
        if fn == cache._mirror._on_refresh:
            tasks.append(args)
        submit(fn, *args)
    monkeypatch.setattr(cache._mirror, "_submit", recording)

    assert cache.refresh([node.id])
    assert tasks == []

    node.lock()
    node.write("ready")
    assert cache.refresh([node.id])
    assert len(tasks) == 1 and node.state() == "ready"


def test_a_refresh_is_current_as_of_an_answer_read_before_it(
        cache: NodeCache, zkc: ZkClient, kazoo_client: KazooClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A change whose event came before an answer the caller holds, but still waits on the
    mirror's queue, is not `behind` yet: a refresh of that child must wait for it and read
    it, not answer at once from the older record. (min-ready read another launcher's
    request fresh as fulfilled while its node, turned ready under that launcher's lock,
    waited so: counted `building`, it was no spare, and a third spare was built.)"""
    node = Other(kazoo_client, cache)
    node.lock()
    answers: list[bool] = []
    asked = submissions(cache._mirror, monkeypatch)

    def ask() -> None:
        answers.append(cache.refresh([node.id]))
        asked()
    asker = threading.Thread(target=ask)
    go = held_up(cache._mirror)
    try:
        kazoo_client.set(node.path, record("ready"))
        # Our own session's answer about the node: its change event came before it.
        [(_, item)] = zkc.get_many([node.path])
        assert item is not None and json.loads(item[0])["state"] == "ready"
        assert not cache._mirror.behind(node.id)  # the event waits behind the held thread
        queued = asked.count
        asker.start()
        # It answers at once (the old record) or hands its task to the held thread.
        asked.until(lambda: answers or asked.count > queued, 10,
                    message="the refresh to answer or queue")
    finally:
        go.set()
    asker.join(15)
    assert answers == [True]
    assert node.state() == "ready"
