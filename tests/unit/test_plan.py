"""Pure launcher decisions: request ordering, triage (yield, decline, accept), the
"every registered pool declined" rule, node cleanup verdicts (ages, holds, orphans,
deallocation) and the min-ready shortfall."""

from __future__ import annotations

import math

import pytest

from nodepool_k8s.core import model
from nodepool_k8s.config.model import (Config, LabelConfig, PoolConfig, PoolLabel,
                                       ProviderConfig, ZkServer)
from nodepool_k8s.launcher import plan
from nodepool_k8s.launcher.plan import PoolInfo, Verdict
from nodepool_k8s.core.model import Node, NodeRequest

NOW = 1_700_000_000.0


def pool(labels: tuple[str, ...] = ("a", "b"), **kw: object) -> PoolConfig:
    return PoolConfig(name="main", provider="p",
                      labels={n: PoolLabel(name=n, type="namespace") for n in labels},
                      **kw)  # type: ignore[arg-type]


def provider(p: PoolConfig, name: str = "p", **kw: object) -> ProviderConfig:
    return ProviderConfig(name=name, driver="fake", pools={p.name: p}, **kw)  # type: ignore


def req(rid: str = "200-0000000001", types: tuple[str, ...] = ("a",), **kw: object) \
        -> NodeRequest:
    return NodeRequest(id=rid, node_types=list(types), **kw)  # type: ignore[arg-type]


ME = PoolInfo("me", "p", frozenset({"a", "b"}), 100)


def triage(r: NodeRequest, registered: list[PoolInfo], p: PoolConfig | None = None,
           me: PoolInfo = ME) -> plan.Decision:
    p = p or pool()
    return plan.triage(r, me, p, provider(p), [me] + registered)


def test_order_by_lacking_then_priority_then_relative_then_sequence() -> None:
    requests = [req("300-0000000001"), req("100-0000000009", relative_priority=5),
                req("100-0000000008", relative_priority=5), req("100-0000000003",
                                                                relative_priority=1),
                req("099-0000000010", types=("x",)), req("200-0000000002")]
    ordered = [r.id for r in plan.order(requests, {"a"})]
    assert ordered == ["100-0000000003", "100-0000000008", "100-0000000009",
                       "200-0000000002", "300-0000000001", "099-0000000010"]


def test_skip_states_and_own_declines() -> None:
    assert triage(req(state=model.RequestState.PENDING), []).verdict is Verdict.SKIP
    assert triage(req(declined_by=["me"]), []).verdict is Verdict.SKIP
    assert triage(req(), []).verdict is Verdict.ACCEPT


def test_yield_to_preferred_provider_only_if_it_is_a_candidate() -> None:
    other = PoolInfo("o", "q", frozenset({"a"}), 100)
    assert triage(req(provider="q"), [other]).verdict is Verdict.SKIP
    assert triage(req(provider="q", declined_by=["o"]), [other]).verdict is Verdict.ACCEPT
    assert triage(req(provider="zzz"), [other]).verdict is Verdict.ACCEPT
    assert triage(req(provider="p"), [other]).verdict is Verdict.ACCEPT


def test_yield_to_higher_priority_unless_paused() -> None:
    better = PoolInfo("o", "q", frozenset({"a"}), 50)
    assert triage(req(), [better]).verdict is Verdict.SKIP
    paused = PoolInfo("o", "q", frozenset({"a"}), 50, paused=True)
    assert triage(req(), [paused]).verdict is Verdict.ACCEPT
    worse = PoolInfo("o", "q", frozenset({"a"}), 200)
    assert triage(req(), [worse]).verdict is Verdict.ACCEPT
    lacks = PoolInfo("o", "q", frozenset({"b"}), 50)
    assert triage(req(), [lacks]).verdict is Verdict.ACCEPT


def test_decline_unknown_label_but_leave_it_to_pools_that_have_it() -> None:
    decision = triage(req(types=("a", "zzz")), [])
    assert decision.verdict is Verdict.DECLINE and "zzz" in decision.reason
    assert decision.decline == plan.Decline("LabelNotServed",
                                            "label(s) not served by this pool: zzz")
    has_it = PoolInfo("o", "q", frozenset({"a", "zzz"}), 100)
    assert triage(req(types=("a", "zzz")), [has_it]).verdict is Verdict.SKIP


