"""The wall clock steps under the cleanup worker (chrony's `makestep`, a resumed VM, an
operator's `date -s`): `ManualClock.step_wall` moves wall time alone, one cleanup pass
runs per step (support.Upkeep).

Aspects:
- a backward step stalls nothing that runs on the worker's own schedule: its full pass (a
  lost request is reset), a failed deletion's retry, another look at a deletion handed back
  as underway, the leak sweep, an empty node znode's removal, an orphaned request-lock
  dir's removal;
- ages of records are judged from when this launcher first saw them: a backward step does
  not keep a node past its `max-ready-age`, and a forward step of a day expires no held
  node early and sweeps no young resource as leaked; the table of ages is pruned with the
  nodes.

The pool worker's schedules under a step are in tests/launcher/test_clock_steps.py.
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.launcher.test_cleanup import body
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep
from tests.launchers import TEST_SETTINGS

HOUR = 3600.0
DAY = 86400.0


def lists(world: Upkeep) -> int:
    return int(world.fake.call_names().count("list"))


# -- the cleanup worker's own schedules ---------------------------------------------------

def test_backward_step_does_not_stall_the_full_cleanup_pass(
        upkeep: MakeUpkeep, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """A lost request is reset only by a full pass (no event announces it)."""
    world = upkeep(body())
    world.step()
    # A launcher died after accepting this request: pending, nobody holds its lock.
    raw = json.loads(zuul.request_body(["small"]))
    raw.update(state="pending", declined_by=[], nodes=[], reuse=True)
    path = kazoo_client.create(f"{paths.REQUESTS}/200-", json.dumps(raw).encode(),
                               sequence=True, makepath=True)
    world.step()  # no full pass is due yet
    request = world.deps.requests.get(paths.basename(path))
    assert request is not None and request.state == model.RequestState.PENDING
    world.clock.step_wall(-HOUR)
    world.step(TEST_SETTINGS.cleanup_interval + 1)
    request = world.deps.requests.get(paths.basename(path))
    assert request is not None and request.state == model.RequestState.REQUESTED
    assert request.nodes == []


def test_backward_step_does_not_stall_a_deletion_retry(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    world.fake.fail_next(1, TemporaryError("api down"), op="delete")
    node_id = world.node()
    world.step()
    assert world.deleter.retry_entries() == 1 and not world.deleter.busy(node_id)
    world.clock.step_wall(-HOUR)
    world.step(TEST_SETTINGS.delete_retry + 1)
    assert world.record(node_id) is None


def test_backward_step_does_not_stall_a_parked_deletion(upkeep: MakeUpkeep) -> None:
    """A deletion handed back as underway is asked about again at the provider's deadline
    when its notice never comes."""
    world = upkeep(body())
    world.fake.defer_deletions()
    node_id = world.node()
    world.step()
    assert world.deleter.parked() == 1
    asked = world.fake.call_names().count("delete")
    world.clock.step_wall(-HOUR)
    world.step(61)  # the fake names 60 s
    assert world.fake.call_names().count("delete") > asked
    world.fake.finish_deletions()
    assert world.record(node_id) is None


def with_leak(upkeep: MakeUpkeep, node_id: str) -> Upkeep:
    """Cleanup on a manual clock sweeping every 10 s, whose fake cloud holds a resource
    of node `node_id` that has no node record (a leak), added after a first pass."""
    world = upkeep(body(), settings=TEST_SETTINGS.replace(leak_sweep_interval=10.0))
    world.step()
    world.fake.add_resource(f"main-{node_id}", node_id)
    return world


def test_backward_step_does_not_stall_the_leak_sweep(upkeep: MakeUpkeep) -> None:
    world = with_leak(upkeep, "0000000999")
    before = lists(world)
    world.step(10)
    assert lists(world) > before  # the first sighting
    world.clock.step_wall(-HOUR)
    world.step(101)  # leak-grace is 100
    assert "main-0000000999" not in world.fake.resource_ids()


def test_backward_step_does_not_stall_empty_node_removal(upkeep: MakeUpkeep,
                                                         kazoo_client: KazooClient) -> None:
    world = upkeep(body())
    kazoo_client.create(paths.node_path("0000000700"), b"", makepath=True)
    world.step()
    assert kazoo_client.exists(paths.node_path("0000000700")) is not None
    world.clock.step_wall(-HOUR)
    world.step(TEST_SETTINGS.empty_node_age + 1)
    assert kazoo_client.exists(paths.node_path("0000000700")) is None


def test_backward_step_does_not_stall_lock_dir_removal(upkeep: MakeUpkeep,
                                                       kazoo_client: KazooClient) -> None:
    world = upkeep(body())
    lock_dir = paths.request_lock_path("200-0000000001")  # its request is gone
    kazoo_client.ensure_path(lock_dir)
    world.full_pass()
    world.clock.step_wall(-HOUR)
    world.full_pass(TEST_SETTINGS.lock_dir_max_age + 1)
    assert kazoo_client.exists(lock_dir) is None


# -- ages of records ----------------------------------------------------------------------

def test_backward_step_does_not_keep_a_node_past_max_ready_age(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    node_id = world.node(model.NodeState.READY)
    world.step()
    world.clock.step_wall(-HOUR)
    world.step(601)  # max-ready-age is 600
    assert world.record(node_id) is None


def test_forward_step_does_not_expire_a_held_node_early(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    node_id = world.node(model.NodeState.HOLD, hold_expiration=100)
    world.step()
    world.clock.step_wall(DAY)
    world.full_pass()
    assert world.state(node_id) == model.NodeState.HOLD
    assert world.deleter.deleted == 0
    world.full_pass(101)
    assert world.record(node_id) is None


def test_forward_step_does_not_sweep_a_young_resource(upkeep: MakeUpkeep) -> None:
    world = with_leak(upkeep, "0000000998")

    def sweep(seconds: float) -> None:
        before = lists(world)
        world.step(seconds)
        assert lists(world) > before

    sweep(10)  # first sighting
    world.clock.step_wall(DAY)
    sweep(10)  # second sighting: seen for 10 s, created 10 s ago (not a day)
    assert "main-0000000998" in world.fake.resource_ids()
    assert world.deleter.leaks_deleted == 0
    sweep(100)  # leak-grace over
    assert "main-0000000998" not in world.fake.resource_ids()
    assert world.deleter.leaks_deleted == 1


def test_age_tables_do_not_outlive_their_nodes(upkeep: MakeUpkeep) -> None:
    """The step-proof ages are one entry per node: gone with the node."""
    world = upkeep(body())
    ready = [world.node(model.NodeState.READY) for _ in range(3)]
    world.step()
    assert len(world.cleanup._node_ages) == 3
    for node_id in ready:
        got = world.deps.nodes.lock_and_read(node_id)
        assert got is not None
        lock, node = got
        node.state = model.NodeState.USED  # a build used it and gave it back
        world.deps.nodes.store_and_release(node, lock)
    world.full_pass()
    assert all(world.record(node_id) is None for node_id in ready)
    assert len(world.cleanup._node_ages) == 0
