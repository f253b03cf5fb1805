"""The rule that combines the per-launcher pool status records into one status per pool.

Aspects (`views.pools.combine`): one row per (provider, pool) in order, the launchers inside
it named as the per-launcher Prometheus series name them (`host`, `host/2`); per condition
the worst status wins (False, Unknown, True; for Suspended and Drifted True is the worst),
a fault before a neutral state of the same status, `neutral` only when every launcher's
is, the message naming the launcher when they disagree; per-worker counts summed,
per-pool figures taken once, suspended labels and labels united, `drifted` the largest; a
single launcher's record passes unchanged but for `launchers`. `pool_status.combined`
(what a pool worker sends to statsd) replaces the mirrored copy of its own record with
the one it just published. The table rows list the launchers with their state.
"""

from __future__ import annotations

from typing import Any

from nodepool_k8s.launcher.reporting import pool_status
from nodepool_k8s.runtime import stats
from nodepool_k8s.views import pools


def cond(ctype: str, status: str, reason: str, message: str = "",
         neutral: bool = False) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message,
            "last_transition": 1.0, "neutral": neutral}


def record(pid: str, host: str, *conditions: dict[str, Any], pool: str = "main",
           **more: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": pid, "hostname": host, "provider": "k8s", "pool": pool, "priority": 100,
        "labels": ["small"], "nodes": {"ready": 2}, "launches_in_progress": 1,
        "requests_queued": 2, "requests_handled": 3, "usage": [], "targets": {},
        "suspended": {}, "capacity": {}, "drifted": 0, "paused": False,
        "conditions": list(conditions)}
    base.update(more)
    return base


def by_type(row: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in row["conditions"]}


def test_one_row_per_pool_worst_status_wins() -> None:
    rows = pools.combine([
        record("b-2", "hb", cond("AtTarget", "True", "TargetMet"),
               cond("Quota", "True", "Under", "pool instances 1/4"),
               cond("Suspended", "True", "LabelSuspended", "small: ErrImagePull"),
               cond("Drifted", "False", "NoneDrifted"),
               cond("ApiReachable", "False", "Unreachable"),
               nodes={"ready": 5}, labels=["big"], paused=True,
               suspended={"small": {"reason": "ErrImagePull"}}),
        record("a-1", "ha", cond("AtTarget", "Unknown", "Paused", "operator", neutral=True),
               cond("Quota", "True", "Under", "pool instances 1/4"),
               cond("Suspended", "False", "NoneSuspended"),
               cond("Drifted", "True", "SparesDrifted", "3 spare node(s)"),
               cond("ApiReachable", "True", "Reachable"), drifted=3),
        record("c-3", "hc", cond("AtTarget", "True", "TargetMet"), pool="other"),
    ])
    assert [(r["pool"], [e["id"] for e in r["launchers"]]) for r in rows] == [
        ("main", ["a-1", "b-2"]), ("other", ["c-3"])]
    main = rows[0]
    assert main["launchers"] == [
        {"name": "ha", "hostname": "ha", "id": "a-1", "paused": False, "ready": True},
        {"name": "hb", "hostname": "hb", "id": "b-2", "paused": True, "ready": False}]
    got = by_type(main)
    # Unknown beats True; a neutral state alone is not neutral once another launcher's
    # condition is not.
    assert (got["AtTarget"]["status"], got["AtTarget"]["reason"],
            got["AtTarget"]["neutral"]) == ("Unknown", "Paused", False)
    assert got["AtTarget"]["message"] == "ha: operator (other launchers: hb: True/TargetMet)"
    # Agreement: the condition as published, message untouched.
    assert got["Quota"]["message"] == "pool instances 1/4"
    # True is the problem for these two.
    assert got["Suspended"]["reason"] == "LabelSuspended"
    assert got["Drifted"]["reason"] == "SparesDrifted"
    assert got["ApiReachable"]["reason"] == "Unreachable"
    # Per-worker counts summed; pool figures once (the first launcher's); unions; max.
    assert (main["launches_in_progress"], main["requests_queued"],
            main["requests_handled"]) == (2, 4, 6)
    assert main["nodes"] == {"ready": 2} and main["id"] == "a-1"
    assert main["labels"] == ["big", "small"]
    assert main["suspended"] == {"small": {"reason": "ErrImagePull"}}
    assert main["drifted"] == 3
    assert main["paused"] is False
    # A pool with one launcher: its record as published.
    other = rows[1]
    assert {k: v for k, v in other.items() if k != "launchers"} == record(
        "c-3", "hc", cond("AtTarget", "True", "TargetMet"), pool="other")


def test_a_fault_wins_over_a_neutral_state_and_all_neutral_stays_neutral() -> None:
    paused = cond("AtTarget", "Unknown", "Paused", "window", neutral=True)
    draining = cond("AtTarget", "Unknown", "Draining", "operator", neutral=True)
    unknown = cond("AtTarget", "Unknown", "Unknown", "no answer")
    (row,) = pools.combine([record("a", "h", paused), record("b", "h", unknown)])
    assert by_type(row)["AtTarget"]["reason"] == "Unknown"
    assert not by_type(row)["AtTarget"]["neutral"]
    (row,) = pools.combine([record("a", "h", paused), record("b", "h", draining)])
    assert by_type(row)["AtTarget"]["neutral"] is True
    # Two workers on one host: named as the per-launcher series name them.
    assert [e["name"] for e in row["launchers"]] == ["h", "h/2"]
    assert "h/2: Unknown/Draining" in by_type(row)["AtTarget"]["message"]


def test_table_rows_list_launchers() -> None:
    rows = pools.pool_rows(pools.combine([
        record("a", "ha", cond("Drifted", "True", "SparesDrifted"), drifted=1),
        record("b", "hb", cond("Credentials", "False", "Rejected"), paused=True)]))
    assert len(rows) == 1
    assert rows[0]["launcher_names"] == "ha, hb (paused, not ready)"
    assert rows[0]["drifted_spares"] == 1


def test_a_worker_sends_the_pools_combined_gauges() -> None:
    own = record("a", "ha", cond("Quota", "True", "Under"), requests_queued=5)
    stale_own = record("a", "ha", cond("Quota", "True", "Under"), requests_queued=0)
    other = record("b", "hb", cond("Quota", "False", "AtLimit"), requests_queued=2)
    elsewhere = record("c", "hc", cond("Quota", "True", "Under"), pool="other")
    combined = pool_status.combined(own, [stale_own, other, elsewhere])  # type: ignore[arg-type]
    gauges = stats.pool_status_gauges(combined)
    assert gauges["nodepool.pool.k8s.main.requests_queued"] == 7.0
    assert gauges["nodepool.pool.k8s.main.condition.Quota"] == 0.0
