"""Fixtures for the request path's unit tests: the engine slice of `support.Deps` on a
started ZooKeeper client in the test's chroot, stepped by a ManualClock."""

from __future__ import annotations

import textwrap
from typing import Callable

import pytest

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection
from tests.launcher.requests.support import Deps, WorkerDeps, pool_yaml
from tests.launchers import make_config

MakeDeps = Callable[..., Deps]


@pytest.fixture
def make_deps(zk: ZkConnection, zkc: ZkClient) -> MakeDeps:
    """`make_deps(**pool_yaml options)`: a `Deps` on its own ManualClock."""
    def make(**options: object) -> Deps:
        config = make_config(zk, textwrap.dedent(pool_yaml(**options)))  # type: ignore[arg-type]
        return Deps(zkc, config, ManualClock())
    return make


@pytest.fixture
def make_worker_deps(zk: ZkConnection, zkc: ZkClient) -> Callable[..., WorkerDeps]:
    """`make_worker_deps(**pool_yaml options)`: a `WorkerDeps` on its own ManualClock."""
    def make(**options: object) -> WorkerDeps:
        config = make_config(zk, textwrap.dedent(pool_yaml(**options)))  # type: ignore[arg-type]
        return WorkerDeps(zkc, config, ManualClock())
    return make
