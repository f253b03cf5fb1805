"""The hand-back decisions as pure functions (`plan.served_elsewhere`, `plan.hand_back`,
`plan.RecentlyFailed`): who else could serve a request, when a pool that cannot serve it
lets it go, and how long a label handed back is left to other pools."""

from __future__ import annotations

from nodepool_k8s.core.model import MIN_READY_POOL, MIN_READY_REQUESTOR, NodeRequest
from nodepool_k8s.launcher import plan
from nodepool_k8s.launcher.plan import PoolInfo

ME = "me"
OTHER = PoolInfo("other", "far", frozenset({"small", "big"}), priority=2)
UNHEALTHY = plan.Unable(plan.Waiting("ProviderUnhealthy", "the API server of provider near"
                                     " cannot be used (Unreachable)"), since=100.0)


def request(*labels: str, declined_by: tuple[str, ...] = ()) -> NodeRequest:
    return NodeRequest(id="200-0000000001", state="pending", node_types=list(labels),
                       declined_by=list(declined_by))


def test_served_elsewhere_needs_another_pool_that_is_free_serves_all_and_did_not_decline(
        ) -> None:
    me = PoolInfo(ME, "near", frozenset({"small", "big", "odd"}))
    assert plan.served_elsewhere(request("small", "big"), ME, [me, OTHER])
    assert not plan.served_elsewhere(request("small"), ME, [me])  # only this pool
    assert not plan.served_elsewhere(request("small", "odd"), ME, [me, OTHER])
    assert not plan.served_elsewhere(request("small", declined_by=("other",)), ME,
                                     [me, OTHER])
    paused = PoolInfo("other", "far", OTHER.labels, paused=True)  # paused or unhealthy
    assert not plan.served_elsewhere(request("small"), ME, [me, paused])


def test_a_pool_level_min_ready_request_is_never_handed_back() -> None:
    spare = request("small")
    spare.requestor = MIN_READY_REQUESTOR
    spare.extra[MIN_READY_POOL] = "near/main"
    assert not plan.served_elsewhere(spare, ME, [OTHER])
    assert plan.hand_back(spare, ME, [OTHER], UNHEALTHY, 1000.0, 10.0) == (None, None)


def test_hand_back_waits_for_the_cause_to_last_then_declines() -> None:
    assert plan.hand_back(request("small"), ME, [OTHER], None, 100.0, 10.0) == (None, None)
    assert plan.hand_back(request("small"), ME, [OTHER], UNHEALTHY, 105.0, 10.0) \
        == (None, 110.0)
    decline, again = plan.hand_back(request("small"), ME, [OTHER], UNHEALTHY, 110.0, 10.0)
    assert again is None and decline is not None and decline.code == "HandedBack"
    assert "provider near cannot be used" in decline.message
    # hand-back-after 0: at once.
    assert plan.hand_back(request("small"), ME, [OTHER], UNHEALTHY, 100.0, 0.0)[0]


def test_nobody_else_can_serve_it_so_it_waits_here() -> None:
    assert plan.hand_back(request("small"), ME, [], UNHEALTHY, 1000.0, 10.0) == (None, None)
    assert plan.hand_back(request("odd"), ME, [OTHER], UNHEALTHY, 1000.0, 10.0) \
        == (None, None)


def test_recently_failed_labels_go_elsewhere_while_remembered() -> None:
    recent = plan.RecentlyFailed()
    recent.remember(["small"], now=100.0, ttl=60.0)
    refusal = recent.refusal(request("small"), ME, [OTHER], 120.0)
    assert refusal is not None and refusal.code == "RecentlyFailed"
    assert recent.refusal(request("big"), ME, [OTHER], 120.0) is None  # another label
    assert recent.refusal(request("small"), ME, [], 120.0) is None  # nobody else: served
    assert recent.active(120.0) == {"small": 160.0}
    assert recent.refusal(request("small"), ME, [OTHER], 160.0) is None  # forgotten
    assert recent.active(160.0) == {}
    recent.remember(["small"], now=200.0, ttl=0.0)  # 0: remembered not at all
    assert recent.active(200.0) == {}