def test_decline_disabled_and_impossible() -> None:
    assert triage(req(), [], pool(max_servers=0)).decline == plan.Decline(
        "PoolDisabled", "pool is disabled")
    decision = triage(req(types=("a", "a", "a")), [], pool(max_servers=2))
    assert decision.verdict is Verdict.DECLINE and decision.decline is not None
    assert decision.decline.code == "ExceedsQuota"
    assert decision.decline.message == (
        "it would exceed quota even with no nodes (pool limit exceeded for instances)")
    p = pool()
    prov = provider(p, max_servers=1)
    decision = plan.triage(req(types=("a", "b")), ME, p, prov, [ME])
    assert decision.verdict is Verdict.DECLINE


def test_all_declined() -> None:
    assert plan.all_declined(["a", "b"], {"a", "b"})
    assert plan.all_declined(["a", "b", "gone"], {"a", "b"})
    assert not plan.all_declined(["a"], {"a", "b"})


def test_a_decline_code_comes_from_the_reason_registry() -> None:
    with pytest.raises(ValueError):
        plan.Decline("pool is disabled", "pool is disabled")
    assert triage(req(), []).decline is None  # accepted
    assert triage(req(state=model.RequestState.PENDING), []).decline is None  # skipped


def test_record_decline_moves_the_request_and_its_time() -> None:
    r = req(nodes=["0000000001"])
    assert plan.record_decline(r, "me", {"me", "other"}, NOW) is model.RequestState.REQUESTED
    assert (r.state, r.state_time, r.nodes, r.declined_by) == (
        model.RequestState.REQUESTED, NOW, [], ["me"])
    assert plan.record_decline(r, "other", {"me", "other"}, NOW + 1) \
        is model.RequestState.FAILED
    assert r.state_time == NOW + 1


def config(**labels: LabelConfig) -> Config:
    return Config(zookeeper_servers=(ZkServer("h"),), labels=labels, max_hold_age=math.inf)


def node(state: str, since: float = NOW, **fields: object) -> Node:
    n = Node(id="0000000001", state=state, state_time=since, type=["a"])
    n.set(provider="p", **fields)
    return n


def verdict(n: Node, cfg: Config | None = None, locked: bool = False,
            exists: bool = True, now: float = NOW) -> plan.NodeVerdict:
    """The verdict at `now`: the node's age is `now - state_time` (no clock step)."""
    assert n.state_time is not None
    return plan.node_cleanup(n, age=now - n.state_time, locked=locked,
                             config=cfg or config(), request_exists=exists,
                             stale_init_age=60)


@pytest.mark.parametrize("state", sorted(plan.ORPHAN_STATES))
def test_unlocked_orphans_are_deleted_locked_never(state: str) -> None:
    assert verdict(node(state)).action is plan.CleanupAction.DELETE
    assert verdict(node(state), locked=True).action is plan.CleanupAction.NONE


def test_stale_init() -> None:
    v = verdict(node(model.NodeState.INIT, NOW - 30))
    assert v.action is plan.CleanupAction.NONE and v.recheck_in == 30
    assert verdict(node(model.NodeState.INIT, NOW - 60)).action is plan.CleanupAction.DELETE


def test_max_ready_age() -> None:
    cfg = config(a=LabelConfig("a", max_ready_age=100))
    v = verdict(node(model.NodeState.READY, NOW - 40), cfg)
    assert v.action is plan.CleanupAction.NONE and v.recheck_in == 60
    assert verdict(node(model.NodeState.READY, NOW - 100), cfg).action is plan.CleanupAction.DELETE
    allocated = node(model.NodeState.READY, NOW - 1000, allocated_to="200-0000000001")
    assert verdict(allocated, cfg).action is plan.CleanupAction.NONE
    assert verdict(node(model.NodeState.READY, NOW - 10**6)).action is plan.CleanupAction.NONE


def test_deallocate_when_request_gone() -> None:
    n = node(model.NodeState.READY, allocated_to="200-0000000001")
    assert verdict(n, exists=False).action is plan.CleanupAction.DEALLOCATE
    assert verdict(n, exists=True).action is plan.CleanupAction.NONE


def test_hold_limits() -> None:
    held = node(model.NodeState.HOLD, NOW - 50, hold_expiration=100)
    assert verdict(held).recheck_in == 50
    assert verdict(held, now=NOW + 50).action is plan.CleanupAction.DELETE
    cfg = Config(zookeeper_servers=(ZkServer("h"),), max_hold_age=30)
    assert verdict(held, cfg).action is plan.CleanupAction.DELETE
    forever = node(model.NodeState.HOLD, NOW - 10**6, hold_expiration=0)
    assert verdict(forever).action is plan.CleanupAction.NONE
    assert plan.hold_limit(node(model.NodeState.HOLD, hold_expiration=-5), 0) == math.inf
    assert plan.hold_limit(node(model.NodeState.HOLD, hold_expiration=None), 20) == 20


