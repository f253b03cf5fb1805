"""Which launcher deletes a node, stepped on a ManualClock (support.Upkeep) with other
launchers' pool registrations in real ZooKeeper sessions: the launcher that built a node
deletes it at once; another launcher leaves it to the builder for `delete_grace` seconds
in its state, or takes it at once when the builder's registration is gone (it died), so
nothing waits for a dead builder and nothing is fought over by live ones, also when the
node cache left the node's changes unread while its builder lived. With the launcher's
rule (`Engine._left_to_builder`) on a real node cache: Zuul's use and release of such a
node, and its builder's de-allocation, are not read; the cleanup reads the entry once it
has been left unread, unlocked, for the grace, and min-ready and the tenant limits read
what they count.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.launcher.context import Engine
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import CacheEvent, NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.registry import ComponentRegistry, pool_worker_id
from tests.helpers import Signal, wait_for
from tests.launcher.requests.support import ReadThroughNodes
from tests.launcher.test_cleanup import body
from tests.launcher.test_min_ready import MIN_READY, min_ready_requests
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep
from tests.launchers import TEST_SETTINGS

USED = model.NodeState.USED


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
        upkeep: MakeUpkeep, other: ZkClient) -> None:
    world = upkeep(body())
    grace = world.deps.settings.delete_grace
    assert grace > 2
    ours = register(world.deps.registry)
    theirs = register_other(other)
    mine = world.node(USED, launcher=ours)
    their_node = world.node(USED, launcher=theirs)
    stranger = world.node(USED, launcher=pool_worker_id("fake", "main", fqdn="gone-host"))
    nobodys = world.node(USED)
    deadline = world.step()
    # Ours, and those of no live launcher, at once.
    assert world.record(mine) is None
    assert world.record(stranger) is None
    assert world.record(nobodys) is None
    # The live builder's: left alone, not even a lock attempt; the worker is due again
    # when the grace ends.
    assert world.state(their_node) == USED
    assert not attempted(world, their_node)
    assert deadline is not None and deadline <= world.clock.monotonic() + grace + 1e-6
    world.step(grace - 1)
    assert world.state(their_node) == USED and not attempted(world, their_node)
    world.step(2)
    assert world.record(their_node) is None  # the builder never did: we do


def test_dead_builders_node_deleted_at_once(upkeep: MakeUpkeep, other: ZkClient) -> None:
    world = upkeep(body())
    theirs = register_other(other)
    node_id = world.node(USED, launcher=theirs)
    world.step()
    world.step(1)
    assert world.state(node_id) == USED
    other.stop()  # the builder is killed: its session and registration end
    # What the component cache says; the node is due at once, well within the grace.
    world.cleanup.on_component_event(CacheEvent.REMOVED, "pool/other-host0000000000")
    world.step()
    assert world.record(node_id) is None


def test_builders_grace_counts_in_the_nodes_state(upkeep: MakeUpkeep,
                                                  other: ZkClient) -> None:
    """A full pass (the safety net) defers the same way, and a node used for longer than
    the grace already is everyone's."""
    world = upkeep(body())
    grace = world.deps.settings.delete_grace
    theirs = register_other(other)
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
        upkeep: MakeUpkeep, other: ZkClient) -> None:
    """The cache still shows the node ready for a request that is gone (a de-allocation);
    the fresh read shows it used: still the builder's to delete."""
    world = upkeep(body())
    theirs = register_other(other)
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
        upkeep: MakeUpkeep, other: ZkClient, zkc: ZkClient,
        kazoo_client: KazooClient) -> None:
    """The real node cache, which leaves the changes of a node another live launcher built
    for a request unread (`Engine._left_to_builder`): Zuul's `used` is not read while the
    builder lives (its to delete, no lock attempt here); once the builder goes, the node is
    deleted at once (the cleanup refreshes stale entries then, and reads candidates fresh
    before acting in any case)."""
    world = upkeep(body())
    theirs = register_other(other)
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
        other.stop()  # the builder is killed: its session and registration end
        world.cleanup.on_component_event(CacheEvent.REMOVED, "pool/other-host0000000000")
        world.step()
        assert world.record(node_id) is None
    finally:
        cache.stop()


# No full pass within a test (a full pass reads every stale entry): only the reads the
# rule and the grace call for.
QUIET = dataclasses.replace(TEST_SETTINGS, cleanup_interval=3600.0)


def rule_cache(world: Upkeep, zkc: ZkClient) -> NodeCache:
    """A real node cache on the world's clock, with the launcher's rule on the world's
    dependencies (its registry, the registered pools, its settings), started and given to
    the world's workers; the caller stops it."""
    cache = NodeCache(zkc, world.clock.monotonic)
    cache.left_to_builder = lambda node: Engine._left_to_builder(
        world.deps, node)  # type: ignore[arg-type]
    cache.start()
    assert cache.wait_synced(10)
    world.deps.node_cache = cache  # type: ignore[assignment]
    return cache


def shown(cache: NodeCache, node_id: str) -> None:
    """Wait until the cache holds the node as `Upkeep.node` left it (its external id)."""
    wait_for(lambda: (n := cache.get(node_id)) is not None and bool(n.external_id), 10,
             message="the cache to show the node")


def write_as(client: KazooClient, node_id: str, **changes: Any) -> None:
    """Another session's write of the node (Zuul's, its builder's)."""
    path = paths.node_path(node_id)
    body = json.loads(client.get(path)[0])
    body.update(changes)
    client.set(path, json.dumps(body).encode())


