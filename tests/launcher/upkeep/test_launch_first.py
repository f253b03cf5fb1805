"""Launch first, stepped on a ManualClock (support.Upkeep): a used node's deletion waits
while a launch of this launcher is queued or running and no pool of its provider waits for
quota; it starts when the last launch returned, at once when a request waits for quota,
and after `delete_defer_max` seconds however many launches follow each other.
"""

from __future__ import annotations

from nodepool_k8s.core import model
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.cache import CacheEvent
from tests.launcher.requests.support import pool_yaml
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep


def state(world: Upkeep, request_id: str) -> str | None:
    request = world.deps.requests.get(request_id)
    return request.state if request is not None else None


def used_node(world: Upkeep) -> str:
    """A node Zuul just marked used: its cache event tells the cleanup worker."""
    node_id = world.node(model.NodeState.USED)
    world.cleanup.on_node_event(CacheEvent.CHANGED, node_id)
    return node_id


def gone(world: Upkeep, node_id: str) -> bool:
    """The node's znode and its namespace in the fake cloud are gone."""
    return world.record(node_id) is None \
        and f"main-{node_id}" not in world.fake.resource_ids()


def test_a_deletion_waits_while_a_launch_runs(upkeep: MakeUpkeep, zuul: ZuulClient) -> None:
    world = upkeep(pool_yaml(max_servers=10))
    worker, launches = world.pool_worker()
    used = used_node(world)
    request_id = zuul.submit(["small"])
    worker.run_once()
    assert len(launches.queued) == 1  # accepted, its launch not run yet
    world.step()
    # Nobody waits for what the node frees: it stays as it was, unlocked, counted.
    assert world.state(used) == model.NodeState.USED and not world.locked(used)
    assert f"main-{used}" in world.fake.resource_ids()
    assert world.deleter.deferred() == 1 and world.deleter.busy(used)
    # Another event of the node does not start it either.
    world.cleanup.on_node_event(CacheEvent.LOCK, used)
    world.step(1.0)
    assert world.state(used) == model.NodeState.USED
    # The last launch returns: the deletion starts at once (in that thread, here).
    launches.run_all()
    assert gone(world, used) and world.deleter.deferred() == 0
    worker.run_once()
    assert state(world, request_id) == model.RequestState.FULFILLED


def test_a_deletion_starts_at_once_when_a_request_waits_for_quota(
        upkeep: MakeUpkeep, zuul: ZuulClient) -> None:
    world = upkeep(pool_yaml(max_servers=2))
    worker, launches = world.pool_worker()
    used = used_node(world)
    first = zuul.submit(["small"])
    worker.run_once()
    world.step()
    assert world.state(used) == model.NodeState.USED and world.deleter.deferred() == 1
    # The pool is full (the used node counts): the next request waits for quota, and the
    # deletion that frees it starts while the launch is still queued.
    waiting = zuul.submit(["small"])
    worker.run_once()
    assert worker.paused and len(launches.queued) == 1
    assert gone(world, used) and world.deleter.deferred() == 0
    # While it waits, a deletion asked for now does not wait either.
    other = used_node(world)
    world.step()
    assert gone(world, other)
    launches.run_all()
    worker.run_once()
    launches.run_all()
    worker.run_once()
    assert state(world, first) == state(world, waiting) == model.RequestState.FULFILLED


def test_a_deletion_starts_after_the_bound_under_a_steady_stream(
        upkeep: MakeUpkeep, zuul: ZuulClient) -> None:
    world = upkeep(pool_yaml(max_servers=50))
    bound = world.deps.settings.delete_defer_max
    assert bound > 0
    worker, launches = world.pool_worker()
    zuul.submit(["small"])
    worker.run_once()
    used = used_node(world)
    due = world.step()
    assert world.state(used) == model.NodeState.USED and world.deleter.deferred() == 1
    # The cleanup worker wakes by the bound without any event.
    assert due is not None and due <= world.clock.monotonic() + bound
    # A launch is always queued: each step another request comes before the oldest
    # launch returns.
    steps = 4
    for _ in range(steps):
        world.clock.advance(bound / (steps + 1))
        zuul.submit(["small"])
        worker.run_once()
        launches.run_oldest()
        worker.run_once()
        world.step()
        assert launches.queued
        assert world.state(used) == model.NodeState.USED
    world.step(bound / (steps + 1))
    assert launches.queued and gone(world, used)


def test_the_full_pass_waits_for_the_launches_within_the_bound(
        upkeep: MakeUpkeep, zuul: ZuulClient) -> None:
    world = upkeep(pool_yaml(max_servers=50))
    bound = world.deps.settings.delete_defer_max
    worker, launches = world.pool_worker()
    zuul.submit(["small"])
    worker.run_once()
    # A used node no event told the cleanup worker of: only a full pass finds it.
    used = world.node(model.NodeState.USED)
    due = world.full_pass()
    assert world.state(used) == model.NodeState.USED and world.deleter.deferred() == 0
    assert due is not None and due <= world.clock.monotonic() + bound
    launches.run_all()
    world.step()
    assert gone(world, used)
    # Under launches that never stop, it runs after the bound (and its deletion waits
    # for them at most as long again).
    zuul.submit(["small"])
    worker.run_once()
    other = world.node(model.NodeState.USED)
    world.full_pass()
    assert world.state(other) == model.NodeState.USED and world.deleter.deferred() == 0
    world.step(bound)
    assert world.deleter.deferred() == 1
    world.step(bound)
    assert launches.queued and gone(world, other)
