"""The pool worker and the cleanup worker on the same records, one pass at a time
(support.Upkeep): reuse of a ready node; a cancellation during a launch keeps the node
ready, unallocated and reused; a lost pending request is reset and served again, its
orphaned `init` node removed, and one Zuul deletes during the reset is simply gone; a
launch that fails every retry fails its request, and the good node of the request stays
for reuse."""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import LaunchError
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import CacheEvent
from tests.launcher.requests.test_pool_worker import idle
from tests.launcher.test_cleanup import body
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep

# Launches run in the test's thread: the `slow` label is a second label here, not slow.
CONFIG = body(slow=0)


def served(world: Upkeep, request_id: str) -> list[str]:
    request = world.deps.requests.get(request_id)
    assert request is not None and request.state == model.RequestState.FULFILLED, request
    return list(request.nodes)


def launches_made(world: Upkeep) -> int:
    return int(world.fake.call_names().count("launch"))


def test_reuse_ready_node(upkeep: MakeUpkeep) -> None:
    world = upkeep(CONFIG)
    worker, launches = world.pool_worker()
    node_id = idle(world.deps, worker, launches, "small")
    before = launches_made(world)
    request_id = world.deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    assert served(world, request_id) == [node_id]
    assert launches_made(world) == before
    node = world.record(node_id)
    request = world.deps.requests.get(request_id)
    assert node is not None and request is not None
    assert node.allocated_to == request_id and node.requestor == request.requestor
    other = world.deps.submit(["slow"])
    worker.run_once()
    launches.run_all()
    assert served(world, other) != [node_id]


def test_cancel_during_launch_keeps_node_for_reuse(upkeep: MakeUpkeep) -> None:
    world = upkeep(CONFIG)
    worker, launches = world.pool_worker()
    request_id = world.deps.submit(["slow"])
    worker.run_once()
    [node_id] = world.deps.nodes.ids()  # created, its launch not yet run
    world.deps.zk.delete(paths.request_path(request_id))  # Zuul cancels
    launches.run_all()
    worker.run_once()
    world.cleanup.on_request_event(CacheEvent.REMOVED, request_id)  # as the cache says
    world.step()
    node = world.record(node_id)
    assert node is not None and node.state == model.NodeState.READY, node
    assert node.allocated_to is None
    again = world.deps.submit(["slow"])
    worker.run_once()
    launches.run_all()
    assert served(world, again) == [node_id]


def test_lost_pending_request_is_reset(upkeep: MakeUpkeep, kazoo_client: KazooClient) -> None:
    world = upkeep(CONFIG)
    request_id = world.deps.submit(["small"])
    # A launcher died after accepting it and creating (not yet locking) a node.
    raw = json.loads(kazoo_client.get(paths.request_path(request_id))[0])
    raw.update(state="pending", declined_by=[], nodes=[], reuse=True)
    kazoo_client.set(paths.request_path(request_id), json.dumps(raw).encode())
    orphan = {"state": "init", "type": ["small"], "provider": "fake", "pool": "main",
              "allocated_to": request_id, "state_time": 1.0}
    orphan_id = paths.basename(kazoo_client.create(
        paths.NODE_CREATE_PREFIX, json.dumps(orphan).encode(), sequence=True, makepath=True))
    worker, launches = world.pool_worker()
    world.full_pass()
    request = world.deps.requests.get(request_id)
    assert request is not None and request.state == model.RequestState.REQUESTED
    assert request.nodes == []
    worker.run_once()
    launches.run_all()
    assert served(world, request_id) != [orphan_id]
    world.full_pass()
    assert world.record(orphan_id) is None


def test_launch_failure_fails_request(upkeep: MakeUpkeep) -> None:
    world = upkeep(CONFIG)
    worker, launches = world.pool_worker()
    # Every attempt for the request's first node fails.
    world.fake.fail_next(3, LaunchError("boom"), node_id="0000000000")
    request_id = world.deps.submit(["small", "small"])
    for _ in range(4):  # each retry is launched by a later pass
        worker.run_once()
        launches.run_all()
    request = world.deps.requests.get(request_id)
    assert request is not None and request.state == model.RequestState.FAILED
    assert request.nodes == []
    # The failed node is deleted; the good one stays, ready and unallocated, for reuse.
    world.full_pass()
    nodes = [world.record(i) for i in world.deps.nodes.ids()]
    assert [(n.state, n.allocated_to) for n in nodes if n is not None] == [
        (model.NodeState.READY, None)]
    assert "nodepool.launch.error.nodepool" in world.deps.stats.backend.keys(  # type: ignore
        "incr")


def test_lost_request_deleted_during_its_reset(upkeep: MakeUpkeep, zuul: ZuulClient,
                                               kazoo_client: KazooClient) -> None:
    """Zuul may delete a request at any moment (no lock needed), also while the cleanup is
    resetting it as lost: that is not a failure of the cleanup step (an ERROR with a
    traceback), the request is simply gone."""
    world = upkeep(CONFIG)
    # Pending, unlocked: a launcher died after accepting it.
    raw = json.loads(zuul.request_body(["small"]))
    raw.update(state="pending", declined_by=[], nodes=[], reuse=True)
    request_id = paths.basename(kazoo_client.create(
        f"{paths.REQUESTS}/200-", json.dumps(raw).encode(), sequence=True, makepath=True))
    got = world.deps.requests.lock_and_read(request_id)
    assert got is not None
    lock, fresh = got
    zuul.cancel(request_id)  # between the cleanup's read and its write
    world.cleanup._reset(fresh, lock)
    lock.release()  # as its caller does
    assert zuul.get_request(request_id) is None
    assert kazoo_client.get_children(paths.request_lock_path(request_id)) == []
