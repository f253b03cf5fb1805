"""A new request left unread for another launcher's first look (zk/mirror.py, "First
look"), on a real ZooKeeper, the look's time on a manual clock.

While the look runs the creation and any change are not read; the request is known to
exist (`in`, `unread`, stale) without a record. Taken and closed by another session within
the look, it is never read. When the look ends it is read, unless someone holds its lock
then: it is read when that lock goes without closing it. Asked for (`refresh`), it is read
at once. A look of 0 reads it at once, as before.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import RequestCache
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import wait_for
from tests.zk.support import drained
from tests.zk.test_persistent_watch import drop_connection
from tests.zk.test_skipped_request_reads import record

LOOK = 5.0
OVER: list[tuple[str, bool]] = []  # how each look ended, as the cache tells its owner


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def cache(zkc: ZkClient, clock: ManualClock) -> Iterator[RequestCache]:
    cache = RequestCache(zkc, monotonic=clock.monotonic)
    looks = {"100": LOOK}  # by priority: "200" requests are read at once
    cache.first_look = lambda request_id: looks.get(request_id.split("-", 1)[0], 0.0)
    cache.look_over = lambda request_id, taken: OVER.append((request_id, taken))
    OVER.clear()
    cache.start()
    assert cache.wait_synced(10)
    assert cache.follows_locks()
    yield cache
    cache.stop()


def create(kazoo: KazooClient, priority: str = "100") -> str:
    kazoo.ensure_path(paths.REQUEST_LOCKS)
    path: str = kazoo.create(f"{paths.REQUESTS}/{priority}-", record("requested"),
                             sequence=True, makepath=True)
    return path.rsplit("/", 1)[1]


def created_seen(cache: RequestCache, request_id: str) -> None:
    wait_for(lambda: request_id in cache, 10, message="the creation's event")
    drained(cache._mirror)


def lock(kazoo: KazooClient, request_id: str) -> str:
    path: str = kazoo.create(
        f"{paths.request_lock_path(request_id)}/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}",
        ephemeral=True, sequence=True, makepath=True)
    return path


def looking(cache: RequestCache, kazoo: KazooClient) -> tuple[int, str]:
    """A new request in its first look: the cache's reads before it, and its id."""
    before = cache._mirror.reads
    request_id = create(kazoo)
    created_seen(cache, request_id)
    return before, request_id


def end_look(cache: RequestCache, clock: ManualClock) -> None:
    clock.advance(LOOK + 0.1)
    drained(cache._mirror)  # the mirror's thread looks at the ends after each task


def test_a_new_request_is_not_read_during_its_first_look(
        cache: RequestCache, kazoo_client: KazooClient, clock: ManualClock) -> None:
    mirror = cache._mirror
    before, request_id = looking(cache, kazoo_client)
    assert mirror.reads == before
    assert request_id in cache and cache.unread() == [request_id]
    assert cache.get(request_id) is None and request_id not in {r.id for r in cache.requests()}
    assert cache.is_stale(request_id) and cache.stale() == {request_id}
    kazoo_client.set(paths.request_path(request_id), record("requested", relative_priority=1))
    wait_for(lambda: mirror._changes.get(request_id) == 1, 10, message="the change counted")
    drained(mirror)
    assert mirror.reads == before  # a change during the look is not read either
    end_look(cache, clock)
    wait_for(lambda: cache.get(request_id) is not None, 10, message="the read at its end")
    assert mirror.reads == before + 1 and not cache.unread()
    request = cache.get(request_id)
    assert request is not None and request.relative_priority == 1
    assert OVER == [(request_id, False)]  # nobody took it in time


def test_a_request_taken_and_closed_within_the_look_is_never_read(
        cache: RequestCache, kazoo_client: KazooClient, clock: ManualClock) -> None:
    mirror = cache._mirror
    before, request_id = looking(cache, kazoo_client)
    contender = lock(kazoo_client, request_id)
    kazoo_client.set(paths.request_path(request_id), record("pending"))
    wait_for(lambda: cache.held_elsewhere(request_id), 10, message="the lock seen")
    txn = kazoo_client.transaction()
    txn.set_data(paths.request_path(request_id), record("fulfilled"))
    txn.delete(contender)
    txn.delete(paths.request_lock_path(request_id))
    assert not any(isinstance(r, Exception) for r in txn.commit())
    wait_for(lambda: cache.is_closed(request_id), 10, message="taken as closed")
    assert OVER == [(request_id, True)]
    end_look(cache, clock)
    assert OVER == [(request_id, True)]  # told once
    drained(cache._mirror)
    assert mirror.reads == before and cache.is_closed(request_id)
    assert request_id in cache and cache.unread() == [request_id]
    kazoo_client.delete(paths.request_path(request_id))
    wait_for(lambda: request_id not in cache, 10, message="its deletion")
    assert mirror.reads == before and not cache.unread() and not cache.closed()


def test_a_request_locked_when_the_look_ends_is_read_when_the_lock_goes(
        cache: RequestCache, kazoo_client: KazooClient, clock: ManualClock) -> None:
    """Another launcher took it and gave it back (declined: `requested` again, its lock
    released, the dir kept): read then, and served by whoever may."""
    mirror = cache._mirror
    before, request_id = looking(cache, kazoo_client)
    contender = lock(kazoo_client, request_id)
    wait_for(lambda: cache.is_locked(request_id), 10, message="the lock seen")
    end_look(cache, clock)
    assert mirror.reads == before and cache.unread() == [request_id]
    assert OVER == [(request_id, True)]  # someone holds it: taken
    txn = kazoo_client.transaction()
    txn.set_data(paths.request_path(request_id), record("requested", declined_by=["p"]))
    txn.delete(contender)
    assert not any(isinstance(r, Exception) for r in txn.commit())
    wait_for(lambda: cache.get(request_id) is not None, 10, message="the read at release")
    request = cache.get(request_id)
    assert request is not None and request.declined_by == ["p"]
    assert mirror.reads == before + 1 and not cache.is_closed(request_id)


def test_refresh_reads_a_request_during_its_look(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    mirror = cache._mirror
    request_id = create(kazoo_client)
    created_seen(cache, request_id)
    before = mirror.reads
    assert cache.refresh([request_id], timeout=10)
    assert cache.get(request_id) is not None and mirror.reads == before + 1
    assert not cache.unread() and not cache.is_stale(request_id)


def test_a_request_without_a_look_is_read_at_once(
        cache: RequestCache, kazoo_client: KazooClient) -> None:
    mirror = cache._mirror
    before = mirror.reads
    request_id = create(kazoo_client, priority="200")
    wait_for(lambda: cache.get(request_id) is not None, 10, message="the creation read")
    assert mirror.reads == before + 1 and not cache.unread()


def test_a_reconnect_reads_requests_left_to_a_look(
        cache: RequestCache, kazoo_client: KazooClient, zkc: ZkClient) -> None:
    request_id = create(kazoo_client)
    created_seen(cache, request_id)
    assert cache.unread() == [request_id]
    drop_connection(zkc)  # the session lives on: kazoo reconnects, the cache resyncs
    wait_for(lambda: cache.get(request_id) is not None, 60, message="the resync's read")
    assert not cache.unread()
