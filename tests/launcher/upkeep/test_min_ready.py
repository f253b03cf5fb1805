"""min-ready's finishing step next to the cleanup worker, one pass at a time
(support.Upkeep): a spare whose node someone else holds locked."""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.core import model
from nodepool_k8s.zk import paths
from tests.launcher.test_min_ready import MIN_READY, min_ready_requests, spares
from tests.launcher.upkeep.conftest import MakeUpkeep


def test_finishing_a_min_ready_request_never_writes_a_node_locked_elsewhere(
        upkeep: MakeUpkeep, kazoo_client: KazooClient) -> None:
    """The launcher freed a fulfilled min-ready request's node with a versioned write but
    without its lock: an operator's `nodepool delete` holding the lock then failed with
    a version conflict ("bad version"). Now the node is locked first; one locked
    elsewhere keeps its allocation until the cleanup worker frees it, after the lock."""
    world = upkeep(MIN_READY.format(count=1, max_servers=5))
    min_ready = world.min_ready()
    worker, launches = world.pool_worker()
    min_ready.run_once()  # asks for the spare
    worker.run_once()
    launches.run_all()
    [request_id] = min_ready_requests(kazoo_client)
    request = world.deps.requests.get(request_id)
    assert request is not None and request.state == model.RequestState.FULFILLED
    [node_id] = request.nodes
    operator = Lock(kazoo_client, paths.node_lock_path(node_id))
    assert operator.acquire(timeout=10)
    try:
        version = kazoo_client.get(paths.node_path(node_id))[1].version
        min_ready.run_once()  # finishes its request
        assert not min_ready_requests(kazoo_client)
        data, stat = kazoo_client.get(paths.node_path(node_id))
        assert stat.version == version  # not written while the operator holds the lock
        assert json.loads(data)["allocated_to"]
        world.full_pass()
        assert kazoo_client.get(paths.node_path(node_id))[1].version == version
    finally:
        operator.release()
    world.full_pass()
    assert spares(kazoo_client) == [node_id]  # freed under its lock once the operator let go
