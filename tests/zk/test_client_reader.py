"""The connection (TLS, chroot creation, connect retry) and the cache-less reader.

Aspects: TLS with client certificates; a configured chroot that does not exist is created;
the initial connect retries with a log line and gives up only when told to stop; the
reader lists nodes with a locked flag, requests in priority order and pool components, and
lists 10,000 nodes in well under a second thanks to pipelined reads.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock
from kazoo.security import make_digest_acl

from nodepool_k8s.config.model import ZkTls
from nodepool_k8s.dev.testing.zookeeper import free_port
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ZkClient, ZkSettings
from nodepool_k8s.zk.reader import ZkReader
from nodepool_k8s.zk.registry import ComponentRegistry
from nodepool_k8s.zk.txn import Txn
from tests.helpers import ZkConnection
from tests.helpers import client_for


def test_tls_connection(zk_tls: ZkConnection) -> None:
    assert zk_tls.tls_ca and zk_tls.tls_cert and zk_tls.tls_key
    client = ZkClient(ZkSettings(hosts=zk_tls.hosts, tls=ZkTls(
        cert=zk_tls.tls_cert, key=zk_tls.tls_key, ca=zk_tls.tls_ca)))
    assert client.start()
    try:
        client.create("/over-tls", b"yes")
        found = client.get("/over-tls")
        assert found is not None and found[0] == b"yes"
    finally:
        client.stop()


def test_missing_chroot_is_created(zk_server: object, zk: ZkConnection) -> None:
    hosts = f"{zk.host}:{zk.port}/fresh-{uuid.uuid4().hex}/deeper"
    client = ZkClient(ZkSettings(hosts=hosts))
    assert client.start()
    try:
        client.create("/x", b"1")
    finally:
        client.stop()


def test_connect_retries_until_stopped(caplog: pytest.LogCaptureFixture) -> None:
    client = ZkClient(ZkSettings(hosts=f"127.0.0.1:{free_port()}", connect_attempt_timeout=0.2,
                                 retry_log_interval=0.0))
    stop = threading.Event()
    timer = threading.Timer(1.5, stop.set)
    timer.start()
    with caplog.at_level(logging.WARNING, logger="nodepool_k8s.zk.client"):
        assert client.start(stop) is False
    assert caplog.text.count("Retrying ZooKeeper connection") >= 2


def test_reader_views(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.ensure_path(paths.REQUESTS)
    for i in range(3):
        body = {"state": "ready", "type": ["small"], "provider": "p"}
        kazoo_client.create(paths.node_path(f"000000000{i}"), json.dumps(body).encode())
    kazoo_client.create(paths.node_path("0000000009"), b"junk")
    kazoo_client.create(paths.node_path("0000000008"), b"")  # being created: skipped
    lock = Lock(kazoo_client, paths.node_lock_path("0000000001"))
    lock.acquire()
    for rid in ("300-0000000005", "100-0000000007", "100-0000000006"):
        kazoo_client.create(paths.request_path(rid), b'{"state": "requested"}')
    ComponentRegistry(zkc, "h").register_pool("pid", "p", "main", ["small"], 100)
    reader = ZkReader(zkc)
    rows = reader.nodes()
    assert [(r.node.id, r.locked) for r in rows] == [
        ("0000000000", False), ("0000000001", True), ("0000000002", False)]
    assert [r.id for r in reader.requests()] == ["100-0000000006", "100-0000000007",
                                                 "300-0000000005"]
    assert [c.id for c in reader.pool_components()] == ["pid"]
    single = reader.node("0000000001")
    assert single is not None and single.locked
    # Shaped as each node is decoded: the listing keeps only what it shows.
    malformed: list = []
    shaped = reader.node_rows(lambda view: (view.node.id, view.locked), malformed)
    assert shaped == [(r.node.id, r.locked) for r in rows]
    assert [m.id for m in malformed] == ["0000000009"]


@pytest.mark.parametrize("multiread", [True, False], ids=["multiread", "pipelined"])
def test_unreadable_znodes_are_skipped_and_reported_once(
        zkc: ZkClient, kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture,
        multiread: bool) -> None:
    """A znode whose ACL denies us READ (another client's) failed the whole batched read
    it was part of; it reads as missing now, logged once with its path."""
    kazoo_client.ensure_path(paths.NODES)
    body = json.dumps({"state": "ready", "type": ["small"], "provider": "p"}).encode()
    kazoo_client.create(paths.node_path("0000000000"), body)
    hidden = kazoo_client.create(paths.node_path("0000000001"), body,
                                 acl=[make_digest_acl("someone", "else", all=True)])
    if not multiread:
        zkc._batch.supported = False
    for _ in range(2):
        assert [r.node.id for r in ZkReader(zkc).nodes()] == ["0000000000"]
        found = dict(zkc.get_many([paths.node_path("0000000000"), hidden]))
        assert found[hidden] is None and found[paths.node_path("0000000000")] is not None
    assert caplog.text.count(f"{hidden}: not readable") == 1


def test_reader_lists_ten_thousand_nodes(zk: ZkConnection, kazoo_client: KazooClient) -> None:
    # A session long enough that a busy machine starving the client's ping while it decodes
    # 10,000 records does not expire it: what is checked here is the listing.
    zkc = client_for(zk, timeout=30.0)
    try:
        _list_ten_thousand(zkc, kazoo_client)
    finally:
        zkc.stop()


def _list_ten_thousand(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.NODES)
    body = json.dumps({"state": "ready", "type": ["small"], "provider": "p", "pool": "main",
                       "resources": {"instances": 1, "cores": 1, "ram": 512},
                       "connection_port": {"namespace": "main-x", "host": "https://k:6443"},
                       "allocated_to": None, "external_id": "main-x"}).encode()
    for _ in range(20):
        txn = Txn()
        for _ in range(500):
            txn.create(paths.NODE_CREATE_PREFIX, body, sequence=True)
        txn.commit(zkc)
    # How fast this is belongs to tools/benchmark, not to an assertion here.
    rows = ZkReader(zkc).nodes()
    assert len(rows) == 10_000
    assert len({row.node.id for row in rows}) == 10_000
