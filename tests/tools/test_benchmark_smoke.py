"""The benchmark's smoke mode (`tools/benchmark --quick --json`).

Aspects: it runs every phase against the real stack (the bursts with --quick's small
sizes, 10 and 30; the web flood runs with 300 extra nodes), prints JSON with the documented
structure, every request is fulfilled,
the quota held with several launchers, and nothing is left behind. How fast anything was
is not checked here (see doc/benchmark.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tools.conftest import leftovers, processes_mentioning, run_module

pytestmark = pytest.mark.slow

RUN_KEYS = {"name", "profile", "label", "concurrency", "requests", "fulfilled", "nodes",
            "latency_ms", "nodes_per_s", "cleanup_ms", "api_calls_per_node", "api_calls",
            "zk_writes_per_node", "zk_reads_per_node", "launcher_cpu_ms_per_node",
            "launcher_peak_rss_mib"}
BURST_KEYS = {"size", "submit_span_ms", "created_span_ms", "duration_ms", "p50_over_p95",
              "fulfilled_first_half", "seen_lag_ms"}


def test_quick_json(tmp_path: Path) -> None:
    # --quick gives up after 120 s by itself; on a busy machine that is not a failure of
    # what this test checks (the phases and the JSON), so the limit is only a hang guard.
    done = run_module("nodepool_k8s.dev.testing.bench", "--quick", "--json", "--timeout", "900",
                      tmp=tmp_path, timeout=960)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(done.stdout)
    assert results["ok"] is True and results["problems"] == []
    assert {"machine", "parameters", "runs", "launchers", "scale", "targets",
            "duration_s"} <= set(results)
    assert results["machine"]["nproc"] >= 1 and results["machine"]["python"]
    names = {run["name"] for run in results["runs"]}
    assert {"zero/namespace/serial", "zero/namespace", "zero/pod/serial", "zero/pod",
            "realistic/namespace", "realistic/pod", "zero/namespace/at-scale"} <= names
    bursts = [run for run in results["runs"] if "burst" in run and not run.get("floor")]
    assert [run["name"] for run in bursts] == ["zero/namespace/burst-10",
                                               "zero/namespace/burst-30"]
    # The same bursts against the protocol floor, beside ours: no Kubernetes call.
    floors = [run for run in results["runs"] if run.get("floor")]
    assert [run["name"] for run in floors] == ["zero/namespace/burst-10/floor",
                                               "zero/namespace/burst-30/floor"]
    for run, floor in zip(bursts, floors):
        assert floor["api_calls_per_node"] == 0 and floor["fulfilled"] == floor["requests"]
        assert run["vs_floor"]["floor_p50_ms"] == floor["latency_ms"]["p50"]
        assert run["vs_floor"]["duration_ratio"] > 0
        assert run["burst"]["order"]["overtaken"]["max"] >= 0
    for run, size in zip(bursts + floors, (10, 30, 10, 30)):
        figures = run["burst"]
        assert BURST_KEYS <= set(figures), run["name"]
        assert figures["size"] == run["requests"] == run["concurrency"] == size
        assert run["fulfilled"] == run["nodes"] == size and run["label"] == "namespace"
        assert 0 < run["cleanup_ms"]["count"] <= size  # released nodes seen gone
        assert figures["seen_lag_ms"]["count"] == size
        assert figures["created_span_ms"] is not None  # every create was answered
        assert 0 <= figures["fulfilled_first_half"] <= 1 and figures["p50_over_p95"] > 0
    for run in results["runs"] + results["launchers"]:
        assert RUN_KEYS <= set(run), run["name"]
        assert run["requests"] > 0 and run["fulfilled"] == run["requests"], run
        assert run["nodes"] == run["fulfilled"]
        assert set(run["latency_ms"]) >= {"p50", "p95", "p99", "count"}
        assert run["latency_ms"]["count"] == run["fulfilled"]
        assert run["cleanup_ms"]["count"] > 0
        assert run.get("floor") or run["api_calls_per_node"] > 0
        assert run["zk_writes_per_node"] > 0
    assert [row["launchers"] for row in results["launchers"]] == [1, 2]
    assert all(row["quota_held"] for row in results["launchers"])
    scale = results["scale"]
    assert scale["nodes"] == 1000 and scale["list_rows"] >= 1000
    assert scale["fulfilled"] == scale["requests"] > 0
    assert scale["launcher_peak_rss_mib"] > 0
    # The web flood runs: Zuul's requests idle and while clients flood the status port.
    assert {"zero/namespace/web-idle", "zero/namespace/web-flood"} <= names
    web = results["webflood"]
    assert web["nodes"] == 300 and web["flood_requests"] > 0 and web["flood_errors"] == 0
    assert web["ready_max_ms"] is not None and web["launcher_rss_mib_after"] > 0
    assert all({"name", "target", "value", "met"} <= set(t) for t in results["targets"])
    # --quick has no burst of 200 and no side-by-side file: those targets say so.
    unmeasured = {t["name"]: t for t in results["targets"] if t["met"] is None}
    assert any("burst-200 p50 well below p95" in name for name in unmeasured)
    for size in (30, 200):
        row = next(t for name, t in unmeasured.items() if name.startswith(f"burst-{size} p50 <="))
        assert row["note"].startswith("not measured (run tools/compat/burst_side_by_side.py)")
    assert leftovers(tmp_path) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_soak_smoke(tmp_path: Path) -> None:
    """`--soak` runs rounds against one launcher and reports RSS and threads per round,
    the slope after the warm-up judged against the target, and with `--soak-tracemalloc`
    the launcher's own allocation reports, with `--soak-memstats` its collector's and
    heaps' (whether memory stays flat is recorded in doc/benchmark.md, not asserted
    here)."""
    done = run_module("nodepool_k8s.dev.testing.bench", "--soak", "3", "--soak-requests", "5",
                      "--soak-warmup", "5", "--soak-tracemalloc", "3",
                      "--soak-memstats", "3", "--soak-memstats-collect",
                      "--error-rate", "0.05", "--json", "--timeout", "900", tmp=tmp_path,
                      timeout=960)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(done.stdout)
    soak = results["soak"]
    assert [r["round"] for r in soak["rounds"]] == [1, 2, 3]
    for row in soak["rounds"]:
        assert row["requests"] == 5 and row["rss_mib"] > 0 and row["threads"] > 0
    assert soak["error_rate"] == 0.05
    assert [r["nodes"] for r in soak["rounds"]] == [5, 10, 15]
    assert soak["measured_nodes"] == 10 and soak["slope_kib_per_node"] is not None
    assert soak["lock_dir_max_age_s"] == 30.0
    assert results["targets"] == [soak["target"]] and soak["target"]["met"] in (True, False)
    assert "extrapolated from 10 measured nodes" in soak["target"]["note"]
    # Reports after the first and the last round, from the launcher itself (each report
    # walks every object the launcher holds: two are enough to show the comparison).
    reports = soak["tracemalloc"]
    assert [r["label"] for r in reports] == ["1", "3"]
    assert "MainThread" in reports[-1]["threads"] and reports[-1]["since_first"]
    memstats = soak["memstats"]
    assert [r["label"] for r in memstats] == ["1", "3"]
    last = memstats[-1]
    # pymalloc's figures are empty here: tracemalloc's hooks hide pymalloc from its report.
    assert isinstance(last["malloc"], dict) and last["libc"]["heap_kib"] > 0
    assert sum(last["gc_objects"]) > 0
    assert last["rss_kib"] > 0 and last["smaps"] and last["largest"]
    assert last["garbage"]["found"] >= 0 and last["threads"] > 0
    assert leftovers(tmp_path) == []
    assert processes_mentioning(str(tmp_path)) == []