def test_min_ready_shortfall_counts_spares_once() -> None:
    spare = node(model.NodeState.READY)
    held_by_min_ready = node(model.NodeState.READY, allocated_to="900-0000000004")
    in_use = node(model.NodeState.READY, allocated_to="200-0000000005")
    outstanding = req("900-0000000006", requestor=model.MIN_READY_REQUESTOR)
    fulfilled = req("900-0000000004", requestor=model.MIN_READY_REQUESTOR,
                    state=model.RequestState.FULFILLED)
    zuul = req("200-0000000007")
    assert plan.min_ready_shortfall("a", 5, [spare, held_by_min_ready, in_use],
                                    [outstanding, fulfilled, zuul]) == 2
    assert plan.min_ready_shortfall("a", 1, [spare], []) == 0
    assert plan.min_ready_shortfall("b", 1, [spare], [outstanding]) == 1
    assert plan.min_ready_shortfall("a", 0, [], []) == 0


def test_min_ready_shortfall_counts_a_fulfilled_nodes_not_seen_yet() -> None:
    # Requests are read fresh, nodes from a cache that may be a moment behind: a request
    # seen fulfilled before its node must not make another launcher ask for that node again.
    fulfilled = req("900-0000000004", requestor=model.MIN_READY_REQUESTOR,
                    state=model.RequestState.FULFILLED, nodes=["0000000001"])
    assert plan.min_ready_shortfall("a", 3, [], [fulfilled]) == 2
    seen = node(model.NodeState.READY, allocated_to="900-0000000004")  # id 0000000001
    assert plan.min_ready_shortfall("a", 3, [seen], [fulfilled]) == 2
    other_pool = req("900-0000000005", requestor=model.MIN_READY_REQUESTOR,
                     state=model.RequestState.FULFILLED, nodes=["0000000009"], types=("b",))
    assert plan.min_ready_shortfall("a", 3, [], [other_pool]) == 3


def test_decline_for_is_worked_out_once_per_labels_and_configuration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass asks about every waiting request: the answer for the same labels and the
    same configuration objects is remembered; a reloaded configuration is judged anew."""
    calls: list[object] = []
    never_fits = plan.quota.never_fits

    def counting(*args: object, **kw: object) -> object:
        calls.append(args)
        return never_fits(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(plan.quota, "never_fits", counting)
    roomy = pool(max_servers=5)
    prov = provider(roomy)
    answers = {plan.decline_for(req(f"200-{i:010d}"), roomy, prov) for i in range(50)}
    assert answers == {None} and len(calls) == 1
    reloaded = pool(max_servers=0)  # disabled by a reload
    decline = plan.decline_for(req(), reloaded, provider(reloaded))
    assert decline is not None and decline.code == "PoolDisabled"
    big = PoolLabel(name="a", type="namespace", cpu=1)
    tiny = PoolConfig(name="main", provider="p", labels={"a": big}, max_cores=0.5)
    tiny_prov = provider(tiny)
    first = plan.decline_for(req(), tiny, tiny_prov)
    assert first is not None and first.code == "ExceedsQuota"
    assert plan.decline_for(req("200-0000000099"), tiny, tiny_prov) == first
    assert plan.decline_for(req(types=("b",)), tiny, tiny_prov) is not None  # not served


OURS, THEIRS, GONE = "a-PoolWorker.p-main-1", "b-PoolWorker.p-main-2", "c-PoolWorker.p-main-3"


@pytest.mark.parametrize("launcher, age, wait", [
    (OURS, 0.0, 0.0),      # we built it: at once
    (THEIRS, 0.0, 30.0),   # a live launcher built it: its grace
    (THEIRS, 25.0, 5.0),   # the grace counts in the node's state
    (THEIRS, 31.0, 0.0),   # past the grace: anyone's
    (GONE, 0.0, 0.0),      # its builder is not registered: at once
    (None, 0.0, 0.0),      # a record of no launcher: anyone's
    ("", 0.0, 0.0),
    (7, 0.0, 0.0),         # not a pool id
])
def test_builder_wait(launcher: object, age: float, wait: float) -> None:
    assert plan.builder_wait(launcher, ours=frozenset({OURS}),
                             live=frozenset({OURS, THEIRS}), age=age, grace=30.0) == wait
