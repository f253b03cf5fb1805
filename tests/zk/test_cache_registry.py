"""Caches, component registry and connection states against a real ZooKeeper.

Aspects: cache listeners fire on create/update/delete and lock-contender changes within
milliseconds; malformed znodes are skipped with their path logged; empty node znodes are
remembered; the request cache records ephemeral owners; component JSON has sorted keys and
the fields Zuul reads; versioned updates; session expiry bumps the epoch, the registry
re-creates its ephemeral znodes and the caches re-sync (deletions made meanwhile seen).
"""

from __future__ import annotations

import json
import logging
import threading

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import CacheEvent, ComponentCache, NodeCache, RequestCache
from nodepool_k8s.zk.client import ConnectionState, ZkClient
from nodepool_k8s.zk.registry import ComponentRegistry, pool_worker_id
from tests.helpers import Signal, ZkConnection
from tests.sessions import expire_session


def node_json(state: str = "ready", **extra: object) -> bytes:
    return json.dumps({"state": state, "type": ["small"], "provider": "p", **extra}).encode()


def test_node_cache_events_and_contenders(zkc: ZkClient, kazoo_client: KazooClient,
                                          caplog: pytest.LogCaptureFixture) -> None:
    cache = NodeCache(zkc)
    seen: list[tuple[CacheEvent, str]] = []
    changed = threading.Event()

    def listener(kind: CacheEvent, key: str) -> None:
        seen.append((kind, key))
        changed.set()

    cache.add_listener(listener)
    changes = Signal().listen(cache)
    kazoo_client.ensure_path(paths.NODES)
    # Nodes are born in `init` without a lock dir; the cache watches for the dir.
    kazoo_client.create(paths.node_path("0000000001"),
                        node_json("init", allocated_to="200-1"))
    cache.start()
    try:
        assert cache.wait_synced(10)
        node = cache.get("0000000001")
        assert node is not None and node.state == "init"
        assert cache.allocated_to("200-1") == ["0000000001"]
        lock = Lock(kazoo_client, paths.node_lock_path("0000000001"))
        lock.acquire()
        changes.until(lambda: cache.is_locked("0000000001"))
        kazoo_client.set(paths.node_path("0000000001"), node_json("in-use"))
        changes.until(lambda: (n := cache.get("0000000001")) is not None
                      and n.state == "in-use")
        assert cache.allocated_to("200-1") == []
        lock.release()
        changes.until(lambda: not cache.is_locked("0000000001"))
        lock.acquire()
        changes.until(lambda: cache.is_locked("0000000001"))
        lock.release()
        changes.until(lambda: not cache.is_locked("0000000001"))
        with caplog.at_level(logging.WARNING):
            kazoo_client.create(paths.node_path("0000000002"), b"{broken")
            kazoo_client.create(paths.node_path("0000000003"), b"")
            changes.until(lambda: "0000000003" in cache.empty_ids())
            # Reported before the cache tells its listeners of the change.
            changes.until(lambda: "/nodepool/nodes/0000000002" in caplog.text)
        assert cache.get("0000000002") is None
        kazoo_client.delete(paths.node_path("0000000001"), recursive=True)
        changes.until(lambda: cache.get("0000000001") is None)
        assert (CacheEvent.REMOVED, "0000000001") in seen
        assert (CacheEvent.LOCK, "0000000001") in seen
    finally:
        cache.stop()


def test_request_cache_owner_and_children_ignored(zkc: ZkClient,
                                                  kazoo_client: KazooClient) -> None:
    cache = RequestCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        zkc.create(paths.request_path("900-0000000001"), b'{"state": "requested"}',
                   ephemeral=True, makepath=True)
        kazoo_client.create(paths.request_path("200-0000000002"), b'{"state": "requested"}')
        changes.until(lambda: "200-0000000002" in cache and "900-0000000001" in cache)
        assert cache.owner("900-0000000001") == zkc.session_id
        assert cache.owner("200-0000000002") == 0
    finally:
        cache.stop()


def test_registry_components(zk: ZkConnection, zkc: ZkClient,
                             kazoo_client: KazooClient) -> None:
    registry = ComponentRegistry(zkc, hostname="host-a")
    launcher = registry.register_launcher("running")
    pool_id = pool_worker_id("prov", "main", fqdn="host-a.example.com")
    assert pool_id.startswith("host-a.example.com-PoolWorker.prov-main-")
    pool = registry.register_pool(pool_id, "prov", "main", ["b", "a"], 50)
    assert launcher.path and launcher.path.startswith("/nodepool/components/launcher/host-a")
    raw = kazoo_client.get(pool.path)[0].decode()
    body = json.loads(raw)
    assert list(body) == sorted(body)
    assert body == {"hostname": "host-a", "id": pool_id, "kind": "pool", "model_api": 0,
                    "name": "main", "paused": False, "priority": 50, "provider_name": "prov",
                    "state": "running", "supported_labels": ["a", "b"],
                    "version": body["version"]}
    assert json.loads(kazoo_client.get(launcher.path)[0]) == {
        "hostname": "host-a", "kind": "launcher", "model_api": 0, "state": "running",
        "version": body["version"]}
    registry.update(pool, paused=True)
    data, stat = kazoo_client.get(pool.path)
    assert json.loads(data)["paused"] is True and stat.version == 1
    registry.update(pool, paused=True)  # no change: no write
    assert kazoo_client.get(pool.path)[1].version == 1
    assert kazoo_client.exists(pool.path).ephemeralOwner == zkc.session_id

    cache = ComponentCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        changes.until(lambda: [c.id for c in cache.pools()] == [pool_id])
        assert cache.pools()[0].supported_labels == {"a", "b"} and cache.pools()[0].paused
        registry.unregister(pool)
        changes.until(lambda: not cache.pools())
    finally:
        changes.close()
        cache.stop()


def test_session_expiry_epoch_reregister_and_resync(zk: ZkConnection, zkc: ZkClient,
                                                    kazoo_client: KazooClient) -> None:
    states: list[ConnectionState] = []
    zkc.add_listener(lambda state, epoch: states.append(state))
    changes = Signal().listen(zkc)  # after the list's listener: it sees a change first
    registry = ComponentRegistry(zkc, hostname="h")
    reg = registry.register_pool("pid", "p", "main", ["a"], 100)
    old_path = reg.path
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.create(paths.node_path("0000000001"), node_json())
    cache = NodeCache(zkc)
    changes.listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10) and cache.get("0000000001") is not None
        epoch = zkc.epoch
        expire_session(zk, zkc)
        changes.until(lambda: zkc.epoch == epoch + 1, 20)
        kazoo_client.delete(paths.node_path("0000000001"))
        changes.until(lambda: zkc.connected, 20)
        changes.until(lambda: ConnectionState.CONNECTED in states[states.index(
            ConnectionState.LOST):] if ConnectionState.LOST in states else False, 20)
        assert kazoo_client.exists(old_path) is None
        registry.forget_paths()
        registry.reregister_all()
        assert reg.path is not None and kazoo_client.exists(reg.path) is not None
        changes.until(lambda: cache.get("0000000001") is None, 20)
    finally:
        changes.close()
        cache.stop()
