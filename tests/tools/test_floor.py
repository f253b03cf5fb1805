"""The protocol floor (`nodepool_k8s.dev.testing.floor`), the benchmark's lower bound.

Aspects: a Zuul-like client's builds are served by it as by a launcher (the request
`fulfilled` with one ready node per type, allocated to it; the node gone after Zuul's
release); it makes no Kubernetes call; the arrival-order figures of the benchmark count
who was overtaken by later requests.
"""

from __future__ import annotations

from pathlib import Path

from nodepool_k8s.dev.testing.bench import BENCH_CONFIG, order_figures
from nodepool_k8s.dev.testing.loadtools import NodeWatcher
from nodepool_k8s.dev.testing.stack import Stack


def test_the_floor_serves_builds_without_kubernetes(tmp_path: Path) -> None:
    stack = Stack(workdir=str(tmp_path / "stack"))
    (tmp_path / "stack").mkdir()
    try:
        stack.start_zookeeper()
        sim = stack.start_simulator()
        chroot = stack.new_chroot("floor")
        env = {"NODEPOOL_BENCH_MAX_SERVERS": "10", "NODEPOOL_BENCH_MAX_CONCURRENCY": "10"}
        stack.start_floor(chroot, BENCH_CONFIG, env)
        assert len(stack.wait_launchers(chroot, 1, timeout=30)) == 1
        calls = sim.counters().get("total", 0)
        zuul = stack.zuul(chroot)
        watcher = NodeWatcher(zuul.client)
        request_id = zuul.submit(["namespace", "pod"])
        request = zuul.wait(request_id, timeout=30)
        assert request["state"] == "fulfilled"
        assert len(request["nodes"]) == 2
        nodes = [zuul.get_node(n) for n in request["nodes"]]
        assert [n["type"] for n in nodes if n] == [["namespace"], ["pod"]]
        assert all(n and n["state"] == "ready" and n["allocated_to"] == request_id
                   for n in nodes)
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)
        assert watcher.wait_gone(request["nodes"], 30)
        assert sim.counters().get("total", 0) == calls
        watcher.stop()
    finally:
        problems = stack.stop()
    assert problems == []


def test_order_figures_count_overtaking() -> None:
    # Arrival is the id's sequence: 0001 waits until three later requests are served.
    done = [("200-0000000001", 4.0), ("200-0000000002", 1.0), ("200-0000000003", 2.0),
            ("200-0000000004", 3.0), ("200-0000000005", 5.0)]
    figures = order_figures(done)
    assert figures["overtaken"]["max"] == 3.0
    assert figures["shift"]["max"] == 3.0
    assert figures["shift_spread"] == 4
    assert order_figures([("100-0000000001", 1.0)])["overtaken"]["max"] == 0.0
