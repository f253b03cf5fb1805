"""Gauge values and their delivery, without a launcher; the election across a session loss.

Aspects: `global_gauges` zero-initialises every state overall, per registered provider and
per supported label, counts nodes by state, provider and label, and counts addressable
requests per pool (any state, labels a subset of the pool's); `config_gauges` caps the pools'
max-servers by the provider's and reports tenant limits; `Stats.gauges` skips infinite
values and batches through the statsd pipeline; the reporter reports a vanished key once
more as 0, and at most once a second (a burst of changes waits, then costs one report); the
in-process counters feed Prometheus; sd_notify messages; a stats leader whose session
expires loses the lead and contends again.
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any


from nodepool_k8s.core import model
from nodepool_k8s.runtime import sdnotify, stats
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.launcher.reporting import gauges
from nodepool_k8s.launcher.reporting.gauges import GaugeReporter, config_gauges, global_gauges
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.zk.cache import Component
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory
from tests.sessions import expire_session


@dataclass
class FakeNode:
    state: str
    provider: str | None
    type: tuple[str, ...]


def pool(provider: str, name: str, labels: list[str]) -> Component:
    return Component(kind="pool", znode="host0000000001", hostname="host", state="running",
                     data={"id": f"host-PoolWorker.{provider}-{name}-x", "name": name,
                           "provider_name": provider, "supported_labels": labels})


def request(*labels: str, state: str = "requested") -> NodeRequest:
    return NodeRequest(id="200-0000000001", state=state, node_types=list(labels))


def test_global_gauges() -> None:
    nodes = [FakeNode("ready", "kube", ("small",)), FakeNode("in-use", "kube", ("small",)),
             FakeNode("ready", "other", ("gpu",))]
    pools = [pool("kube", "main", ["small", "large"]), pool("kube", "main", ["small"]),
             pool("edge", "tiny", ["small"])]
    requests = [request("small"), request("small", "large", state="pending"),
                request("small", "gpu"), request("large", state="fulfilled")]
    values = global_gauges(nodes, requests, pools)
    for state in model.NODE_STATES:
        for key in (f"nodepool.nodes.{state}", f"nodepool.provider.kube.nodes.{state}",
                    f"nodepool.provider.edge.nodes.{state}",
                    f"nodepool.label.small.nodes.{state}", f"nodepool.label.large.nodes.{state}"):
            assert key in values
    assert values["nodepool.nodes.ready"] == 2 and values["nodepool.nodes.in-use"] == 1
    assert values["nodepool.nodes.deleted"] == 0
    assert values["nodepool.provider.kube.nodes.ready"] == 1
    assert values["nodepool.provider.other.nodes.ready"] == 1  # a node names it
    assert values["nodepool.label.gpu.nodes.ready"] == 1
    assert values["nodepool.label.large.nodes.ready"] == 0
    assert values["nodepool.provider.kube.pool.main.addressable_requests"] == 3
    assert values["nodepool.provider.edge.pool.tiny.addressable_requests"] == 1
    assert global_gauges([], [], [])["nodepool.nodes.building"] == 0
    # Requests the cache left to another launcher's first look (never read) count for
    # every pool: a first look is only taken where every pool serves the same labels.
    unread = global_gauges(nodes, requests, pools, unread=2)
    assert unread["nodepool.provider.kube.pool.main.addressable_requests"] == 5
    assert unread["nodepool.provider.edge.pool.tiny.addressable_requests"] == 3


CONFIG = """
zookeeper-servers:
  - host: localhost
labels:
  - name: small
providers:
  - name: capped
    driver: fake
    max-servers: 15
    pools:
      - name: a
        max-servers: 10
        labels: [{name: small}]
      - name: b
        max-servers: 10
        labels: [{name: small}]
      - name: disabled
        max-servers: 0
        labels: [{name: small}]
  - name: open
    driver: fake
    pools:
      - name: a
        labels: [{name: small}]
tenant-resource-limits:
  - tenant-name: "tenant:one"
    max-servers: 4
    nvidia.com/gpu: 2
"""


def test_config_gauges() -> None:
    values = config_gauges(load_config_text(CONFIG))
    assert values["nodepool.provider.capped.max_servers"] == 15
    assert math.isinf(values["nodepool.provider.open.max_servers"])
    assert values["nodepool.tenant_limits.tenant_one.instances"] == 4
    assert values["nodepool.tenant_limits.tenant_one.nvidia_com/gpu"] == 2


class PipelineBackend(stats.RecordingBackend):
    """Records like the statsd client's pipeline: nothing until `send`."""

    def __init__(self) -> None:
        super().__init__()
        self.sends = 0

    def pipeline(self) -> Any:
        outer = self

        class Pipe:
            def __init__(self) -> None:
                self.batch: list[tuple[str, float]] = []

            def gauge(self, key: str, value: float) -> None:
                self.batch.append((key, value))

            def send(self) -> None:
                outer.sends += 1
                for key, value in self.batch:
                    outer.gauge(key, value)
        return Pipe()


