"""The real-ZooKeeper harness itself: create/read/watch/lock in a chroot, and TLS."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zookeeper import four_letter
from tests.helpers import Signal, ZkConnection


def test_server_reports_mode(zk_server):
    assert "Mode: standalone" in four_letter(zk_server.port, "srvr")


def test_chroot_create_read_watch_lock(zk: ZkConnection, kazoo_client: KazooClient):
    seen: list[bytes] = []
    fired = threading.Event()

    kazoo_client.create("/nodepool/nodes/0000000000", b'{"state": "init"}', makepath=True)

    @kazoo_client.DataWatch("/nodepool/nodes/0000000000")
    def _watch(data, stat):  # noqa: ANN001
        if data is not None:
            seen.append(data)
            if len(seen) > 1:
                fired.set()

    kazoo_client.set("/nodepool/nodes/0000000000", b'{"state": "ready"}')
    assert fired.wait(10)
    assert seen[-1] == b'{"state": "ready"}'

    # The chroot really confines the client: the node lives under it on the server.
    outside = KazooClient(hosts=f"{zk.host}:{zk.port}")
    outside.start(timeout=15)
    try:
        assert outside.exists(f"{zk.chroot}/nodepool/nodes/0000000000")
    finally:
        outside.stop()
        outside.close()

    lock = kazoo_client.Lock("/nodepool/nodes/0000000000/lock", "test")
    other = KazooClient(hosts=zk.hosts)
    other.start(timeout=15)
    try:
        assert lock.acquire(timeout=5)
        assert not other.Lock("/nodepool/nodes/0000000000/lock").acquire(blocking=False)
        contenders = kazoo_client.get_children("/nodepool/nodes/0000000000/lock")
        assert len(contenders) == 1 and "__lock__" in contenders[0]
        lock.release()
        # Each listing sets a one-shot watch that tells of the next change.
        with Signal() as changes:
            changes.until(lambda: not kazoo_client.get_children(
                "/nodepool/nodes/0000000000/lock", watch=changes))

    finally:
        other.stop()
        other.close()


def test_tls_connection(zk_tls: ZkConnection):
    client = KazooClient(hosts=zk_tls.hosts, use_ssl=True, ca=zk_tls.tls_ca,
                         certfile=zk_tls.tls_cert, keyfile=zk_tls.tls_key)
    client.start(timeout=20)
    try:
        client.create("/over-tls", b"yes")
        assert client.get("/over-tls")[0] == b"yes"
    finally:
        client.stop()
        client.close()
