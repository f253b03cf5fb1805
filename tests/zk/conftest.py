"""Fixtures for the ZooKeeper layer tests. The started `ZkClient` of the test's chroot
(`zkc`) is the suite's (tests/conftest.py); `client_for` makes more of them."""

from __future__ import annotations

from tests.helpers import client_for

__all__ = ["client_for"]
