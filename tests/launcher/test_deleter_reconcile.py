"""The deleter's reconcile loop, driven step by step.

A real ZooKeeper holds the node records; the FakeProvider is the cloud; time is a
ManualClock; each deleter pass runs at once in the calling thread (an inline executor), so
no thread races the test. Aspects: a resource gone at once removes the node in one pass; an
underway deletion parks the node (locked, `deleting`) until the provider's wake-up or its
`recheck_at`; the deleter alone keeps `delete-timeout` (a verifying look decides, then a
retry with back-off and a fresh deadline); a deletion stuck past the provider's grace is
reported once however often it is looked at; a provider error is retried with back-off.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import pytest

from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.core.model import Node
from nodepool_k8s.driver.fake import DEFERRED_RECHECK, FakeProvider
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.launcher.upkeep.deleter import NodeDeleter
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.runtime.stats import RecordingBackend, Stats, delete_stuck_key
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.txn import Txn

DELETE_TIMEOUT = 270.0  # not a multiple of the fake's DEFERRED_RECHECK
RETRY = 5.0


class InlineExecutor(Executor):
    """Runs each submitted pass at once, in the caller's thread."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


@dataclass
class Events:
    """The event log's interface the deletion protocol uses, kept in memory."""

    clock: ManualClock
    kinds: list[str] = field(default_factory=list)

    def record(self, kind: str, **fields: Any) -> None:
        self.kinds.append(kind)

    record_batched = record


@dataclass
class Deps:
    """What the deleter uses of the launcher (`deleter.DeleterDeps`)."""

    clock: ManualClock
    nodes: NodeStore
    providers: dict[str, FakeProvider]
    stats: Stats
    events: Events
    settings: EngineSettings = EngineSettings(delete_retry=RETRY, delete_retry_max=60.0)
    stopping: threading.Event = field(default_factory=threading.Event)
    acting: bool = True

    def provider_config(self, name: str | None) -> ProviderConfig | None:
        provider = self.providers.get(name or "")
        return provider.config if provider is not None else None


@dataclass
class World:
    deps: Deps
    deleter: NodeDeleter
    fake: FakeProvider
    backend: RecordingBackend

    @property
    def clock(self) -> ManualClock:
        return self.deps.clock

    def node(self, external_id: str = "main-res") -> str:
        """A used node whose resource exists."""
        node = Node(id="", state=model.NodeState.USED, state_time=self.clock.time(), type=["small"])
        node.set(provider="fake", pool="main", external_id=external_id)
        txn = Txn()
        index = NodeStore.add_create(txn, node)
        node_id = NodeStore.created_id(txn.commit(self.deps.nodes.zk)[index])
        self.fake.add_resource(external_id, node_id)
        return node_id

    def record(self, node_id: str) -> Node | None:
        return self.deps.nodes.get(node_id)

    def stuck_reports(self) -> int:
        return self.backend.keys("incr").count(delete_stuck_key("fake"))


@pytest.fixture
def zkc(zkc: ZkClient) -> ZkClient:
    """The suite's client, with the nodes' path in place."""
    zkc.ensure_path(paths.NODES)
    return zkc


@pytest.fixture
def world(zkc: ZkClient) -> Iterator[World]:
    clock = ManualClock(start=1_000_000.0)
    label = PoolLabel(name="small", type="namespace")
    config = ProviderConfig(name="fake", driver="fake", delete_timeout=DELETE_TIMEOUT,
                            pools={"main": PoolConfig(name="main", provider="fake",
                                                      labels={"small": label})})
    fake = FakeProvider(config, clock=clock)
    backend = RecordingBackend()
    deps = Deps(clock=clock, nodes=NodeStore(zkc), providers={"fake": fake},
                stats=Stats(backend), events=Events(clock))
    deleter = NodeDeleter(deps, workers=1, executor=InlineExecutor())  # type: ignore[arg-type]
    yield World(deps, deleter, fake, backend)
    deleter.shutdown(wait=True)


def test_gone_at_once_removes_the_node_in_one_pass(world: World) -> None:
    node_id = world.node()
    assert world.deleter.submit(node_id, "used")
    assert world.record(node_id) is None
    assert world.fake.resource_ids() == set()
    assert world.fake.call_names().count("delete") == 1
    assert (world.deleter.deleted, world.deleter.parked()) == (1, 0)
    assert not world.deleter.busy(node_id) and world.deleter.retry_entries() == 0


def test_underway_parks_the_node_until_the_wake_up(world: World) -> None:
    world.fake.defer_deletions()
    node_id = world.node()
    assert world.deleter.submit(node_id, "used")
    node = world.record(node_id)
    assert node is not None and node.state == model.NodeState.DELETING
    assert world.deleter.parked() == 1 and world.deleter.busy(node_id)
    assert not world.deleter.submit(node_id, "used")  # one deletion per node
    # The next look is the provider's `recheck_at`; nothing is due before it.
    assert world.deleter.next_retry() == world.clock.monotonic() + DEFERRED_RECHECK
    world.deleter.resume_due()
    assert world.fake.call_names().count("delete") == 1
    world.fake.finish_deletions()  # its wake-up: looked at again at once, and gone
    assert world.record(node_id) is None
    assert (world.deleter.deleted, world.deleter.parked()) == (1, 0)
    assert world.fake.call_names().count("delete") == 2
    assert world.deleter.next_retry() == float("inf")


