"""ChildMirror corner cases found by the system benchmark (tools/benchmark).

Aspects: a node's lock dir created between the mirror's listing of it (no such dir) and
its exists watch is still followed (before, lock changes of that node went unseen and a
released node waited for the next full cleanup pass, 60 s); thousands of children created
at once are read through the bounded backlog, each once (before, every new child was read
at once, and again on each later root event while its first read was in flight, which set
the launcher's memory high-water mark: 187 MiB with 10,000 nodes of 4 KB).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import mirror, paths
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.pool_state import ROOT, PoolState, PoolStateCache, target_path
from tests.helpers import Signal

NODE = "0000000007"


def node_json(state: str) -> bytes:
    return json.dumps({"state": state, "type": ["small"], "provider": "p"}).encode()


def test_lock_dir_created_before_the_exists_watch(
        zkc: ZkClient, kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch) -> None:
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.create(paths.node_path(NODE), node_json("init"))
    real_exists = zkc.kazoo.exists_async
    raced: list[str] = []
    changes = Signal()

    def exists_async(path: str, watch: Any = None) -> Any:
        if path == paths.node_lock_path(NODE) and not raced:
            # What the launcher's lock_new does right then: lock dir + contender.
            raced.append(kazoo_client.create(f"{path}/abc__lock__", b"", makepath=True,
                                             sequence=True))
            changes()
        return real_exists(path, watch=watch)

    monkeypatch.setattr(zkc.kazoo, "exists_async", exists_async)
    zkc.persistent_watches = False  # the race is one of one-shot watches
    cache = NodeCache(zkc)
    changes.listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        changes.until(lambda: raced, 10, message="the exists call")
        changes.until(lambda: cache.is_locked(NODE), 10, message="the contender to be seen")
        kazoo_client.delete(raced[0])  # unlocked: cleanup must hear of it
        changes.until(lambda: not cache.is_locked(NODE), 10,
                      message="the unlock to be seen")
    finally:
        cache.stop()


def test_bulk_creation_is_read_once_and_bounded(zkc: ZkClient, kazoo_client: KazooClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirror, "MAX_IN_FLIGHT", 16)
    kazoo_client.ensure_path(paths.NODES)
    real_get = zkc.kazoo.get_async
    counts = {"reads": 0, "in_flight": 0, "max_in_flight": 0}
    lock = threading.Lock()

    def done(_: Any) -> None:
        with lock:
            counts["in_flight"] -= 1

    def get_async(path: str, watch: Any = None) -> Any:
        with lock:
            counts["reads"] += 1
            counts["in_flight"] += 1
            counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
        result = real_get(path, watch=watch)
        result.rawlink(done)
        return result

    monkeypatch.setattr(zkc.kazoo, "get_async", get_async)
    cache = NodeCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    try:
        assert cache.wait_synced(10)
        ids = [f"{i:010d}" for i in range(600)]
        for start in range(0, len(ids), 100):  # several root events while reads are queued
            txn = kazoo_client.transaction()
            for node_id in ids[start:start + 100]:
                txn.create(paths.node_path(node_id), node_json("ready"))
            txn.commit()
        changes.until(lambda: len(cache) == len(ids), 20, message="every node in the cache")
        assert counts["reads"] == len(ids)
        assert counts["max_in_flight"] <= 16
    finally:
        cache.stop()


def test_a_name_that_comes_back_is_seen_again(zkc: ZkClient,
                                              kazoo_client: KazooClient) -> None:
    """Pool-state entries are deleted on resume and created under the same name on the
    next pause: a tombstone for the deleted name hid every later pause of that pool until
    the launcher restarted (the operator was told the pool was paused; it was not)."""
    kazoo_client.ensure_path(ROOT)
    cache = PoolStateCache(zkc)
    changes = Signal().listen(cache)
    cache.start()
    path = target_path("fake/main")
    try:
        assert cache.wait_synced(10)
        for round_ in range(3):
            state = PoolState(target="fake/main", action="pause", reason=f"r{round_}",
                              by="test", time=float(round_))
            kazoo_client.create(path, json.dumps(state.to_dict()).encode())
            changes.until(lambda: [s.reason for s in cache.states()] == [f"r{round_}"], 10,
                          message=f"pause #{round_ + 1} to be seen")
            kazoo_client.delete(path)
            changes.until(lambda: cache.states() == [], 10,
                          message=f"resume #{round_ + 1} to be seen")

    finally:
        cache.stop()
