"""Test helper: make ZooKeeper expire a client's session, as a long network partition would.

Connecting a second client with the same session id and password and closing it ends the
session on the server; the original client then sees SESSION_EXPIRED (kazoo state LOST) and
reconnects with a new session.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection


def expire_session(zk: ZkConnection, client: ZkClient) -> None:
    session = client.kazoo.client_id
    assert session is not None
    twin = KazooClient(hosts=zk.hosts, client_id=session)
    twin.start(timeout=15)
    twin.stop()
    twin.close()
