"""Which launcher deletes a node, stepped on a ManualClock (support.Upkeep) with other
launchers' pool registrations in real ZooKeeper sessions: the launcher that built a node
deletes it at once; another launcher leaves it to the builder for `delete_grace` seconds
in its state, or takes it at once when the builder's registration is gone (it died), so
nothing waits for a dead builder and nothing is fought over by live ones, also when the
node cache left the node's changes unread while its builder lived.
"""

from __future__ import annotations

from typing import Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import CacheEvent, NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.registry import ComponentRegistry, pool_worker_id
from tests.helpers import Signal, ZkConnection, client_for, wait_for
from tests.launcher.requests.support import ReadThroughNodes
from tests.launcher.test_cleanup import body
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep

USED = model.NodeState.USED


@pytest.fixture
def other_zkc(zk: ZkConnection) -> Iterator[ZkClient]:
    """Another launcher's ZooKeeper session."""
    client = client_for(zk)
    try:
        yield client
    finally:
        client.stop()


def register(registry: ComponentRegistry) -> str:
    """A pool of provider `fake` registered in `registry`; its id."""
    pool_id = pool_worker_id("fake", "main", fqdn=registry.hostname)
    registry.register_pool(pool_id, "fake", "main", ["small"], 100)
    return pool_id


def register_other(zkc: ZkClient) -> str:
    """A pool registered by another launcher (on `zkc`); its id."""
    return register(ComponentRegistry(zkc, "other-host"))


def attempted(world: Upkeep, node_id: str) -> bool:
    """Whether anyone ever tried to lock the node (the lock dir exists)."""
    return world.deps.zk.exists(paths.node_lock_path(node_id)) is not None


def test_builder_deletes_at_once_another_after_the_grace(
        upkeep: MakeUpkeep, other_zkc: ZkClient) -> None:
    world = upkeep(body())
    grace = world.deps.settings.delete_grace
    assert grace > 2
    ours = register(world.deps.registry)
    theirs = register_other(other_zkc)
    mine = world.node(USED, launcher=ours)
    other = world.node(USED, launcher=theirs)
    stranger = world.node(USED, launcher=pool_worker_id("fake", "main", fqdn="gone-host"))
    nobodys = world.node(USED)
    deadline = world.step()
    # Ours, and those of no live launcher, at once.
    assert world.record(mine) is None
    assert world.record(stranger) is None
    assert world.record(nobodys) is None
    # The live builder's: left alone, not even a lock attempt; the worker is due again
    # when the grace ends.
    assert world.state(other) == USED
    assert not attempted(world, other)
    assert deadline is not None and deadline <= world.clock.monotonic() + grace + 1e-6
    world.step(grace - 1)
    assert world.state(other) == USED and not attempted(world, other)
    world.step(2)
    assert world.record(other) is None  # the builder never did: we do


def test_dead_builders_node_deleted_at_once(upkeep: MakeUpkeep, other_zkc: ZkClient) -> None:
    world = upkeep(body())
    theirs = register_other(other_zkc)
    node_id = world.node(USED, launcher=theirs)
    world.step()
    world.step(1)
    assert world.state(node_id) == USED
    other_zkc.stop()  # the builder is killed: its session and registration end
    # What the component cache says; the node is due at once, well within the grace.
    world.cleanup.on_component_event(CacheEvent.REMOVED, "pool/other-host0000000000")
    world.step()
    assert world.record(node_id) is None


def test_builders_grace_counts_in_the_nodes_state(upkeep: MakeUpkeep,
                                                  other_zkc: ZkClient) -> None:
    """A full pass (the safety net) defers the same way, and a node used for longer than
    the grace already is everyone's."""
    world = upkeep(body())
    grace = world.deps.settings.delete_grace
    theirs = register_other(other_zkc)
    fresh = world.node(USED, launcher=theirs)
    old = world.node(USED, launcher=theirs, state_time=world.clock.time() - grace - 1)
    world.full_pass()
    assert world.state(fresh) == USED and not attempted(world, fresh)
    assert world.record(old) is None


class LaggingNodes(ReadThroughNodes):
    """A node cache one event behind for one node: it still holds the record as it was."""

    def __init__(self, inner: ReadThroughNodes, node_id: str, stale: Node) -> None:
        super().__init__(inner.zk, inner.store)
        self.node_id, self.stale = node_id, stale

    def get(self, node_id: str) -> Node | None:
        return self.stale if node_id == self.node_id else super().get(node_id)


def test_a_cache_behind_the_record_does_not_bypass_the_builder(
        upkeep: MakeUpkeep, other_zkc: ZkClient) -> None:
    """The cache still shows the node ready for a request that is gone (a de-allocation);
    the fresh read shows it used: still the builder's to delete."""
    world = upkeep(body())
    theirs = register_other(other_zkc)
    node_id = world.node(model.NodeState.READY, allocated_to="200-0000000001",
                         launcher=theirs)
    stale = world.record(node_id)
    assert stale is not None
    used = world.record(node_id)
    assert used is not None
    used.state = USED
    world.deps.zk.set(paths.node_path(node_id), node_codec.encode(used))
    world.deps.node_cache = LaggingNodes(world.deps.node_cache, node_id, stale)
    world.step()
    assert world.state(node_id) == USED and not attempted(world, node_id)


def test_a_dead_builders_node_the_cache_left_unread_is_read_and_deleted(
        upkeep: MakeUpkeep, other_zkc: ZkClient, zkc: ZkClient,
        kazoo_client: KazooClient) -> None:
    """The real node cache, which leaves the changes of a node another live launcher built
    for a request unread (`Engine._left_to_builder`): Zuul's `used` is not read while the
    builder lives (its to delete, no lock attempt here); once the builder goes, the node is
    deleted at once (the cleanup refreshes stale entries then, and reads candidates fresh
    before acting in any case)."""
    world = upkeep(body())
    theirs = register_other(other_zkc)
    cache = NodeCache(zkc)
    cache.left_to_builder = lambda n: n.launcher == theirs and bool(n.allocated_to)
    cache.start()
    try:
        assert cache.wait_synced(10)
        world.deps.node_cache = cache  # type: ignore[assignment]
        changes = Signal()
        cache.add_listener(changes)
        node_id = world.node(model.NodeState.IN_USE, allocated_to="200-0000000001",
                             launcher=theirs)
        changes.until(lambda: (n := cache.get(node_id)) is not None and bool(n.external_id),
                      10, message="the cache to show the node")
        used = world.record(node_id)
        assert used is not None
        used.state = USED
        kazoo_client.set(paths.node_path(node_id), node_codec.encode(used))  # Zuul's
        wait_for(lambda: node_id in cache.stale(), 10, message="the change to be counted")
        world.step()
        assert world.state(node_id) == USED and not attempted(world, node_id)
        other_zkc.stop()  # the builder is killed: its session and registration end
        world.cleanup.on_component_event(CacheEvent.REMOVED, "pool/other-host0000000000")
        world.step()
        assert world.record(node_id) is None
    finally:
        cache.stop()
