"""The read-back after a lost reply (a ZooKeeper failover between commit and answer).

Aspects: `NodeStore.store` and `RequestStore.store` adopt a write that was applied although
its reply was lost (the version moved on by one and the bytes are ours), so the writes that
follow are made at the right version; a write that never reached ZooKeeper is not mistaken
for one that did.
"""

from __future__ import annotations

import json

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import errors, locks, paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.requests import RequestStore, encode
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.txn import Txn


def _new_locked_node(zkc: ZkClient, store: NodeStore) -> tuple[Node, HeldLock]:
    node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
    node.set(provider="p", pool="main")
    txn = Txn()
    idx = NodeStore.add_create(txn, node)
    results = txn.commit(zkc)
    node.id, node.version = NodeStore.created_id(results[idx]), 0
    held = store.lock_new(node, model.NodeState.BUILDING, 2.0)
    assert held is not None
    return node, held


def test_read_back_adopts_an_applied_node_write(zkc: ZkClient,
                                                kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.NODES)
    store = NodeStore(zkc)
    node, held = _new_locked_node(zkc, store)
    node.set(external_id="ns-1")
    store.store(node, held)
    applied = node.version
    node.version -= 1  # the reply was lost: we never learned the new version
    store._reconcile(node)
    assert node.version == applied
    # A write that did not reach ZooKeeper is not mistaken for one that did.
    node.set(external_id="ns-2")
    with pytest.raises(errors.ZkConnectionError):
        store._reconcile(node)
    stored = json.loads(kazoo_client.get(paths.node_path(node.id))[0])
    assert stored["external_id"] == "ns-1"


def test_read_back_adopts_an_applied_request_write(zkc: ZkClient, zuul: ZuulClient) -> None:
    requests = RequestStore(zkc)
    request_id = zuul.submit(["small"])
    got = requests.lock_and_read(request_id)
    assert got is not None
    held, request = got
    request.state = model.RequestState.PENDING
    requests.store(request, held)
    applied = request.version
    request.version -= 1
    found = requests.zk.get(paths.request_path(request_id))
    assert found is not None and found[1].version == applied
    # The same read-back `store` runs after a lost reply.
    outcome = locks.reconcile_write(zkc, paths.request_path(request_id), encode(request),
                                    request.version)
    assert outcome is not None and outcome[0] == applied
    held.release()
