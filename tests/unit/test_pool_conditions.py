"""A pool's conditions use the node's Condition type and its one update rule: the
transition time is kept while status and reason stay, and moves when either changes;
the published record keeps its format (`last_transition`, whole messages, fixed order)."""

from __future__ import annotations

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.launcher.reporting import pool_status
from nodepool_k8s.runtime.clock import ManualClock


def fresh(**changes: cond.Condition) -> dict[str, cond.Condition]:
    base = {
        "Validated": cond.Condition("", cond.TRUE, "Valid", "2 label(s)"),
        "AtTarget": cond.Condition("", cond.TRUE, "TargetMet", "no min-ready target"),
        "Quota": cond.Condition("", cond.TRUE, "Under", "no limits set"),
        "Capacity": cond.Condition("", cond.UNKNOWN, "Unknown", "capacity awareness is off"),
        "Suspended": cond.Condition("", cond.FALSE, "NoneSuspended"),
        "Credentials": cond.Condition("", cond.UNKNOWN, "Unknown", "not reported"),
        "ApiReachable": cond.Condition("", cond.TRUE, "Reachable", "the API server answers"),
        "Drifted": cond.Condition("", cond.FALSE, "NoneDrifted"),
    }
    base.update(changes)
    return base


def by_type(published: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {c["type"]: c for c in published}


def test_pool_conditions_follow_the_one_update_rule() -> None:
    clock = ManualClock(1000.0)
    builder = pool_status.StatusBuilder(interval=10.0)
    first = builder.conditions(fresh(), clock.time())
    assert [c["type"] for c in first] == list(pool_status.CONDITIONS)
    assert set(first[0]) == {"type", "status", "reason", "message", "last_transition",
                             "neutral"}
    assert {c["last_transition"] for c in first} == {1000.0}

    clock.advance(30)  # a new message only: no transition
    second = by_type(builder.conditions(fresh(
        Quota=cond.Condition("", cond.TRUE, "Under", "pool cores 1/8")), clock.time()))
    assert second["Quota"]["last_transition"] == 1000.0
    assert second["Quota"]["message"] == "pool cores 1/8"

    clock.advance(30)  # same status, another reason: a transition
    third = by_type(builder.conditions(fresh(
        AtTarget=cond.Condition("", cond.TRUE, "OverTarget", "x 3/2")), clock.time()))
    assert third["AtTarget"]["last_transition"] == 1060.0
    assert third["Validated"]["last_transition"] == 1000.0

    clock.advance(30)  # another status
    fourth = by_type(builder.conditions(fresh(
        AtTarget=cond.Condition("", cond.FALSE, "UnderTarget", "x 0/2")), clock.time()))
    assert fourth["AtTarget"]["last_transition"] == 1090.0


def test_pool_messages_are_published_whole() -> None:
    builder = pool_status.StatusBuilder(interval=10.0)
    message = "; ".join(f"label-{i}: ErrImagePull after 5 failures, probing" for i in range(40))
    published = by_type(builder.conditions(fresh(
        Suspended=cond.Condition("", cond.TRUE, "LabelSuspended", message)), 5.0))
    assert published["Suspended"]["message"] == message and len(message) > cond.MESSAGE_LIMIT


def test_validated_is_worked_out_once_per_configuration() -> None:
    """`Validated` is asked at every pass: remembered per configuration object and cloud
    limits, and a reload (new objects) or other cloud limits are judged afresh."""
    from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
    from nodepool_k8s.core.model import Resources

    def configs(cpu: float) -> tuple[PoolConfig, ProviderConfig]:
        pool = PoolConfig(name="main", provider="p", max_cores=4,
                          labels={"big": PoolLabel(name="big", type="pod", cpu=cpu)})
        return pool, ProviderConfig(name="p", driver="fake", pools={"main": pool})

    pool, provider = configs(2)
    first = pool_status.validated(pool, provider, Resources.limits())
    assert (first.status, first.reason) == (cond.TRUE, "Valid")
    assert pool_status.validated(pool, provider, Resources.limits()) is first
    tight = pool_status.validated(pool, provider, Resources.limits({"cores": 1}))
    assert (tight.status, tight.reason) == (cond.FALSE, "LabelExceedsLimits")
    pool, provider = configs(8)  # a reload: the label no longer fits the pool's limit
    reloaded = pool_status.validated(pool, provider, Resources.limits())
    assert (reloaded.status, reloaded.reason) == (cond.FALSE, "LabelExceedsLimits")
