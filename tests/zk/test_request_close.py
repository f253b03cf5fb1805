"""Closing a request removes its lock dir, and other request caches read nothing of the
close (zk/requests.py; zk/mirror.py, "Closed by the taker"), on a real ZooKeeper.

The store: a request written `fulfilled` or `failed` with its lock released loses its lock
dir in the same transaction (also in the one-transaction lock-write-release of a fresh
lock); a decline (`requested` again) keeps it; a close that meets another contender in
the dir still closes the request, keeps the dir and leaves that contender's lock to it.
An optional deletion refused because its znode is gone is dropped from the transaction.

The cache: a request closed under another session's lock (the change, the contender's
deletion and the dir's deletion in one transaction) is not read at the lock's release; it
stays stale, flagged closed, until someone asks. Nothing is inferred when the dir's event
comes after the read went out, and a closed entry someone locks and writes again is read.
"""

from __future__ import annotations

import json
import threading
from typing import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock
from kazoo.security import make_acl, make_digest_acl

from nodepool_k8s.core import model
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.requests import RequestStore
from nodepool_k8s.zk.txn import Txn
from tests.helpers import ZkConnection, wait_for
from tests.zk.support import drained, held_up, queued_event_of
from tests.zk.test_skipped_request_reads import Request, record


@pytest.fixture
def cache(zkc: ZkClient) -> Iterator[RequestCache]:
    cache = RequestCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    assert cache.follows_locks()
    yield cache
    cache.stop()


def new_request(kazoo: KazooClient) -> str:
    kazoo.ensure_path(paths.REQUESTS)
    kazoo.ensure_path(paths.REQUEST_LOCKS)  # a launcher makes it at its start
    path: str = kazoo.create(f"{paths.REQUESTS}/100-", record("requested"), sequence=True)
    return path.rsplit("/", 1)[1]


def lock_dir_exists(kazoo: KazooClient, request_id: str) -> bool:
    return kazoo.exists(paths.request_lock_path(request_id)) is not None


def state_of(kazoo: KazooClient, request_id: str) -> str:
    state: str = json.loads(kazoo.get(paths.request_path(request_id))[0])["state"]
    return state


@pytest.mark.parametrize("state", [model.RequestState.FULFILLED, model.RequestState.FAILED])
def test_a_closing_write_removes_the_lock_dir(zkc: ZkClient, kazoo_client: KazooClient,
                                              state: model.RequestState) -> None:
    store = RequestStore(zkc)
    request_id = new_request(kazoo_client)
    got = store.lock_and_read(request_id)
    assert got is not None
    held, request = got
    request.state = model.RequestState.PENDING
    store.store(request, held)  # under the lock: the dir stays
    assert lock_dir_exists(kazoo_client, request_id)
    request.state = state
    store.store(request, held, release=True)
    assert held.released and not lock_dir_exists(kazoo_client, request_id)
    assert state_of(kazoo_client, request_id) == state