class Unread:
    """The node cache's data reads and skipped changes from now on."""

    def __init__(self, cache: NodeCache) -> None:
        self.mirror = cache._mirror
        self.reads, self.skipped = self.mirror.reads, self.mirror.skipped

    def read(self) -> int:
        return self.mirror.reads - self.reads

    def settled(self, cache: NodeCache, node_id: str, changes: int) -> None:
        """Wait until the cache has dealt with `changes` changes of the unlocked node and
        its lock's going: each either skipped or read."""
        wait_for(lambda: not cache.is_locked(node_id) and (
            self.mirror.skipped - self.skipped >= changes + 1 or self.read() > 0), 10,
            message="the cache to take in the changes")


def test_zuuls_release_of_a_live_builders_node_is_read_only_after_the_grace(
        upkeep: MakeUpkeep, other: ZkClient, zkc: ZkClient,
        kazoo_client: KazooClient) -> None:
    """Zuul took the node (its request is gone), used and released it. Its builder
    deletes it: this launcher reads none of that (no read, no lock attempt, no action on
    the `ready` it last read). Here the builder does not: the entry is read once it has
    been left unread for the grace (from the lock's going), and the node deleted."""
    world = upkeep(body(), settings=QUIET)
    grace = world.deps.settings.delete_grace
    theirs = register_other(other)
    cache = rule_cache(world, zkc)
    try:
        world.step()  # the first (full) pass
        node_id = world.node(model.NodeState.READY, allocated_to="200-0000000001",
                             launcher=theirs)
        shown(cache, node_id)
        counted = Unread(cache)
        zuul = Lock(kazoo_client, paths.node_lock_path(node_id))
        assert zuul.acquire(timeout=10)
        write_as(kazoo_client, node_id, state="in-use")
        write_as(kazoo_client, node_id, state="used")
        zuul.release()
        counted.settled(cache, node_id, changes=2)
        assert counted.read() == 0 and cache.is_stale(node_id)
        world.step()
        world.step(grace - 1)
        assert world.state(node_id) == USED and counted.read() == 0
        world.step(2)
        assert counted.read() == 1
        assert world.record(node_id) is None
    finally:
        cache.stop()


def test_a_spare_its_builder_made_of_a_returned_node_is_counted_by_min_ready(
        upkeep: MakeUpkeep, other: ZkClient, zkc: ZkClient,
        kazoo_client: KazooClient) -> None:
    """Zuul returned the node unused (`ready`; its request is gone) and its builder made
    a spare of it: that de-allocation is not read here, and this launcher does not offer
    the spare (its builder does). Min-ready reads the entries of the labels it counts
    before asking for more: the spare counts, no min-ready request is made."""
    world = upkeep(MIN_READY.format(count=1, max_servers=5), settings=QUIET)
    theirs = register_other(other)
    cache = rule_cache(world, zkc)
    try:
        node_id = world.node(model.NodeState.READY, allocated_to="200-0000000001",
                             launcher=theirs)
        shown(cache, node_id)
        counted = Unread(cache)
        zuul = Lock(kazoo_client, paths.node_lock_path(node_id))
        assert zuul.acquire(timeout=10)
        zuul.release()  # returned unused: no write
        builder = Lock(kazoo_client, paths.node_lock_path(node_id))
        assert builder.acquire(timeout=10)
        write_as(kazoo_client, node_id, allocated_to=None)
        builder.release()
        counted.settled(cache, node_id, changes=1)
        assert counted.read() == 0
        left = cache.get(node_id)
        assert left is not None and left.allocated_to == "200-0000000001"
        world.min_ready().run_once()
        assert not min_ready_requests(kazoo_client)
        spare = cache.get(node_id)
        assert spare is not None and not spare.allocated_to
    finally:
        cache.stop()


TENANT_LIMITED = """
labels:
  - name: small
tenant-resource-limits:
  - tenant-name: limited
    max-servers: 1
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
"""


def test_a_spare_handed_out_again_by_its_builder_counts_for_its_new_tenant(
        upkeep: MakeUpkeep, other: ZkClient, zkc: ZkClient, kazoo_client: KazooClient,
        zuul: ZuulClient) -> None:
    """The builder made a spare of a node Zuul returned unused and handed it out to a
    request of tenant `limited` (at its limit of one server with it): this launcher's
    entry still shows the old request's tenant. Before it counts the tenant's usage, the
    pool worker reads the entries left to other launchers: the request waits."""
    world = upkeep(TENANT_LIMITED, settings=QUIET)
    theirs = register_other(other)
    cache = rule_cache(world, zkc)
    worker, launches = world.pool_worker()
    try:
        node_id = world.node(model.NodeState.READY, allocated_to="200-0000000001",
                             launcher=theirs)
        node = world.record(node_id)
        assert node is not None
        node.set(tenant_name="free")
        world.deps.zk.set(paths.node_path(node_id), node_codec.encode(node))
        wait_for(lambda: (n := cache.get(node_id)) is not None and n.tenant_name == "free",
                 10, message="the cache to show the node's tenant")
        counted = Unread(cache)
        builder = Lock(kazoo_client, paths.node_lock_path(node_id))
        assert builder.acquire(timeout=10)  # de-allocated and handed out again
        write_as(kazoo_client, node_id, allocated_to="200-0000000002", tenant_name="limited")
        builder.release()
        counted.settled(cache, node_id, changes=1)
        left = cache.get(node_id)
        assert counted.read() == 0 and left is not None and left.tenant_name == "free"
        request_id = zuul.submit(["small"], tenant_name="limited")
        worker.run_once()
        launches.run_all()
        worker.run_once()
        request = world.deps.requests.get(request_id)
        assert request is not None and request.state == model.RequestState.REQUESTED
        assert not request.nodes
        fresh = cache.get(node_id)
        assert fresh is not None and fresh.tenant_name == "limited"
    finally:
        cache.stop()
