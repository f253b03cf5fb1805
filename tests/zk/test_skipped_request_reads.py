"""Changes the request cache leaves unread (mirror.py, "Reads skipped"; request locks in
their own tree, `/nodepool/requests-lock/<id>`), on a real ZooKeeper with other sessions
as the writers: a change of a request another session holds locked is counted, not read;
the entry is read once when that lock goes (also when its holder's session ends), or when
someone asks; a decline written under a lock and released in the same transaction is read;
a change made under a lock of this client's own live work is read as it comes.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.requests import RequestStore
from tests.zk.support import drained, write_counted
from tests.helpers import Signal, ZkConnection, client_for


def record(state: str, **extra: Any) -> bytes:
    return json.dumps({"state": state, "node_types": ["small"], "requestor": "zuul",
                       **extra}).encode()


class Request:
    """A request created by `kazoo_client`, locked and written by whichever client."""

    def __init__(self, kazoo_client: KazooClient, cache: RequestCache) -> None:
        self.kazoo, self.cache, self.mirror = kazoo_client, cache, cache._mirror
        self.changes = Signal()  # never removed: the cache lives no longer than the test
        cache.add_listener(self.changes)
        kazoo_client.ensure_path(paths.REQUESTS)
        self.path = kazoo_client.create(f"{paths.REQUESTS}/100-", record("requested"),
                                        sequence=True)
        self.id = self.path.rsplit("/", 1)[1]
        self.lock_dir = paths.request_lock_path(self.id)
        self.until(lambda: self.state() == "requested")

    def until(self, predicate: Any) -> None:
        self.changes.until(predicate, 10, message="the cache to show it")

    def state(self) -> str | None:
        request = self.cache.get(self.id)
        return request.state if request is not None else None

    def lock(self, kazoo: KazooClient | None = None) -> str:
        contender: str = (kazoo or self.kazoo).create(
            f"{self.lock_dir}/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}", ephemeral=True,
            sequence=True, makepath=True)
        self.until(lambda: self.cache.is_locked(self.id))
        return contender

    def write(self, state: str, **extra: Any) -> None:
        """Write a new state and wait until the cache has counted the change (a skipped
        change tells the listeners nothing: polled)."""
        write_counted(self.kazoo, self.mirror, self.id, self.path, record(state, **extra))


@pytest.fixture
def cache(zkc: ZkClient) -> Iterator[RequestCache]:
    cache = RequestCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    assert cache.follows_locks()
    yield cache
    cache.stop()


def test_changes_of_a_request_locked_by_another_session_are_not_read(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    request = Request(kazoo_client, cache)
    request.lock()
    before = cache._mirror.reads
    request.write("pending")
    request.write("fulfilled")
    assert cache._mirror.reads == before
    assert request.state() == "requested"  # the record as read before the lock
    assert cache.stale() == {request.id}
    assert cache.refresh([request.id]) and request.state() == "fulfilled"
    assert cache._mirror.reads == before + 1


def test_a_request_is_read_once_when_the_lock_goes(cache: RequestCache,
                                                   kazoo_client: KazooClient) -> None:
    request = Request(kazoo_client, cache)
    contender = request.lock()
    before = cache._mirror.reads
    request.write("pending")
    request.write("fulfilled")
    kazoo_client.delete(contender)  # the lock dir stays, empty: as after every lock
    request.until(lambda: request.state() == "fulfilled")
    drained(cache._mirror)
    assert cache._mirror.reads == before + 1  # two changes under the lock, one read
    assert cache.stale() == set() and not cache.is_locked(request.id)
    request.write("failed")  # unlocked (an empty lock dir): read as it comes
    request.until(lambda: request.state() == "failed")
    assert cache._mirror.reads == before + 2


def test_a_decline_written_and_released_in_one_transaction_is_read(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    """Another launcher's decline: lock dir and contender created, `declined_by` written
    and the contender deleted in one transaction; the request is `requested` again."""
    request = Request(kazoo_client, cache)
    contender = f"{request.lock_dir}/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}0000000000"
    kazoo_client.ensure_path(paths.REQUEST_LOCKS)
    txn = kazoo_client.transaction()
    txn.create(request.lock_dir, b"")
    txn.create(contender, b"", ephemeral=True)
    txn.set_data(request.path, record("requested", declined_by=["other-pool"]))
    txn.delete(contender)
    assert not any(isinstance(result, Exception) for result in txn.commit())
    request.until(lambda: (cache.get(request.id) or pytest.fail("gone")).declined_by
                  == ["other-pool"])
    assert request.state() == "requested" and cache.stale() == set()


def test_a_request_whose_holder_dies_is_read(cache: RequestCache, zk: ZkConnection,
                                             kazoo_client: KazooClient) -> None:
    other = client_for(zk)
    try:
        request = Request(kazoo_client, cache)
        request.lock(other.kazoo)
        request.write("pending")
        assert request.state() == "requested" and cache.stale() == {request.id}
    finally:
        other.stop()  # its session ends: its ephemeral contender goes
    request.until(lambda: request.state() == "pending" and not cache.is_locked(request.id))
    assert cache.stale() == set()


def test_changes_under_our_own_lock_are_read(cache: RequestCache, zkc: ZkClient,
                                             kazoo_client: KazooClient) -> None:
    request = Request(kazoo_client, cache)
    held = RequestStore(zkc).lock(request.id)
    assert held is not None
    try:
        request.until(lambda: cache.is_locked(request.id))
        before = cache._mirror.reads
        request.write("pending")  # not ours, but under our lock: nobody else reads it
        request.until(lambda: request.state() == "pending")
        assert cache._mirror.reads == before + 1
    finally:
        held.release()
