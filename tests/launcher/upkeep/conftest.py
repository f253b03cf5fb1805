"""Fixtures for the upkeep workers' stepped tests: `support.Upkeep` on a started ZooKeeper
client in the test's chroot."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection
from tests.launcher.upkeep.support import Upkeep, make_upkeep

MakeUpkeep = Callable[..., Upkeep]


@pytest.fixture
def upkeep(zk: ZkConnection, zkc: ZkClient) -> MakeUpkeep:
    """`upkeep(body, **make_upkeep options)`: an `Upkeep` for the config `body`."""
    def make(body: str, **options: Any) -> Upkeep:
        return make_upkeep(zk, zkc, body, **options)
    return make
