"""Fixtures for the ZooKeeper layer tests. The started `ZkClient` of the test's chroot
(`zkc`) is the suite's (tests/conftest.py); `client_for` makes more of them, and `other` is
one more: another launcher's session."""

from __future__ import annotations

from typing import Iterator

import pytest

from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection, client_for

__all__ = ["client_for"]


@pytest.fixture
def other(zk: ZkConnection) -> Iterator[ZkClient]:
    """Another launcher's session."""
    client = client_for(zk)
    try:
        yield client
    finally:
        client.stop()
