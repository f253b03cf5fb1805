"""A launcher's own registrations and pool statuses are not read back (zk/echo.py).

Aspects: the component cache and the pool-status cache show this client's own creations
and updates of their children (a sequential pool registration, a pool paused and resumed;
a status created and rewritten) without reading them, while another session's creations
and writes are read and shown; a sequential creation by another session with the same
name prefix while ours is unanswered is read once ours is answered; with one-shot watches
(a server older than 3.6) every change is read as before.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import ComponentCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.pool_status import POOL_STATUS, JsonDirCache, StatusWriter, \
    decode_pool_status, status_path
from nodepool_k8s.zk.registry import ComponentRegistry, encode
from tests.helpers import Signal
from tests.zk.support import drained


@pytest.fixture
def components(zkc: ZkClient) -> Iterator[ComponentCache]:
    cache = ComponentCache(zkc)
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


@pytest.fixture
def statuses(zkc: ZkClient) -> Iterator[JsonDirCache[dict[str, Any]]]:
    cache = JsonDirCache(zkc, POOL_STATUS, "pool-status-cache", decode_pool_status)
    cache.start()
    assert cache.wait_synced(10)
    yield cache
    cache.stop()


def drain(cache: ComponentCache) -> None:
    for mirror in cache._mirrors.values():
        drained(mirror)


def status(pool: str, paused: bool) -> dict[str, Any]:
    return {"id": pool, "provider": "p", "pool": "main", "paused": paused}


def test_own_registration_and_its_updates_are_not_read_back(
        zkc: ZkClient, kazoo_client: KazooClient, components: ComponentCache) -> None:
    changes = Signal().listen(components)
    registry = ComponentRegistry(zkc, hostname="host-a")
    before = components.reads
    try:
        launcher = registry.register_launcher()
        pool = registry.register_pool("pid-a", "p", "main", ["a"], 100)
        changes.until(lambda: [c.id for c in components.pools()] == ["pid-a"], 10)
        for paused in (True, False, True):
            registry.update(pool, paused=paused)
            changes.until(lambda: components.pools()[0].paused is paused, 10,
                          message=f"paused={paused} shown")
        registry.update(launcher, state="running")
        changes.until(lambda: [c.state for c in components.launchers()] == ["running"], 10)
        drain(components)
        assert components.reads == before

        # Another session's registration, and its update of ours, are read.
        assert pool.path is not None
        other = kazoo_client.create(f"{paths.POOL_COMPONENTS}/host-b", encode(
            {"hostname": "host-b", "kind": "pool", "id": "pid-b", "state": "running",
             "supported_labels": ["b"]}), ephemeral=True, sequence=True)
        changes.until(lambda: {c.id for c in components.pools()} == {"pid-a", "pid-b"}, 10)
        kazoo_client.set(pool.path, encode({**pool.data, "priority": 7}))
        changes.until(lambda: [c.priority for c in components.pools()
                               if c.id == "pid-a"] == [7], 10)
        assert components.reads == before + 2
        kazoo_client.delete(other)
        changes.until(lambda: [c.id for c in components.pools()] == ["pid-a"], 10)
    finally:
        changes.close()
        registry.unregister_all()


def test_own_status_writes_are_not_read_back(
        zkc: ZkClient, kazoo_client: KazooClient,
        statuses: JsonDirCache[dict[str, Any]]) -> None:
    mirror = statuses._mirror
    changes = Signal().listen(statuses)
    writer = StatusWriter(zkc, "pid-a")
    before = mirror.reads
    try:
        for paused in (False, True, False):
            writer.write(status("pid-a", paused))  # type: ignore[arg-type]
            changes.until(lambda: (s := statuses.get("pid-a")) is not None
                          and s["paused"] is paused, 10, message=f"paused={paused} shown")
        drained(mirror)
        assert mirror.reads == before

        # Another session's status, and its write of ours, are read.
        kazoo_client.create(status_path("pid-b"), json.dumps(status("pid-b", True)).encode())
        changes.until(lambda: statuses.get("pid-b") is not None, 10)
        kazoo_client.set(status_path("pid-a"), json.dumps(status("pid-a", True)).encode())
        changes.until(lambda: (s := statuses.get("pid-a")) is not None and s["paused"], 10)
        assert mirror.reads == before + 2
        # Removed and written again under the same name: shown again, still not read.
        writer.remove()
        changes.until(lambda: statuses.get("pid-a") is None, 10)
        writer.write(status("pid-a", False))  # type: ignore[arg-type]
        changes.until(lambda: (s := statuses.get("pid-a")) is not None
                      and not s["paused"], 10)
        drained(mirror)
        assert mirror.reads == before + 2
    finally:
        changes.close()
        writer.remove()


def test_a_creation_with_our_prefix_while_ours_is_unanswered_is_read(
        zkc: ZkClient, kazoo_client: KazooClient, components: ComponentCache) -> None:
    """Another session registers under the same host name while our creation is
    unanswered (held back here as an expectation that no answer settles yet): its
    creation waits for our answer, then is read."""
    mirror = components._mirrors["pool"]
    changes = Signal().listen(components)
    before = components.reads
    try:
        assert mirror.expect_write("host-a", sequence=True)
        kazoo_client.create(f"{paths.POOL_COMPONENTS}/host-a", encode(
            {"hostname": "host-a", "kind": "pool", "id": "pid-b", "state": "running"}),
            ephemeral=True, sequence=True)
        drained(mirror)
        assert components.reads == before and not components.pools()
        mirror.settle_write("host-a", b"", None, "")  # ours failed: nothing was created
        changes.until(lambda: [c.id for c in components.pools()] == ["pid-b"], 10)
        assert components.reads == before + 1
    finally:
        changes.close()


def test_with_one_shot_watches_own_writes_are_read(zkc: ZkClient) -> None:
    zkc.persistent_watches = False
    cache = ComponentCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    registry = ComponentRegistry(zkc, hostname="host-a")
    try:
        assert cache.wait_synced(10)
        before = cache.reads
        pool = registry.register_pool("pid-a", "p", "main", ["a"], 100)
        changes.until(lambda: [c.id for c in cache.pools()] == ["pid-a"], 10)
        registry.update(pool, paused=True)
        changes.until(lambda: cache.pools()[0].paused, 10)
        assert cache.reads >= before + 2
    finally:
        changes.close()
        registry.unregister_all()
        cache.stop()
