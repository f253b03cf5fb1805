"""The upkeep workers without a daemon: the cleanup worker, its deleter and leak sweep on
the narrow dependencies of `CleanupDeps`, built on a real ZooKeeper with no thread of
their own, next to a pool worker and min-ready on the same dependencies when a test needs
them.

`UpkeepDeps` is the request path's `WorkerDeps` (tests/launcher/requests/support.py: real
stores and registry on a started `ZkClient`, a ManualClock, caches that read ZooKeeper on
every call) with what cleanup uses on top. The deleter runs each deletion at once in the
caller's thread (`InlineExecutor`), so a cleanup pass (`Upkeep.step`) has deleted what it
decided to delete when it returns, and a provider's wake-up
(`FakeProvider.finish_deletions`) finishes a parked deletion before it returns; a pool
worker's launches run on `InlineLaunches.run_all`. As in the launcher, one `LaunchFirst`
joins them: a deletion the cleanup asks for while a pool worker's launch is queued waits
for it (and starts in the thread that runs the last launch). Nothing waits for a thread or a watch:
a test moves the clock, runs one pass and looks at ZooKeeper and the fake cloud.
"""

from __future__ import annotations

import textwrap
import time
from concurrent.futures import Executor, Future
from typing import Any, Callable

from nodepool_k8s.config.model import Config
from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.launcher.pool_worker import PoolWorker
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.launcher.requests.min_ready import MinReadyWorker
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.launcher.upkeep.cleanup import CleanupWorker
from nodepool_k8s.launcher.upkeep.deleter import NodeDeleter
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import Component, decode_component
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.txn import Txn
from tests.helpers import ZkConnection
from tests.launcher.requests.support import InlineLaunches, WorkerDeps
from tests.launchers import TEST_SETTINGS, make_config


class InlineExecutor(Executor):
    """Runs each submitted deletion at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


class ReadThroughComponents:
    """The registered pool components as ZooKeeper holds them now (`ComponentCache.pools`,
    read on every call)."""

    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    def pools(self) -> list[Component]:
        root = f"{paths.COMPONENTS}/pool"
        found: list[Component] = []
        for name in self.zk.get_children(root) or []:
            got = self.zk.get(f"{root}/{name}")
            if got is None:
                continue
            component = decode_component("pool", name, got[0],
                                         got[1].ephemeral_owner)
            if component is not None and component.id and component.owner:
                found.append(component)
        return found


class UpkeepDeps(WorkerDeps):
    """`WorkerDeps` and what the cleanup worker uses on top (`CleanupDeps`)."""

    def __init__(self, zk: ZkClient, config: Config, clock: ManualClock,
                 settings: EngineSettings = TEST_SETTINGS) -> None:
        super().__init__(zk, config, clock, settings)
        self.woken_all = 0
        self.deleter: NodeDeleter | None = None  # set by `Upkeep`
        self.components = ReadThroughComponents(zk)  # type: ignore[assignment]

    def wake_all(self) -> None:
        self.woken_all += 1

    def request_delete(self, node_id: str, reason: str) -> bool:
        """As the launcher hands a pool worker's deletion (making room at quota) to its
        deleter: only while the node is still a ready spare."""
        self.deletions.append((node_id, reason))
        assert self.deleter is not None
        return self.deleter.submit(node_id, reason, lambda node: node.state
                                   == model.NodeState.READY and not node.allocated_to)


class Upkeep:
    """A cleanup worker, its deleter and leak sweep, stepped by the test."""

    def __init__(self, deps: UpkeepDeps) -> None:
        self.deps = deps
        self.first = LaunchFirst(self._other_pool_waits)
        self.deleter = deps.deleter = NodeDeleter(deps, workers=1, executor=InlineExecutor(),
                                                  first=self.first)
        self.cleanup = CleanupWorker(deps, self.deleter)
        self.sweeper = self.cleanup.leaks

    def _other_pool_waits(self, provider: str) -> bool:
        """As the launcher asks: a registered pool of `provider` is paused."""
        return any(c.paused and c.provider_name == provider
                   for c in self.deps.components.pools())

    @property
    def clock(self) -> ManualClock:
        return self.deps.clock

    def pool_worker(self, pool: str = "main") -> tuple[PoolWorker, InlineLaunches]:
        """The pool worker of pool `pool` of provider `fake` on the same deps, registered;
        its launches run on `run_all`."""
        launches = InlineLaunches(self.first)
        worker = PoolWorker(self.deps, "fake", pool, launches,  # type: ignore[arg-type]
                            fqdn="test-host", first=self.first)
        worker.register()
        return worker, launches

    def min_ready(self) -> MinReadyWorker:
        return MinReadyWorker(self.deps)  # type: ignore[arg-type]

    @property
    def fake(self) -> Any:
        return self.deps.provider

    def step(self, seconds: float = 0.0) -> float | None:
        """Move the clock on by `seconds`, then run one cleanup pass as its timer or an
        event would (a full one only when its time has come); its next deadline."""
        self.clock.advance(seconds)
        return self.cleanup.run_once()

    def full_pass(self, seconds: float = 0.0) -> float | None:
        """Move the clock on by `seconds`, then run one full cleanup pass."""
        self.cleanup.request_full_pass()
        return self.step(seconds)

    # -- records, as a launcher and Zuul leave them ---------------------------------------
    def node(self, state: str = model.NodeState.USED, label: str = "small", *,
             allocated_to: str | None = None, hold_expiration: float | None = None,
             resource: bool = True, state_time: float | None = None,
             launcher: str | None = None) -> str:
        """A node record of provider `fake`, pool `main`, with its resource in the fake
        cloud (unless not `resource`), built by pool id `launcher` (none: nobody's); its
        id."""
        node = Node(id="", state=model.NodeState(state),
                    state_time=self.clock.time() if state_time is None else state_time,
                    type=[label])
        node.set(provider="fake", pool="main", allocated_to=allocated_to,
                 hold_expiration=hold_expiration, launcher=launcher)
        txn = Txn()
        index = NodeStore.add_create(txn, node)
        node_id = NodeStore.created_id(txn.commit(self.deps.zk)[index])
        if resource:
            # Named as the fake names a launch's resource (the node id is known now).
            external_id = f"main-{node_id}"
            node.set(external_id=external_id)
            self.deps.zk.set(paths.node_path(node_id), node_codec.encode(node))
            self.fake.add_resource(external_id, node_id)
        return node_id

    def record(self, node_id: str) -> Node | None:
        return self.deps.nodes.get(node_id)

    def state(self, node_id: str) -> str | None:
        node = self.record(node_id)
        return node.state if node is not None else None

    def locked(self, node_id: str) -> bool:
        return bool(self.deps.zk.get_children(paths.node_lock_path(node_id)))


def make_upkeep(zk: ZkConnection, zkc: ZkClient, body: str,
                settings: EngineSettings = TEST_SETTINGS,
                clock: ManualClock | None = None) -> Upkeep:
    """An `Upkeep` for the launcher config `body` (YAML) on its own ManualClock."""
    config = make_config(zk, textwrap.dedent(body))
    # Ages of records ZooKeeper stamps (a znode's mtime) are judged from this clock's wall
    # time at the first look: it starts at the real time.
    return Upkeep(UpkeepDeps(zkc, config, clock or ManualClock(start=time.time()), settings))