def test_a_fresh_lock_that_fails_the_request_leaves_no_lock_dir(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """A decline by the last pool fails the request: lock dir and contender created, the
    request written and both deleted again, in one transaction."""
    store = RequestStore(zkc)
    request_id = new_request(kazoo_client)
    request = store.get(request_id)
    assert request is not None
    request.state = model.RequestState.FAILED
    held = store.store_fresh(request, release=True)
    assert held is not None and held.released
    assert not lock_dir_exists(kazoo_client, request_id)
    assert state_of(kazoo_client, request_id) == "failed"


def test_a_decline_keeps_the_lock_dir(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    store = RequestStore(zkc)
    fresh_id, locked_id = new_request(kazoo_client), new_request(kazoo_client)
    request = store.get(fresh_id)
    assert request is not None
    request.declined_by = ["some-pool"]
    assert store.store_fresh(request, release=True) is not None
    got = store.lock_and_read(locked_id)
    assert got is not None
    held, locked = got
    locked.declined_by = ["some-pool"]
    store.store(locked, held, release=True)
    for request_id in (fresh_id, locked_id):
        assert lock_dir_exists(kazoo_client, request_id)
        assert not kazoo_client.get_children(paths.request_lock_path(request_id))
        assert state_of(kazoo_client, request_id) == "requested"


def test_a_close_meeting_another_contender_keeps_the_dir_and_its_lock(
        zkc: ZkClient, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """Another client (kazoo's own lock recipe, as Zuul revising the request) waits in the
    lock dir while we close the request: the close still applies (one more transaction,
    without the dir's deletion), and the waiter gets the lock."""
    store = RequestStore(zkc)
    request_id = new_request(kazoo_client)
    got = store.lock_and_read(request_id)
    assert got is not None
    held, request = got
    waiter = Lock(kazoo_client, paths.request_lock_path(request_id))
    acquired = threading.Event()

    def wait_for_the_lock() -> None:
        if waiter.acquire(blocking=True, timeout=20):
            acquired.set()

    thread = threading.Thread(target=wait_for_the_lock, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(kazoo_client.get_children(paths.request_lock_path(request_id)))
                 == 2, 10, message="the waiter's contender")
        writes = zkc.writes.snapshot()[0]
        request.state = model.RequestState.FULFILLED
        store.store(request, held, release=True)
        assert held.released and state_of(kazoo_client, request_id) == "fulfilled"
        assert zkc.writes.snapshot()[0] == writes + 2  # refused, then without the dir
        assert acquired.wait(10) and waiter.is_acquired
        assert lock_dir_exists(kazoo_client, request_id)
    finally:
        if waiter.is_acquired:
            waiter.release()
        waiter.cancel()
        thread.join(10)


def test_an_optional_deletion_of_a_missing_znode_is_dropped(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path("/a/child")
    txn = Txn()
    txn.set("/a", b"x")
    txn.delete("/gone", optional=True)
    results = txn.commit(zkc)
    assert results[1] is None and results[0].version == 1
    assert kazoo_client.get("/a")[0] == b"x"
    txn = Txn()
    txn.set("/a", b"y")
    txn.delete("/a", optional=True)  # has a child: refused, and dropped
    assert txn.commit(zkc)[0].version == 2
    txn = Txn()
    txn.set("/a", b"z")
    txn.delete("/gone")  # not optional: the transaction fails as before
    with pytest.raises(errors.TxnFailed):
        txn.commit(zkc)
    assert kazoo_client.get("/a")[0] == b"y"


def close_as_another_session(kazoo: KazooClient, request: Request, contender: str,
                             state: str = "fulfilled", remove_dir: bool = True) -> None:
    txn = kazoo.transaction()
    txn.set_data(request.path, record(state))
    txn.delete(contender)
    if remove_dir:
        txn.delete(request.lock_dir)
    assert not any(isinstance(result, Exception) for result in txn.commit())


def test_a_request_closed_under_another_sessions_lock_is_not_read(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    request = Request(kazoo_client, cache)
    contender = request.lock()
    request.write("pending")
    mirror = cache._mirror
    before = mirror.reads
    go = held_up(mirror)
    close_as_another_session(kazoo_client, request, contender)
    # The change, the contender's deletion and (last) the dir's deletion, all queued.
    wait_for(lambda: queued_event_of(mirror, request.lock_dir), 10,
             message="the close's events")
    go.set()
    drained(mirror)
    drained(mirror)  # the read scheduled at the release, had it gone out
    assert not cache.is_locked(request.id) and cache.is_closed(request.id)
    assert mirror.reads == before and mirror.closings == 1
    assert request.state() == "requested" and cache.stale() == {request.id}
    assert cache.closed() == [request.id]
    # Asked for, it is read: what ZooKeeper has, and no longer flagged.
    assert cache.refresh([request.id]) and request.state() == "fulfilled"
    assert mirror.reads == before + 1 and not cache.is_closed(request.id)


def test_a_dir_deleted_after_the_release_read_went_out_closes_nothing(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    request = Request(kazoo_client, cache)
    contender = request.lock()
    request.write("pending")
    close_as_another_session(kazoo_client, request, contender, remove_dir=False)
    request.until(lambda: request.state() == "fulfilled")
    kazoo_client.delete(request.lock_dir)  # current entry: nothing to infer
    drained(cache._mirror)
    wait_for(lambda: kazoo_client.exists(request.lock_dir) is None, 10)
    drained(cache._mirror)
    assert not cache.is_closed(request.id) and cache._mirror.closings == 0


def test_a_closed_request_locked_and_written_again_is_read(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    """A close wrongly inferred (someone deleted the dir while the request stays open):
    the next lock on it and the change under it are read at that lock's release."""
    request = Request(kazoo_client, cache)
    contender = request.lock()
    request.write("pending")
    go = held_up(cache._mirror)
    close_as_another_session(kazoo_client, request, contender, state="requested")
    wait_for(lambda: queued_event_of(cache._mirror, request.lock_dir), 10,
             message="the close's events")
    go.set()
    drained(cache._mirror)
    assert cache.is_closed(request.id)
    contender = request.lock()
    assert not cache.is_closed(request.id)
    request.write("pending")
    kazoo_client.delete(contender)
    request.until(lambda: request.state() == "pending" and not cache.is_locked(request.id))
    assert not cache.is_closed(request.id) and cache.stale() == set()


def test_our_own_lock_contends_after_the_dir_is_gone(zkc: ZkClient, other: ZkClient,
                                                     kazoo_client: KazooClient) -> None:
    """A request whose taker removed the lock dir can be locked again (the dir is made
    anew) and is found closed; nothing is left locked."""
    store = RequestStore(zkc)
    request_id = new_request(kazoo_client)
    theirs = RequestStore(other)
    got = theirs.lock_and_read(request_id)
    assert got is not None
    held, request = got
    request.state = model.RequestState.FULFILLED
    theirs.store(request, held, release=True)
    assert not lock_dir_exists(kazoo_client, request_id)
    assert not store.held_elsewhere(request_id)
    found = store.lock_and_read(request_id, look_first=True)
    assert found is not None and found[1].state == model.RequestState.FULFILLED
    found[0].release()
    assert not kazoo_client.get_children(paths.request_lock_path(request_id))


def test_an_optional_deletion_refused_for_access_is_dropped(
        zkc: ZkClient, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """A lock dir whose parent another identity's ACL guards (we may create in it, not
    delete): the close goes through without removing it."""
    owner = KazooClient(hosts=zk.hosts, auth_data=[("digest", "owner:secret")])
    owner.start(timeout=15)
    try:
        acl = [make_digest_acl("owner", "secret", all=True),
               make_acl("world", "anyone", read=True, write=True, create=True)]
        owner.create("/guarded", b"", acl=acl)
        owner.create("/guarded/dir", b"")
    finally:
        owner.stop()
        owner.close()
    kazoo_client.ensure_path("/a")
    txn = Txn()
    txn.set("/a", b"x")
    txn.delete("/guarded/dir", optional=True)
    assert txn.commit(zkc)[1] is None
    assert kazoo_client.get("/a")[0] == b"x" and kazoo_client.exists("/guarded/dir")
