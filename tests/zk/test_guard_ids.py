"""A quota decision's node ids from the node cache instead of a listing of
`/nodepool/nodes` (zk/quota_guard.py, "Which nodes exist"), against a real ZooKeeper.

Aspects: a node another session created in a guarded commit just before our guard read is
among the ids (no under-count), decision after decision, without a listing; so are nodes
created while the connection was down, once the cache has listed again; and the listing is
read whenever the chain of the argument does not hold: one-shot watches, a cache not
started or stopped, a cache resyncing, an answer on another connection than the cache's.
"""

from __future__ import annotations

import threading

import pytest

from nodepool_k8s.core import model, quota
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.quota_guard import QuotaGuard
from nodepool_k8s.zk.txn import Txn
from tests.helpers import Signal, wait_for
from tests.zk.support import Listings
from tests.zk.test_persistent_watch import drop_connection

GUARD = paths.provider_guard_path("p")


def guarded_create(zkc: ZkClient) -> str:
    """One node created as a launcher does: with the guard bumped in the same commit."""
    guard = QuotaGuard(zkc)
    versions = guard.read([GUARD])
    txn = Txn()
    node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
    node.set(provider="p", pool="main")
    index = NodeStore.add_create(txn, node)
    QuotaGuard.add_bumps(txn, versions)
    return NodeStore.created_id(txn.commit(zkc)[index])


def started(zkc: ZkClient) -> NodeCache:
    zkc.ensure_path(paths.NODES)
    QuotaGuard(zkc).read([GUARD])  # the guard exists, as after a first decision
    cache = NodeCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    return cache


def usage(guard: QuotaGuard, cache: NodeCache, ids: list[str]) -> list[quota.UsageRecord]:
    return guard.usage(cache, lambda node: None, ids=ids)


def hold(cache: NodeCache) -> threading.Event:
    """Keep the cache's thread busy until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def holding() -> None:
        held.set()
        release.wait(30)
    cache._mirror._tasks.put((holding, ()))
    assert held.wait(10)
    return release


def test_a_node_created_just_before_the_guard_read_is_counted_without_a_listing(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        listings = Listings(zkc, monkeypatch)
        made: list[str] = []
        for _ in range(30):
            # The cache's thread busy meanwhile: the creation's event waits there behind
            # it; only the names kept on kazoo's connection thread have it.
            release = hold(cache)
            try:
                made.append(guarded_create(other))
                # The guard read, not counted (zk/guard_versions.py; as after a decision's
                # second failed commit): its answer is what the ids are ordered after.
                guard.conflicted(GUARD, len(made) - 1, again=True)
                versions, ids = guard.read_listing([GUARD])
            finally:
                release.set()
            assert made[-1] in ids
            assert versions[GUARD] == len(made)
            assert len(usage(guard, cache, ids)) == len(made)
        assert listings.count == 0
        assert guard.mirrored == 30 and guard.listings == 0
    finally:
        cache.stop()


def test_nodes_created_while_disconnected_are_counted_after_the_resync(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)
    changes = Signal().listen(cache).listen(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        first = guarded_create(other)
        drop_connection(zkc)
        during = guarded_create(other)
        changes.until(lambda: zkc.connected, 60, message="the reconnect")
        # The resync done: listed on the new connection and every listed node read.
        changes.until(lambda: cache.ids_through(zkc.connections) is not None, 20,
                      message="the resync")
        # A busy machine may see a second reconnect (a retried handshake) after the first:
        # that read falls back to the listing, rightly; look again on a steady connection.
        made = [first, during]
        for _ in range(5):
            connection = zkc.connections
            changes.until(lambda: cache.ids_through(zkc.connections) is not None, 20,
                          message="the resync")
            listings = Listings(zkc, monkeypatch)
            made.append(guarded_create(other))
            versions, ids = guard.read_listing([GUARD])
            assert set(made) <= set(ids) and versions[GUARD] == len(made)
            if zkc.connections == connection:
                break
        assert zkc.connections == connection, "the connection never held still"
        assert listings.count == 0
    finally:
        changes.close()
        cache.stop()


def test_events_during_the_resync_listing_are_applied_to_it(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node created and one deleted after the resync's listing was answered, before the
    cache took it in: their events, logged meanwhile, are applied to the listing."""
    zkc.ensure_path(paths.NODES)
    QuotaGuard(zkc).read([GUARD])
    gone = guarded_create(other)
    cache = NodeCache(zkc)
    mirror = cache._mirror
    original = mirror._listed
    made: list[str] = []

    def listed(present: set[str] | None, connection: int) -> None:
        if present is not None and not made:
            assert gone in present
            made.append(guarded_create(other))
            other.delete(paths.node_path(gone))
            wait_for(lambda: len(mirror._names_log or []) >= 2, 10)
        original(present, connection)
    monkeypatch.setattr(mirror, "_listed", listed)
    cache.start()
    try:
        assert cache.wait_synced(10)
        ids = cache.ids_through(zkc.connections)
        assert ids is not None and made[0] in ids and gone not in ids
    finally:
        cache.stop()


def listed(zkc: ZkClient, other: ZkClient, guard: QuotaGuard, listings: Listings) -> None:
    """A decision reads the listing, which shows the node just created."""
    before = listings.count
    made = guarded_create(other)
    versions, ids = guard.read_listing([GUARD])
    assert made in ids and versions[GUARD] == (zkc.exists(GUARD) or pytest.fail()).version
    assert listings.count == before + 1


def test_one_shot_watches_read_the_listing(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    zkc.persistent_watches = False  # what a server older than 3.6 leads to
    cache = started(zkc)
    try:
        listed(zkc, other, QuotaGuard(zkc, nodes=cache), Listings(zkc, monkeypatch))
    finally:
        cache.stop()


def test_a_cache_not_started_or_stopped_reads_the_listing(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    zkc.ensure_path(paths.NODES)
    QuotaGuard(zkc).read([GUARD])
    listings = Listings(zkc, monkeypatch)
    cache = NodeCache(zkc)
    listed(zkc, other, QuotaGuard(zkc, nodes=cache), listings)
    cache.start()
    assert cache.wait_synced(10)
    cache.stop()
    listed(zkc, other, QuotaGuard(zkc, nodes=cache), listings)


def test_an_answer_on_another_connection_reads_the_listing(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        listings = Listings(zkc, monkeypatch)
        # What a reconnect counts before the cache's resync has listed on the new
        # connection: the events before the answer may have been missed.
        monkeypatch.setattr(zkc, "_connections", zkc.connections + 1)
        listed(zkc, other, guard, listings)
    finally:
        cache.stop()


def test_a_resyncing_cache_reads_the_listing(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a reconnect, until the cache's resync has listed on the new connection and
    read what it lists (its thread held here before the resync runs)."""
    cache = started(zkc)
    changes = Signal().listen(zkc)
    release = hold(cache)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        listings = Listings(zkc, monkeypatch)
        connection = zkc.connections
        drop_connection(zkc)
        changes.until(lambda: zkc.connected and zkc.connections > connection, 60,
                      message="the reconnect")
        listed(zkc, other, guard, listings)
    finally:
        release.set()
        changes.close()
        cache.stop()


def test_the_cache_must_follow_the_guards_client(zkc: ZkClient, other: ZkClient) -> None:
    with pytest.raises(ValueError):
        QuotaGuard(zkc, nodes=NodeCache(other))
