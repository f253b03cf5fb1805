"""Node and request stores against a real ZooKeeper.

Aspects: tolerant reads (bad JSON, empty data, unknown state, wrong types, missing keys),
lossless writes (requestor_data with integers beyond 2**63, unknown keys, Zuul's `id`),
10-digit sequential node ids, lock-then-building in one transaction, guarded writes that
refuse without the lock, the one-transaction delete and its slow path, min-ready request
keys and the rule that only our own min-ready requests may be deleted (also while the
connection is down: the session lives on), orphan lock dirs.
"""

from __future__ import annotations

import json
import logging

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.requests import RequestStore, min_ready_request
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer
from nodepool_k8s.dev.testing.zuul_client import BIG_SPAN_ID, BIG_TRACE_ID, ZuulClient
from nodepool_k8s.zk.txn import Txn
from tests.helpers import Signal, ZkConnection
from tests.helpers import client_for


def new_node(store: NodeStore, **fields: object) -> Node:
    node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
    node.set(provider="p", pool="main", **fields)
    txn = Txn()
    idx = NodeStore.add_create(txn, node)
    results = txn.commit(store.zk)
    node.id, node.version = NodeStore.created_id(results[idx]), 0
    return node


def test_sequential_ids_and_lock_new(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    first, second = new_node(store), new_node(store)
    assert (first.id, second.id) == ("0000000000", "0000000001")
    before = zkc.writes.snapshot()[0]
    held = store.lock_new(first, model.NodeState.BUILDING, 2.0)
    assert held is not None and zkc.writes.snapshot()[0] == before + 1
    data = json.loads(kazoo_client.get(paths.node_path(first.id))[0])
    assert data["state"] == "building" and data["type"] == ["small"]
    # The launch conditions start with `building`, in the same write.
    assert [(c["type"], c["status"], c["last_transition_time"]) for c in data["conditions"]] \
        == [(t, "Unknown", 2.0) for t in ("Launched", "Registered", "Initialized", "Ready")]
    assert (first.state, first.state_time, first.version) == (model.NodeState.BUILDING, 2.0, 1)
    assert first.to_dict() == data
    assert len(kazoo_client.get_children(paths.node_lock_path(first.id))) == 1
    assert not Lock(kazoo_client, paths.node_lock_path(first.id)).acquire(blocking=False)


def test_lock_new_falls_back_when_someone_contends(zkc: ZkClient,
                                                   kazoo_client: KazooClient) -> None:
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    node = new_node(store)
    other = Lock(kazoo_client, paths.node_lock_path(node.id))
    assert other.acquire()
    assert store.lock_new(node, model.NodeState.BUILDING, 2.0) is None
    assert json.loads(kazoo_client.get(paths.node_path(node.id))[0])["state"] == "init"
    # Not written, so not moved: the node is as it was, without conditions.
    assert (node.state, node.state_time, node.version, node.conditions) == (
        model.NodeState.INIT, 1.0, 0, [])
    other.release()
    # The lock dir stays behind: the next attempt takes the ordinary lock, then writes.
    held = store.lock_new(node, model.NodeState.BUILDING, 3.0)
    assert held is not None
    raw, stat = kazoo_client.get(paths.node_path(node.id))
    assert (node.state, node.state_time, node.version) == (model.NodeState.BUILDING, 3.0,
                                                           stat.version)
    assert node.to_dict() == json.loads(raw) and len(node.conditions) == 4
    held.release()


def test_guarded_write_refuses_without_lock(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    node = new_node(store)
    held = store.lock(node.id)
    assert held is not None
    node.state = model.NodeState.READY
    store.store(node, held)
    # Someone deletes our contender (as a session expiry would): the write must fail.
    kazoo_client.delete(held.child_path)
    node.state = model.NodeState.USED
    with pytest.raises(errors.LockLost):
        store.store(node, held)
    assert json.loads(kazoo_client.get(paths.node_path(node.id))[0])["state"] == "ready"


def test_versioned_write_conflict(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    node = new_node(store)
    held = store.lock(node.id)
    assert held is not None
    kazoo_client.set(paths.node_path(node.id), kazoo_client.get(paths.node_path(node.id))[0])
    with pytest.raises(errors.VersionConflict):
        store.store(node, held)


def test_delete_fast_and_slow_path(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    node = new_node(store)
    held = store.lock(node.id)
    assert held is not None
    before = zkc.writes.snapshot()[0]
    store.delete(node, held)
    assert zkc.writes.snapshot()[0] == before + 1
    assert kazoo_client.exists(paths.node_path(node.id)) is None

    node = new_node(store)
    got = store.lock_and_read(node.id)
    assert got is not None
    held, node = got
    # A contender that stays: the node is left `deleted`, unlocked, for the next locker.
    waiter = Lock(kazoo_client, paths.node_lock_path(node.id))
    created = kazoo_client.create(waiter.create_path, b"", ephemeral=True, sequence=True)
    assert store.delete(node, held) is False
    assert json.loads(kazoo_client.get(paths.node_path(node.id))[0])["state"] == "deleted"
    assert kazoo_client.get_children(paths.node_lock_path(node.id)) == [
        paths.basename(created)]
    kazoo_client.delete(created)
    got = store.lock_and_read(node.id)
    assert got is not None and got[1].state == "deleted"
    assert store.delete(got[1], got[0]) is True
    assert kazoo_client.exists(paths.node_path(node.id)) is None


def test_delete_removes_strays_but_waits_for_real_contenders(
        zkc: ZkClient, kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    """Children that are no part of a node (a `junk` znode beside the lock dir, garbage in
    the lock dir, with children of their own) used to fail every removal for ever."""
    store = NodeStore(zkc)
    kazoo_client.ensure_path(paths.NODES)
    node = new_node(store)
    kazoo_client.create(paths.node_path(node.id) + "/junk/deeper", b"x", makepath=True)
    kazoo_client.create(paths.node_lock_path(node.id) + "/garbage", b"", makepath=True)
    got = store.lock_and_read(node.id)
    assert got is not None
    with caplog.at_level(logging.WARNING, logger="nodepool_k8s.zk.nodes"):
        assert store.delete(got[1], got[0]) is True
    assert kazoo_client.exists(paths.node_path(node.id)) is None
    assert sum("not part of a node" in r.getMessage() for r in caplog.records) == 2

    # A read-lock contender is some client's, like an exclusive one: waited for, kept.
    node = new_node(store)
    got = store.lock_and_read(node.id)
    assert got is not None
    waiter = kazoo_client.create(paths.node_lock_path(node.id) + "/abc__rlock__",
                                 b"", ephemeral=True, sequence=True)
    assert store.delete(got[1], got[0]) is False
    assert kazoo_client.exists(waiter) is not None


def test_tolerant_reads(zkc: ZkClient, kazoo_client: KazooClient,
                        caplog: pytest.LogCaptureFixture) -> None:
    kazoo_client.ensure_path(paths.NODES)
    bad = {"0000000001": b"{not json", "0000000002": b"", "0000000003": b'{"state": "zzz"}',
           "0000000004": b"[1, 2]", "0000000005": b'{"state": "ready", "type": "small"}'}
    for node_id, data in bad.items():
        kazoo_client.create(paths.node_path(node_id), data)
    store = NodeStore(zkc)
    with caplog.at_level(logging.WARNING):
        assert [store.get(i) for i in list(bad)[:4]] == [None] * 4
    assert "/nodepool/nodes/0000000001" in caplog.text
    assert store.get("0000000002") is None and store.is_empty("0000000002")
    node = store.get("0000000005")
    assert node is not None and node.type == ["small"] and node.connection_port == 22

    kazoo_client.ensure_path(paths.REQUESTS)
    kazoo_client.create(paths.request_path("200-0000000001"), b'{"state": "odd"}')
    kazoo_client.create(paths.request_path("200-0000000002"), b'{"node_types": "x"}')
    kazoo_client.create(paths.request_path("200-0000000003"), b"{}")
    requests = RequestStore(zkc)
    assert requests.get("200-0000000001") is None and requests.get("200-0000000002") is None
    minimal = requests.get("200-0000000003")
    assert minimal is not None and minimal.state == model.RequestState.REQUESTED and minimal.reuse


def test_request_round_trip_is_lossless(zk: ZkConnection, zkc: ZkClient,
                                        kazoo_client: KazooClient) -> None:
    with ZuulClient(zk.hosts) as zuul:
        request_id = zuul.submit(["small", "small"])
        original = zuul.get_request(request_id)
    raw = kazoo_client.get(paths.request_path(request_id))[0]
    # Unknown keys must survive too.
    body = json.loads(raw)
    body["future_key"] = {"nested": [1, 2]}
    kazoo_client.set(paths.request_path(request_id), json.dumps(body).encode())
    store = RequestStore(zkc)
    got = store.lock_and_read(request_id)
    assert got is not None
    held, request = got
    request.state = model.RequestState.PENDING
    store.store(request, held, release=True)
    after = json.loads(kazoo_client.get(paths.request_path(request_id))[0])
    assert after["requestor_data"] == original["requestor_data"]
    assert after["requestor_data"]["span_info"]["trace_id"] == BIG_TRACE_ID
    assert after["requestor_data"]["span_info"]["span_id"] == BIG_SPAN_ID
    assert after["future_key"] == {"nested": [1, 2]}
    for key in original:
        if key not in ("state", "state_time"):
            assert after[key] == original[key], key
    assert after["declined_by"] == [] and after["nodes"] == [] and after["reuse"] is True
    # The lock lives outside the request; nothing was created under it.
    assert kazoo_client.get_children(paths.request_path(request_id)) == []
    assert kazoo_client.exists(paths.request_lock_path(request_id)) is not None


def test_zuul_id_key_tolerated(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.NODES)
    body = {"state": "in-use", "type": ["small"], "id": "0000000007", "provider": "p",
            "user_data": {"zuul_system": "z"}}
    kazoo_client.create(paths.node_path("0000000007"), json.dumps(body).encode())
    store = NodeStore(zkc)
    node = store.get("0000000007")
    assert node is not None and node.extra == {"id": "0000000007"}
    held = store.lock(node.id)
    assert held is not None
    node.state = model.NodeState.USED
    store.store(node, held)
    after = json.loads(kazoo_client.get(paths.node_path("0000000007"))[0])
    assert after["id"] == "0000000007" and after["user_data"] == {"zuul_system": "z"}


def test_min_ready_requests(zk: ZkConnection, zkc: ZkClient,
                            kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.REQUESTS)
    txn = Txn()
    idx = RequestStore.add_create(txn, min_ready_request("small", 5.0),
                                  model.MIN_READY_PRIORITY, ephemeral=True)
    request_id = paths.basename(txn.commit(zkc)[idx])
    assert request_id.startswith("900-")
    data, stat = kazoo_client.get(paths.request_path(request_id))
    body = json.loads(data)
    for key in ("requestor", "requestor_data", "node_types", "provider", "state",
                "state_time", "event_id"):
        assert key in body, key
    assert body["requestor"] == "NodePool:min-ready" and body["reuse"] is False
    assert stat.ephemeralOwner == zkc.session_id
    store = RequestStore(zkc)
    found = store.get_with_stat(request_id)
    assert found is not None
    with ZuulClient(zk.hosts) as zuul:
        zuul_id = zuul.submit(["small"])
    zuul_found = store.get_with_stat(zuul_id)
    assert zuul_found is not None
    with pytest.raises(errors.NotOurs):
        store.delete_own_min_ready(Txn(), *zuul_found)
    txn = Txn()
    store.delete_own_min_ready(txn, *found)
    txn.commit(zkc)
    assert kazoo_client.exists(paths.request_path(request_id)) is None


def test_own_min_ready_request_is_ours_while_disconnected() -> None:
    """A connection drop does not end the session (nor its ephemeral min-ready requests):
    the min-ready worker, caught by a drop between reading its fulfilled request and
    deleting it, must not take it for another launcher's (a NotOurs error: an ERROR with
    a traceback for every drop at that moment)."""
    server = ZooKeeperServer().start()  # stopped below, in the middle of the test
    zkc = client_for(ZkConnection(host="127.0.0.1", port=server.port, chroot="/own"),
                     timeout=30.0)
    try:
        zkc.ensure_path(paths.REQUESTS)
        txn = Txn()
        idx = RequestStore.add_create(txn, min_ready_request("small", 1.0), "900",
                                      ephemeral=True)
        request_id = paths.basename(txn.commit(zkc)[idx])
        store = RequestStore(zkc)
        found = store.get_with_stat(request_id)
        assert found is not None
        session = zkc.session_id
        assert session is not None and found[1].ephemeral_owner == session
        changes = Signal().listen(zkc)
        server.stop()
        changes.until(lambda: not zkc.connected, 30, message="the connection dropped")
        changes.close()

        assert zkc.session_id == session
        store.delete_own_min_ready(Txn(), *found)  # queued: not NotOurs
    finally:
        zkc.stop()
        server.stop()


def test_orphan_lock_dirs(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.request_lock_path("200-0000000001"))
    kazoo_client.ensure_path(paths.request_lock_path("200-0000000002"))
    kazoo_client.ensure_path(paths.REQUESTS)
    kazoo_client.create(paths.request_path("200-0000000002"), b"{}")
    store = RequestStore(zkc)
    mtime = kazoo_client.exists(paths.request_lock_path("200-0000000001")).mtime / 1000
    assert not store.delete_orphan_lock_dir("200-0000000001", older_than=mtime - 1)
    assert store.delete_orphan_lock_dir("200-0000000001", older_than=mtime + 1)
    assert not store.delete_orphan_lock_dir("200-0000000002", older_than=mtime + 100)
    assert sorted(store.lock_dir_ids()) == ["200-0000000002"]
