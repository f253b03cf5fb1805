"""Fixtures for the ZooKeeper layer tests: a started `ZkClient` in the test's chroot."""

from __future__ import annotations

from typing import Iterator

import pytest

from nodepool_k8s.zk.client import ZkClient, ZkSettings
from tests.helpers import ZkConnection


def client_for(zk: ZkConnection, timeout: float = 5.0) -> ZkClient:
    client = ZkClient(ZkSettings(hosts=zk.hosts, timeout=timeout))
    assert client.start()
    return client


@pytest.fixture
def zkc(zk: ZkConnection) -> Iterator[ZkClient]:
    client = client_for(zk)
    try:
        yield client
    finally:
        client.stop()
