"""Pool quota with the pool worker and the cleanup worker on the same records, one pass at
a time (support.Upkeep): a full pool pauses (and says so in its registration), the paused
request goes first and the rest in priority order as capacity frees, never above the
limit; a full pool reclaims an idle node of another label."""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.pool_worker import PoolWorker
from tests.helpers import replaced
from tests.launcher.test_quota import LIMITED
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep
from tests.launcher.util import NodeCounter


def state(world: Upkeep, request_id: str) -> str | None:
    request = world.deps.requests.get(request_id)
    return request.state if request is not None else None


def registered_paused(worker: PoolWorker) -> bool:
    assert worker.registration is not None and worker.registration.path is not None
    got = worker.engine.zk.get(worker.registration.path)
    assert got is not None
    return bool(json.loads(got[0])["paused"])


def test_pool_limit_pauses_then_serves_in_order(upkeep: MakeUpkeep, zuul: ZuulClient,
                                                kazoo_client: KazooClient) -> None:
    counter = NodeCounter(kazoo_client)
    body = replaced(
        LIMITED.format(provider_max=100, pool_max=2),
        "      - name: two\n        max-servers: 2\n        labels:\n          - name: small\n"
        "            type: namespace\n            launch-delay: 0.02\n", "")
    world = upkeep(body)
    worker, launches = world.pool_worker("one")

    def serve() -> None:
        """A pass of the pool worker with its launches, after one of the cleanup (which
        deletes the nodes Zuul returned)."""
        world.full_pass()
        worker.run_once()
        launches.run_all()
        worker.run_once()

    held = []
    for _ in range(2):
        request_id = zuul.submit(["small"])
        serve()
        assert state(world, request_id) == model.RequestState.FULFILLED
        held.append(zuul.accept(request_id))
    # The pool is full: it accepts the next request, pauses and says so in its component.
    first = zuul.submit(["small"], priority="200")
    serve()
    assert worker.paused and registered_paused(worker)
    assert state(world, first) == model.RequestState.PENDING
    low = zuul.submit(["small"], priority="300")
    high = zuul.submit(["small"], priority="100")
    for nodeset in held:
        zuul.use(nodeset)
        zuul.release(nodeset)
    # The paused request goes first, then the higher priority; the low one waits again.
    serve()
    assert state(world, first) == state(world, high) == model.RequestState.FULFILLED
    assert state(world, low) in (model.RequestState.REQUESTED, model.RequestState.PENDING)
    for request_id in (first, high):
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)
    serve()
    assert state(world, low) == model.RequestState.FULFILLED
    zuul.cancel(low)
    serve()
    assert not worker.paused and not registered_paused(worker)
    assert counter.max.get("fake", 0) <= 2
    # Exact, unlike the sampling watcher: the cloud never held more than the pool allows.
    assert world.fake.peak_resources() == 2


def test_full_pool_reclaims_idle_node_of_other_label(upkeep: MakeUpkeep,
                                                     zuul: ZuulClient) -> None:
    world = upkeep(LIMITED.format(provider_max=1, pool_max=1))
    worker, launches = world.pool_worker("one")
    # Make an idle ready node of label "other": a request cancelled once fulfilled.
    idle = zuul.submit(["other"])
    worker.run_once()
    launches.run_all()
    [idle_node] = zuul.get_request(idle)["nodes"]  # type: ignore[index]
    zuul.cancel(idle)
    world.full_pass()  # the cleanup de-allocates it: its request is gone
    node = world.record(idle_node)
    assert node is not None and node.state == model.NodeState.READY
    assert node.allocated_to is None
    request_id = zuul.submit(["small"])
    for _ in range(3):  # accepted and paused at the limit; room made; launched
        worker.run_once()
        launches.run_all()
    assert state(world, request_id) == model.RequestState.FULFILLED
    assert world.record(idle_node) is None
    assert zuul.get_request(request_id)["nodes"] != [idle_node]  # type: ignore[index]
    assert world.deleter.deleted >= 1
