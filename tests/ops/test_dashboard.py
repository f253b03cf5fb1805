"""etc/grafana/nodepool-k8s-dashboard.json queries only what a launcher's `/metrics` exports.

Aspects: the file is a Grafana dashboard (panels with Prometheus targets, a data-source
variable); every `expr` and every variable query names at least one metric, each of them a
sample name of a real `/metrics` render, and uses only labels those samples carry (plus
the target labels Prometheus adds and `le`).

The render comes from a launcher running in process (fake driver, real ZooKeeper): nodes and
requests in several states, a ready and a failed launch, its registered pool. Counters that
only exist after rare events (a leak, a stuck or refused deletion, a spare removed, a
malformed record, a thread crash) or with another driver (Kubernetes API requests) are
recorded through the `Stats` methods the launcher's code calls for them, on the running
launcher's own `Stats`, so their names and labels come from the code.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodepool_k8s.config.loader import load_config
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.service import LauncherService
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS
from tests.ops.conftest import BASE, config_text

DASHBOARD = Path(__file__).resolve().parents[2] / "etc" / "grafana" / \
    "nodepool-k8s-dashboard.json"

CONFIG = (BASE + """          - name: broken
            type: pod
            fail: true
""").replace("  - name: slow\nproviders:", "  - name: slow\n  - name: broken\nproviders:") + """
webapp:
  port: 0
  listen_address: 127.0.0.1
"""

# Labels Prometheus attaches to every scraped series, and the histogram bucket bound.
TARGET_LABELS = {"job", "instance", "le"}
# PromQL words that look like metric names.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "bool", "offset"}
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")

Exported = dict[str, set[str]]  # sample name -> its label names


def parse_expr(expr: str) -> tuple[set[str], set[str]]:
    """The metric names and the label names a PromQL expression uses."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # string literals
    text = re.sub(r"\$\{?[A-Za-z_]\w*\}?", "", text)       # Grafana variables
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", text):
        labels.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)                # range selectors
    for _, names in _CLAUSE.findall(text):
        labels.update(n.strip() for n in names.split(",") if n.strip())
    text = _CLAUSE.sub(" ", text)
    metrics = set()
    for match in _IDENT.finditer(text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function
        if match.group(0) not in KEYWORDS:
            metrics.add(match.group(0))
    return metrics, labels


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, set[str], set[str]]]:
    """(where, query, metrics, labels) for every panel target and variable query."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels") or [])
            for target in panel.get("targets") or []:
                where = f"panel {panel.get('title')!r} target {target.get('refId')}"
                out.append((where, target["expr"], *parse_expr(target["expr"])))
    walk(dashboard["panels"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        match = re.fullmatch(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", query)
        assert match, f"variable {variable['name']}: unexpected query {query!r}"
        out.append((f"variable {variable['name']!r}", query, {match.group(1)},
                    {match.group(2)}))
    return out


def test_parse_expr() -> None:
    assert parse_expr('histogram_quantile(0.95, sum by (le, phase) (rate(x_bucket'
                      '{provider=~"$provider", phase!="total"}[$__rate_interval])))') == (
        {"x_bucket"}, {"le", "phase", "provider"})
    assert parse_expr('sum(a{s="by (x)"}) / on (p) group_left b or vector(0)') == (
        {"a", "b"}, {"s", "p"})


@pytest.fixture
def metrics(tmp_path: Path, zk: ZkConnection, zuul: ZuulClient) -> Iterator[Exported]:
    """The sample names and labels of a busy launcher's `/metrics`."""
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk, CONFIG))
    # Pool records with changed counts are republished at most once per interval.
    settings = dataclasses.replace(TEST_SETTINGS, pool_status_interval=0.5)
    service = LauncherService(str(path), None, load_config(str(path)), settings=settings,
                              poll_interval=0.1)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(service.run()))
    thread.start()
    try:
        webapp = wait_for(lambda: service.webapp, 10, message="web app started")
        base = f"http://127.0.0.1:{webapp.port}"

        def scrape() -> str:
            try:
                with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
                    return response.read().decode() if response.status == 200 else ""
            except OSError:
                return ""

        wait_for(lambda: "nodepool_launcher_ready 1.0" in scrape(), 30, message="ready")
        ready = zuul.submit(["small"])
        assert (zuul.wait(ready) or {}).get("state") == "fulfilled"
        zuul.use(zuul.accept(ready))
        spare = zuul.submit(["small"])
        assert (zuul.wait(spare) or {}).get("state") == "fulfilled"
        broken = zuul.submit(["broken"])
        assert (zuul.wait(broken) or {}).get("state") == "failed"
        zuul.submit(["slow"])  # stays pending: a launch in progress
        service.stats.leaked_nodes("fake")
        service.stats.delete_stuck("fake")
        service.stats.delete_refused("fake")
        service.stats.spare_removed("fake", "main", "surplus")
        service.stats.malformed("node")
        service.stats.thread_crashed("example")
        service.stats.api_call("fake", "get", "namespaces", "200")  # Kubernetes providers only

        def exported() -> Exported | None:
            out: Exported = {}
            for family in text_string_to_metric_families(scrape()):
                for sample in family.samples:
                    out.setdefault(sample.name, set()).update(sample.labels)
            # Everything the launcher reports once it has served: launches, failures,
            # phase durations, its pool's status and a gauge report.
            wanted = ("nodepool_launch_errors_total", "nodepool_node_phase_seconds_bucket",
                      "nodepool_pool_condition", "nodepool_pool_nodes",
                      "nodepool_stats_gauge_reports_total", "nodepool_thread_crashes_total",
                      "nodepool_request_wait_seconds_bucket",
                      "nodepool_kubernetes_api_requests_total",
                      "nodepool_zk_connection_state", "nodepool_zk_session_losses_total")
            return out if all(name in out for name in wanted) else None

        yield wait_for(exported, 30, message="every metric family rendered")
    finally:
        service.request_stop()
        thread.join(60)
        assert not thread.is_alive()


def test_every_query_names_exported_metrics_and_labels(metrics: Exported) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] == "nodepool-k8s"
    assert [v["type"] for v in dashboard["templating"]["list"]][0] == "datasource"
    found = queries(dashboard)
    assert len(found) >= 20
    problems = []
    for where, query, names, labels in found:
        if not names:
            problems.append(f"{where}: names no metric: {query}")
        unknown = names - metrics.keys()
        if unknown:
            problems.append(f"{where}: not exported: {sorted(unknown)}")
        known = set().union(*(metrics.get(n, set()) for n in names)) | TARGET_LABELS
        if labels - known:
            problems.append(f"{where}: labels {sorted(labels - known)} not on {sorted(names)}")
    assert not problems, "\n".join(problems)
    # The dashboard covers every launcher family (process_* and histogram parts aside).
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metrics
                if n.startswith("nodepool_")}
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for _, _, names, _ in found for n in names}
    assert families - used == set()
