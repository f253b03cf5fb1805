"""Requests waiting together are accepted together, one pass of the pool worker at a time
next to the cleanup worker (support.Upkeep).

Aspects: requests found waiting in one pass are locked with one round trip and their
nodes created by one guarded transaction (one bump of the provider's guard instead of one
each), never beyond the pool's quota: the batch stops where the quota does, the next
request pauses the pool as before, and the rest are served as capacity frees, in order; a
member whose lock dir exists is locked the ordinary way in its turn.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launchers import small_pool

FIVE = small_pool(5)


def states(zuul: ZuulClient, ids: list[str]) -> list[str]:
    return [str((zuul.get_request(i) or {}).get("state")) for i in ids]


def test_waiting_requests_are_accepted_in_one_batch_within_quota(
        upkeep: MakeUpkeep, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    ids = [zuul.submit(["small"]) for _ in range(8)]  # waiting before the worker's pass
    world = upkeep(FIVE)
    worker, launches = world.pool_worker()
    worker.run_once()
    assert launches.run_all() == 5
    # The first five are served (priority order), the sixth holds the paused pool.
    assert states(zuul, ids) == ["fulfilled"] * 5 + ["pending", "requested", "requested"]
    # All five nodes came from one guarded create: the guard was bumped once.
    guard = kazoo_client.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1
    assert world.fake.peak_resources() == 5
    # The rest follow as the nodes are returned, never above the limit.
    for request_id in ids[:5]:
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)
    world.full_pass()  # the returned nodes are deleted
    worker.run_once()
    launches.run_all()
    assert states(zuul, ids[5:]) == ["fulfilled"] * 3
    assert world.fake.peak_resources() == 5


def test_a_member_locked_before_is_taken_the_ordinary_way_in_its_turn(
        upkeep: MakeUpkeep, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """A request whose lock dir exists (an earlier holder let go) cannot be locked in the
    batch's one transaction; it is locked the ordinary way, in its place, and still gets
    its node from the batch's guarded create."""
    ids = [zuul.submit(["small"]) for _ in range(3)]
    kazoo_client.ensure_path(paths.request_lock_path(ids[1]))  # empty: nobody holds it
    world = upkeep(FIVE)
    worker, launches = world.pool_worker()
    worker.run_once()
    launches.run_all()
    assert states(zuul, ids) == ["fulfilled"] * 3
    guard = kazoo_client.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1
    nodes = [(zuul.get_request(i) or {}).get("nodes") for i in ids]
    assert nodes == [["0000000000"], ["0000000001"], ["0000000002"]]  # in order
