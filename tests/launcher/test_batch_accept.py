"""Requests waiting together are accepted together (issue 15).

Aspects: requests found waiting in one pass are locked with one round trip and their
nodes created by one guarded transaction (one bump of the provider's guard instead of one
each), never beyond the pool's quota: the batch stops where the quota does, the next
request pauses the pool as before, and the rest are served as capacity frees, in order.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for
from tests.launchers import LauncherFactory, small_pool

FIVE = small_pool(5)


def states(zuul: ZuulClient, ids: list[str]) -> list[str]:
    return [str((zuul.get_request(i) or {}).get("state")) for i in ids]


def test_waiting_requests_are_accepted_in_one_batch_within_quota(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    ids = [zuul.submit(["small"]) for _ in range(8)]  # waiting before the launcher starts
    launcher = launchers(FIVE)
    wait_for(lambda: states(zuul, ids).count("fulfilled") == 5, 30,
             message="five requests fulfilled")
    # The first five are served (priority order), the sixth holds the paused pool.
    assert states(zuul, ids)[:5] == ["fulfilled"] * 5
    assert states(zuul, ids)[5:] == ["pending", "requested", "requested"]
    # All five nodes came from one guarded create: the guard was bumped once.
    guard = kazoo_client.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1
    fake = launcher.providers["fake"]
    assert fake.peak_resources() == 5  # type: ignore[attr-defined]
    # The rest follow as the nodes are returned, never above the limit.
    for request_id in ids[:5]:
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)
    wait_for(lambda: states(zuul, ids[5:]) == ["fulfilled"] * 3, 30,
             message="the last three requests fulfilled")
    assert fake.peak_resources() == 5  # type: ignore[attr-defined]


def test_a_member_locked_before_is_taken_the_ordinary_way_in_its_turn(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """A request whose lock dir exists (an earlier holder let go) cannot be locked in the
    batch's one transaction; it is locked the ordinary way, in its place, and still gets
    its node from the batch's guarded create."""
    ids = [zuul.submit(["small"]) for _ in range(3)]
    kazoo_client.ensure_path(paths.request_lock_path(ids[1]))  # empty: nobody holds it
    launchers(FIVE)
    wait_for(lambda: states(zuul, ids) == ["fulfilled"] * 3, 30,
             message="all three requests fulfilled")
    guard = kazoo_client.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1
    nodes = [(zuul.get_request(i) or {}).get("nodes") for i in ids]
    assert nodes == [["0000000000"], ["0000000001"], ["0000000002"]]  # in order