def test_underway_is_looked_at_again_at_recheck_at_without_a_wake_up(world: World) -> None:
    world.fake.defer_deletions()
    node_id = world.node()
    world.deleter.submit(node_id, "used")
    world.clock.advance(DEFERRED_RECHECK)
    world.deleter.resume_due()  # the cleanup pass, woken by `next_retry`
    assert world.fake.call_names().count("delete") == 2
    assert world.deleter.parked() == 1  # still underway: parked again
    with world.fake.cloud.lock:
        world.fake.cloud.resources.clear()  # went, and no wake-up came
    world.clock.advance(DEFERRED_RECHECK)
    world.deleter.resume_due()
    assert world.record(node_id) is None and world.deleter.parked() == 0


def test_a_wake_up_during_the_pass_that_parks_is_not_lost(world: World) -> None:
    # The resource goes while the pass that gets `Underway` still runs: the wake-up comes
    # before the node is parked, and the node is finished at once, not at `recheck_at`.
    world.fake.defer_deletions(early_notice=True)
    node_id = world.node()
    world.deleter.submit(node_id, "used")
    assert world.record(node_id) is None and world.deleter.parked() == 0


def test_the_deleter_owns_the_deadline(world: World) -> None:
    world.fake.defer_deletions()
    node_id = world.node()
    world.deleter.submit(node_id, "used")
    deadline = world.clock.monotonic() + DELETE_TIMEOUT
    looks = 1
    while world.deleter.next_retry() < deadline:
        world.clock.advance(world.deleter.next_retry() - world.clock.monotonic())
        world.deleter.resume_due()
        looks += 1
        assert world.deleter.parked() == 1 and world.deleter.retry_entries() == 0
    # The provider asks for a look every 60 s; the last one before the deadline is due at
    # the deadline, not after it.
    assert looks == 5 and world.deleter.next_retry() == deadline
    world.clock.advance(deadline - world.clock.monotonic())
    world.deleter.resume_due()  # the verifying look: still underway, so a failure
    node = world.record(node_id)
    assert node is not None and node.state == model.NodeState.DELETING
    assert node.extra.get("delete_failures") == 1
    deleting = cond.find(node.conditions, cond.DELETING)
    assert deleting is not None and "delete-timeout" in deleting.message
    assert world.deleter.parked() == 0 and world.deleter.retry_entries() == 1
    assert not world.deleter.busy(node_id)
    # The retry (after its back-off) starts a fresh deadline.
    assert not world.deleter.submit(node_id, "used")
    world.clock.advance(RETRY)
    assert world.deleter.due_retries() == [node_id]
    assert world.deleter.submit(node_id, "used")
    assert world.deleter.parked() == 1
    assert world.deleter.next_retry() == world.clock.monotonic() + DEFERRED_RECHECK


def test_stuck_past_the_grace_is_reported_once(world: World) -> None:
    # The fake says "stuck" on every look past its grace; the deleter shows it once.
    world.fake.defer_deletions(stuck_after=2 * DEFERRED_RECHECK)
    node_id = world.node()
    world.deleter.submit(node_id, "used")
    for _ in range(4):
        world.clock.advance(DEFERRED_RECHECK)
        world.deleter.resume_due()
    assert world.fake.call_names().count("delete") == 5
    assert world.stuck_reports() == 1
    assert world.deps.events.kinds.count("delete-stuck") == 1
    node = world.record(node_id)
    assert node is not None
    deleting = cond.find(node.conditions, cond.DELETING)
    assert deleting is not None and deleting.reason == "DeletionStuck"
    world.fake.finish_deletions()
    assert world.record(node_id) is None and world.stuck_reports() == 1


def test_a_provider_error_is_retried_with_back_off(world: World) -> None:
    node_id = world.node()
    world.fake.fail_next(2, TemporaryError("api down"), op="delete")
    assert world.deleter.submit(node_id, "used")
    node = world.record(node_id)
    assert node is not None and node.state == model.NodeState.DELETING
    assert node.extra.get("delete_failures") == 1
    assert world.deleter.next_retry() == world.clock.monotonic() + RETRY
    assert not world.deleter.submit(node_id, "used")  # not before its back-off
    world.clock.advance(RETRY)
    assert world.deleter.submit(node_id, "used")  # fails again: the back-off doubles
    assert world.deleter.next_retry() == world.clock.monotonic() + 2 * RETRY
    world.clock.advance(RETRY)
    assert world.deleter.due_retries() == []
    world.clock.advance(RETRY)
    assert world.deleter.submit(node_id, "used")
    assert world.record(node_id) is None
    assert world.deleter.retry_entries() == 0 and world.deleter.next_retry() == float("inf")


def test_a_leak_goes_through_the_same_loop(world: World) -> None:
    world.fake.defer_deletions(stuck_after=DEFERRED_RECHECK)
    world.fake.add_resource("main-leaked", None)
    assert world.deleter.delete_leak("fake", "main-leaked")
    assert world.deleter.parked() == 1
    assert not world.deleter.delete_leak("fake", "main-leaked")
    for _ in range(3):
        world.clock.advance(DEFERRED_RECHECK)
        world.deleter.resume_due()
    assert world.stuck_reports() == 1 and world.deleter.parked() == 1
    world.fake.finish_deletions()
    assert world.deleter.parked() == 0 and world.deleter.leaks_deleted == 1
    assert world.fake.resource_ids() == set()
