"""The benchmark's bookkeeping without the stack: burst spread figures, the targets table
(burst rows, the closed-loop and burst figures kept apart, thresholds), `--burst` parsing,
and reading the side-by-side tool's JSON (`--nodepool-burst`) tolerantly.

The inputs are made-up results; nothing here measures or asserts how fast anything is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.dev.testing import bench
from nodepool_k8s.dev.testing.bench import Sample

SIDE = "tools/compat/burst_side_by_side.py"


def plan_of(fulfil_offsets: list[float], submit_step: float = 0.0001) -> list[Sample]:
    plan = []
    for index, offset in enumerate(fulfil_offsets):
        sample = Sample(["namespace"], "200")
        sample.submitted = 1000.0 + index * submit_step
        sample.created = sample.submitted + 0.01
        sample.fulfilled = 1000.0 + offset
        sample.seen_lag = 0.002
        plan.append(sample)
    return plan


def test_burst_figures_steady_completions() -> None:
    figures = bench.burst_figures(plan_of([0.1 * (i + 1) for i in range(100)]))
    assert figures["size"] == 100
    assert figures["submit_span_ms"] == pytest.approx(9.9)
    assert figures["created_span_ms"] == pytest.approx(19.9)
    assert figures["duration_ms"] == pytest.approx(10000.0)
    assert figures["fulfilled_first_half"] == pytest.approx(0.5)
    assert figures["p50_over_p95"] == pytest.approx(0.53, abs=0.01)
    assert figures["seen_lag_ms"]["count"] == 100


def test_burst_figures_bunched_at_the_end() -> None:
    figures = bench.burst_figures(plan_of([9.0 + 0.01 * i for i in range(100)]))
    assert figures["fulfilled_first_half"] == 0.0
    assert figures["p50_over_p95"] > 0.9


def test_burst_figures_unfulfilled_requests_are_not_counted() -> None:
    plan = plan_of([1.0, 2.0, 4.0])
    plan[2].fulfilled = None
    plan[2].created = None
    figures = bench.burst_figures(plan)
    assert figures["duration_ms"] == pytest.approx(2000.0)
    assert figures["fulfilled_first_half"] == 0.5
    assert figures["created_span_ms"] is None  # one create was never answered


def run(name: str, nodes_per_s: float, cpu_ms: float, p50: float = 100.0, p95: float = 200.0,
        burst: bool = False) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name, "concurrency": 200 if burst else 8, "nodes_per_s": nodes_per_s,
        "launcher_cpu_ms_per_node": cpu_ms, "latency_ms": {"p50": p50, "p95": p95},
        "api_calls_per_node": 6.0, "zk_writes_per_node": 8.0}
    if burst:
        row["burst"] = {"p50_over_p95": round(p50 / p95, 3)}
    return row


def by_name(rows: list[dict[str, Any]], start: str) -> dict[str, Any]:
    found = [row for row in rows if row["name"].startswith(start)]
    assert len(found) == 1, (start, [row["name"] for row in rows])
    return found[0]


def test_targets_keep_closed_loop_and_burst_apart() -> None:
    results = {"runs": [run("zero/namespace", 120.0, 6.5),
                        run("zero/namespace/burst-200", 80.0, 7.5, p50=750.0, p95=1000.0,
                            burst=True)]}
    rows = bench.targets(results)
    closed = by_name(rows, "namespace nodes per second, one launcher, closed loop")
    burst = by_name(rows, "namespace nodes per second, one launcher, burst of 200")
    assert "zero/namespace," in closed["name"] and "zero/namespace/burst-200" in burst["name"]
    assert (closed["value"], closed["met"]) == (120.0, True)
    assert (burst["value"], burst["met"]) == (80.0, False)
    cpu_closed = by_name(rows, "launcher CPU ms per namespace node, closed loop")
    cpu_burst = by_name(rows, "launcher CPU ms per namespace node, burst of 200")
    assert (cpu_closed["met"], cpu_burst["met"]) == (True, False)
    spread = by_name(rows, "burst-200 p50 well below p95")
    assert spread["value"] == 0.75 and spread["met"] is True  # p50 <= 0.75 x p95
    assert by_name(rows, "Kubernetes API calls")["met"] is True


def test_burst_spread_target_missed_when_bunched() -> None:
    results = {"runs": [run("zero/namespace/burst-200", 80.0, 5.0, p50=760.0, p95=1000.0,
                            burst=True)]}
    assert by_name(bench.targets(results), "burst-200 p50 well below p95")["met"] is False


def test_targets_without_a_burst_of_200_say_not_measured() -> None:
    rows = bench.targets({"runs": [run("zero/namespace", 50.0, 9.0),
                                   run("zero/namespace/burst-30", 60.0, 9.0, burst=True)]})
    for start in ("namespace nodes per second, one launcher, burst of 200",
                  "burst-200 p50 well below p95",
                  "launcher CPU ms per namespace node, burst of 200"):
        row = by_name(rows, start)
        assert row["met"] is None and row["value"] is None
        assert row["note"].startswith("not measured")
    for start in ("burst-30 p50 <= 1/10 of Nodepool 11", "burst-200 p50 <= 1/6 of Nodepool 11"):
        row = by_name(rows, start)
        assert row["met"] is None and row["note"] == f"not measured (run {SIDE})"
    assert "n/a" in bench.table({"machine": machine(), "runs": [], "targets": rows})


def side_by_side(tmp_path: Path, data: Any) -> dict[str, Any]:
    path = tmp_path / "side.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return bench.read_nodepool_burst(str(path))


def test_nodepool_ratio_rows_use_the_files_own_figures(tmp_path: Path) -> None:
    side = side_by_side(tmp_path, {"bursts": {
        "30": {"nodepool": {"p50_ms": 600.0, "p95_ms": 900}, "ours": {"p50_ms": 50}},
        "200": {"nodepool": {"p50_ms": 1000}, "ours": {"p50_ms": 200.0}}}})
    rows = bench.targets({"runs": [], "nodepool_burst": side})
    r30 = by_name(rows, "burst-30 p50 <= 1/10 of Nodepool 11")
    r200 = by_name(rows, "burst-200 p50 <= 1/6 of Nodepool 11")
    assert (r30["value"], r30["met"]) == (pytest.approx(50 / 600, abs=0.001), True)
    assert (r200["value"], r200["met"]) == (0.2, False)  # 200 > 1000 / 6
    for row in (r30, r200):
        assert SIDE in row["note"] and "both measured in one run" in row["note"]


@pytest.mark.parametrize("data", [
    "not json",
    [1, 2],
    {},
    {"bursts": []},
    {"bursts": {"30": None, "200": "x"}},
    {"bursts": {"30": {"nodepool": {"p50_ms": 600}}}},  # our side missing
    {"bursts": {"30": {"nodepool": {}, "ours": {"p50_ms": 5}}}},
    {"bursts": {"30": {"nodepool": {"p50_ms": "600"}, "ours": {"p50_ms": 5}}}},
    {"bursts": {"30": {"nodepool": {"p50_ms": True}, "ours": {"p50_ms": 5}}}},
    {"bursts": {"30": {"nodepool": {"p50_ms": 0}, "ours": {"p50_ms": 5}}}},
    '{"bursts": {"30": {"nodepool": {"p50_ms": NaN}, "ours": {"p50_ms": 5}}}}',
    {"bursts": {"200": {"nodepool": {"p50_ms": 600}, "ours": {"p50_ms": -1}}}},
])
def test_incomplete_side_by_side_files_mean_not_measured(tmp_path: Path, data: Any) -> None:
    rows = bench.targets({"runs": [], "nodepool_burst": side_by_side(tmp_path, data)})
    for start in ("burst-30 p50 <= 1/10", "burst-200 p50 <= 1/6"):
        row = by_name(rows, start)
        assert row["met"] is None and row["value"] is None
        assert row["note"].startswith(f"not measured (run {SIDE}): ")


def test_a_missing_side_by_side_file_means_not_measured(tmp_path: Path) -> None:
    side = bench.read_nodepool_burst(str(tmp_path / "absent.json"))
    assert side["error"].startswith("unreadable")
    row = by_name(bench.targets({"runs": [], "nodepool_burst": side}), "burst-30 p50")
    assert row["met"] is None and "absent.json" in row["note"]


def test_burst_parameter() -> None:
    parse = bench.build_parser().parse_args
    assert bench.params_from(parse([])).burst == [30, 200]
    assert bench.params_from(parse(["--quick"])).burst == [10, 30]
    assert bench.params_from(parse(["--burst", "0"])).burst == []
    assert bench.params_from(parse(["--quick", "--burst", "5,50"])).burst == [5, 50]
    params = bench.params_from(parse(["--nodepool-burst", "side.json"]))
    assert params.nodepool_burst == "side.json"


def machine() -> dict[str, Any]:
    return {"nproc": 2, "memory_gib": 1.0, "python": "3.11", "date": "today",
            "loadavg_at_start": [0.0], "command": "tools/benchmark"}


def test_table_shows_the_burst_figures() -> None:
    row = run("zero/namespace/burst-30", 60.0, 9.0, burst=True)
    row.update(requests=30, fulfilled=30, nodes=30, load_threads=8,
               latency_ms={"p50": 1.0, "p95": 2.0, "p99": 2.0},
               cleanup_ms={"p50": 1.0, "p95": 2.0}, zk_reads_per_node=20.0,
               launcher_peak_rss_mib=80.0)
    row["burst"] = bench.burst_figures(plan_of([0.1 * (i + 1) for i in range(30)]))
    text = bench.table({"machine": machine(), "runs": [row], "targets": []})
    assert "zero/namespace/burst-30: 30 requests submitted within" in text
    assert "in the first half" in text


@pytest.mark.parametrize("listed, met", [(0.65, (True, True)), (0.85, (True, False)),
                                         (1.2, (False, False))])
def test_the_listing_has_the_old_target_and_issue_30s(listed: float,
                                                      met: tuple[bool, bool]) -> None:
    scale = {"nodes": 10000, "list_s_median": listed, "launcher_peak_rss_mib": 110.0}
    rows = bench.targets({"runs": [], "scale": scale})
    old = by_name(rows, "nodepool list over 10000 nodes (median wall time)")
    no_regression = by_name(rows, "nodepool list over 10000 nodes, no regression")
    assert (old["target"], no_regression["target"]) == ("< 1 s", "< 0.7 s")
    assert (old["met"], no_regression["met"]) == met
    assert old["value"] == no_regression["value"] == listed