def test_stats_gauges_batched_and_finite() -> None:
    backend = PipelineBackend()
    facade = stats.Stats(backend)
    assert facade.gauges({"a": 1, "b": math.inf, "c": 0}) == 2
    assert backend.sends == 1 and sorted(backend.keys("gauge")) == ["a", "c"]
    assert stats.Stats().gauges({"a": 1}) == 0  # null client: nothing to do


def test_counters_for_prometheus() -> None:
    facade = stats.Stats()
    facade.launch("kube", "zuul", stats.RESULT_READY, 5)
    facade.launch("kube", None, stats.RESULT_READY, 5)
    facade.leaked_nodes("kube", 2)
    counters = facade.counters()
    assert counters[(stats.PROM_LAUNCHES, (("provider", "kube"), ("result", "ready")))] == 2
    assert counters[(stats.PROM_LEAKED, (("provider", "kube"),))] == 2


class Cache:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def nodes(self) -> list[Any]:
        return self.items

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool:
        return True

    def requests(self) -> list[Any]:
        return self.items

    def pools(self) -> list[Any]:
        return self.items


def test_reporter_zeroes_vanished_keys() -> None:
    backend = stats.RecordingBackend()
    pools = Cache([pool("gone", "main", ["x"])])
    reporter = GaugeReporter(
        None, stats.Stats(backend), Cache([]), Cache([]), pools,  # type: ignore[arg-type]
        identifier="test-1")
    reporter.report()
    assert "nodepool.provider.gone.nodes.ready" in backend.keys("gauge")
    pools.items = []
    backend.sent.clear()
    reporter.report()
    sent = {k: v for (_, k, v) in backend.sent}
    assert sent["nodepool.provider.gone.nodes.ready"] == 0
    assert sent["nodepool.provider.gone.pool.main.addressable_requests"] == 0
    backend.sent.clear()
    reporter.report()
    assert "nodepool.provider.gone.nodes.ready" not in backend.keys("gauge")


def test_reporter_rate_limits_a_burst_of_changes() -> None:
    """The leader's look after a change, stepped on the monotonic time it is given."""
    zk: Any = SimpleNamespace(connected=True)
    reporter = GaugeReporter(zk, stats.Stats(stats.RecordingBackend()), Cache([]), Cache([]),
                             Cache([]), identifier="test-1")
    assert reporter.min_interval == gauges.MIN_INTERVAL == 1.0  # Nodepool's: once a second
    reporter.changed()
    assert reporter.report_if_due(1000.0) == 0.0 and reporter.reports == 1  # at once
    for _ in range(5):
        reporter.changed()
    # A burst right after a report waits for the rest of the interval (all of it: the
    # clock has not moved), however often it looks again meanwhile.
    assert [reporter.report_if_due(1000.0) for _ in range(3)] == [1.0] * 3
    assert reporter.reports == 1
    assert reporter.report_if_due(1000.5) == 0.5 and reporter.reports == 1
    # Then the five changes cost one report, and nothing is left to report.
    assert reporter.report_if_due(1001.0) == 0.0 and reporter.reports == 2
    assert not reporter._changed.is_set()


def test_sdnotify_messages() -> None:
    directory = tempfile.mkdtemp(prefix="np-sd-")  # AF_UNIX paths must be short
    try:
        path = f"{directory}/notify"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(5)
            assert sdnotify.notify("READY=1\nSTATUS=ok", {"NOTIFY_SOCKET": path})
            assert sock.recv(1024) == b"READY=1\nSTATUS=ok"
        # An abstract socket name (systemd may use one) is addressed with a leading "@".
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            name = f"np-sd-{os.getpid()}"
            sock.bind("\0" + name)
            sock.settimeout(5)
            assert sdnotify.notify("STOPPING=1", {"NOTIFY_SOCKET": "@" + name})
            assert sock.recv(1024) == b"STOPPING=1"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert not sdnotify.notify("READY=1", {})  # not under systemd: a no-op


def test_leader_loses_the_lead_with_its_session(zk: ZkConnection,
                                                launchers: LauncherFactory) -> None:
    first = launchers(hostname="alpha")
    wait_for(lambda: first.gauges.leading, 10, message="first leads")
    second = launchers(hostname="beta")
    expire_session(zk, first.zk)
    # The expired session's contender vanished: the other launcher leads now, and the
    # first one noticed (Term.held) instead of believing it still leads.
    wait_for(lambda: second.gauges.leading, 15, message="second takes over")
    wait_for(lambda: not first.gauges.leading, 15, message="first steps down")
    assert first.gauges.reports >= 1
