"""Status views, Prometheus text and the web app over a fixed, in-memory source.

Aspects: Nodepool's columns and JSON keys, token redaction, ages, `fields` selection,
content negotiation, caching headers, `/ready`, `/metrics`, 404 and a failing source.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodepool_k8s.views import prometheus, listing
from nodepool_k8s.web import app as webapp
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.core.records import MalformedRecord
from nodepool_k8s.web.app import WebApp

NOW = 1_700_000_000.0


def k8s_node(node_id: str = "0000000001", state: str = "ready") -> Node:
    node = Node(id=node_id, state=state, state_time=NOW - 93784, type=["pod-fedora"])
    node.set(provider="kube", pool="main", external_id="main-0000000001",
             connection_type="kubectl", allocated_to="200-0000000003",
             connection_port={"token": "s3cr3t-token", "namespace": "main-0000000001"})
    return node


def request(req_id: str = "200-0000000003", rel: int = 0) -> NodeRequest:
    return NodeRequest(id=req_id, state="fulfilled", node_types=["pod-fedora"],
                       nodes=["0000000001"], requestor="zuul", relative_priority=rel,
                       event_id="ev1")


class Source:
    def __init__(self) -> None:
        self.nodes = [listing.NodeView(k8s_node(), locked=True),
                      listing.NodeView(k8s_node("0000000002", "building"), locked=False)]
        self.reqs = [request(), request("100-0000000009", rel=2)]
        self.is_ready = True
        self.fail = False
        self.fail_with: Exception = RuntimeError("zookeeper went away")
        self.bad: list[MalformedRecord] = []
        self.reads = 0  # node_views calls: how often the web app read the source

    def node_views(self) -> list[listing.NodeView]:
        self.reads += 1
        if self.fail:
            raise self.fail_with
        return self.nodes

    def requests(self) -> list[NodeRequest]:
        return self.reqs

    def malformed(self) -> list[MalformedRecord]:
        return self.bad

    def supported_labels(self) -> list[list[str]]:
        return [["pod-fedora", "ns"], ["ns"]]

    def ready(self) -> bool:
        return self.is_ready

    def counters(self) -> dict[Any, float]:
        return {("nodepool_launch_total", (("result", "ready"),)): 3}


def test_age_format():
    assert listing.age(NOW - 93784, NOW) == "01:02:03:04"
    assert listing.age(None, NOW) == ""


def test_node_row_redacts_token_and_keeps_nodepool_keys():
    row = listing.node_row(listing.NodeView(k8s_node(), True), NOW)
    assert row["connection_port"] == "redacted"
    assert "s3cr3t" not in json.dumps(row)
    for key in ("id", "provider", "label", "server_id", "public_ipv4", "ipv6", "state", "age",
                "locked", "pool", "hostname", "private_ipv4", "AZ", "username",
                "connection_port", "launcher", "allocated_to", "hold_job", "comment",
                "user_data", "driver_data"):
        assert key in row
    assert row["label"] == ["pod-fedora"] and row["locked"] == "locked"


def test_render_table_and_field_selection():
    rows = listing.node_list(Source().nodes, NOW)
    text = listing.render_table(rows, listing.NODE_COLUMNS)
    lines = text.splitlines()
    assert lines[1].startswith("| ID ") and "Locked" in lines[1]
    assert "0000000001" in text and "pod-fedora" in text
    cols = listing.select_columns(listing.NODE_DETAIL_COLUMNS, ["id", "Allocated To"])
    assert [h for h, _ in cols] == ["ID", "Allocated To"]


def test_request_list_orders_by_priority():
    rows = listing.request_list(Source().reqs)
    assert [r["id"] for r in rows] == ["100-0000000009", "200-0000000003"]


def test_prometheus_text():
    src = Source()
    text = prometheus.render(src.nodes, src.reqs, True, src.counters())
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("nodepool_nodes", (("state", "ready"),))] == 1
    assert samples[("nodepool_provider_nodes",
                    (("provider", "kube"), ("state", "building")))] == 1
    assert samples[("nodepool_label_nodes", (("label", "pod-fedora"), ("state", "ready")))] == 1
    assert samples[("nodepool_requests", (("state", "fulfilled"),))] == 2
    assert samples[("nodepool_launcher_ready", ())] == 1
    assert samples[("nodepool_launch_total", (("result", "ready"),))] == 3
    assert "# TYPE nodepool_nodes gauge" in text
    # Process metrics of the launcher come with it (prometheus_client's collector).
    assert samples[("process_resident_memory_bytes", ())] > 0


@pytest.fixture
def web():
    src = Source()
    app = WebApp(src, port=0, listen_address="127.0.0.1", clock=ManualClock(NOW)).start()
    yield src, f"http://127.0.0.1:{app.port}", app
    app.stop()


def get(url: str, accept: str | None = None) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


def test_web_node_list_json_and_text(web):
    _, base, _ = web
    code, headers, body = get(base + "/node-list", "application/json")
    assert code == 200 and headers["Content-Type"] == "application/json"
    data = json.loads(body)
    assert [d["id"] for d in data] == ["0000000001", "0000000002"]
    assert data[0]["connection_port"] == "redacted"
    assert "Access-Control-Allow-Origin" not in headers  # only when configured
    assert headers["Cache-Control"] == "public, max-age=1"
    code, headers, body = get(base + "/node-list?node_id=0000000002")
    assert code == 200 and headers["Content-Type"] == "text/plain"
    ids = [line.split("|")[1].strip() for line in body.splitlines() if line.startswith("| 0")]
    assert ids == ["0000000002"]
    code, _, body = get(base + "/node-list?fields=id,allocated_to")
    assert "Allocated To" in body and "Provider" not in body
    # A node id without its leading zeros names the same node, as in `nodepool show 2`.
    for path in ("/node-list?node_id=2", "/node/2", "/node/0000000002"):
        code, _, body = get(base + path, "application/json")
        found = json.loads(body)
        assert code == 200, path
        assert (found[0] if isinstance(found, list) else found["node"])["id"] \
            == "0000000002", path


def test_web_request_and_label_list(web):
    _, base, _ = web
    code, _, body = get(base + "/request-list", "application/json")
    assert code == 200 and json.loads(body)[0]["id"] == "100-0000000009"
    code, _, body = get(base + "/label-list", "application/json")
    assert json.loads(body) == [{"label": "ns"}, {"label": "pod-fedora"}]


class Pool:
    """A registered pool component, as the waiting reasons read it."""

    def __init__(self, pool_id: str, labels: set[str], paused: bool = False) -> None:
        self.id, self.supported_labels, self.paused = pool_id, frozenset(labels), paused


def test_web_request_list_age_and_waiting():
    src = Source()
    src.reqs = [
        NodeRequest(id="200-0000000004", state="requested", node_types=["gpu"],
                    created_time=NOW - 3723, state_time=NOW - 5),
        NodeRequest(id="200-0000000005", state="requested", node_types=["ns"],
                    state_time=NOW - 61),
        NodeRequest(id="200-0000000006", state="requested", node_types=["pod-fedora"],
                    created_time=NOW, extra={"waiting_reasons": {"p1": {
                        "reason": "PoolDraining", "message": "pool kube/main is drained"}}}),
        request()]
    src.pool_components = lambda: [Pool("p1", {"pod-fedora", "ns"}),  # type: ignore
                                   Pool("p2", {"ns"}, paused=True)]
    app = WebApp(src, port=0, listen_address="127.0.0.1", clock=ManualClock(NOW)).start()
    try:
        base = f"http://127.0.0.1:{app.port}"
        code, _, body = get(base + "/request-list", "application/json")
        assert code == 200
        rows = {r["id"]: r for r in json.loads(body)}
        # The age counts from the submission (`created_time`), else the state time.
        assert rows["200-0000000004"]["age"] == "00:01:02:03"
        assert rows["200-0000000005"]["age"] == "00:00:01:01"
        assert rows["200-0000000004"]["waiting"] == {
            "*": "NoPoolServesLabel: no registered pool serves gpu"}
        assert rows["200-0000000005"]["waiting"] == {
            "p2": "PoolWaiting: the pool is paused; it takes no request until the one it"
                  " holds gets capacity"}
        assert rows["200-0000000006"]["waiting"] == {
            "p1": "PoolDraining: pool kube/main is drained"}
        assert rows["200-0000000003"]["waiting"] == {}  # fulfilled: nothing waits
        code, _, body = get(base + "/request-list?fields=id,age,waiting")
        assert code == 200
        assert body.splitlines()[1].split() == ["|", "Request", "ID", "|", "Age", "|",
                                                "Waiting", "|"]
        assert "NoPoolServesLabel" in body and "00:01:02:03" in body
    finally:
        app.stop()


def test_web_ready_metrics_404_and_failure(web):
    src, base, _ = web
    assert get(base + "/ready")[0] == 200
    src.is_ready = False
    assert get(base + "/ready")[0] == 503
    code, headers, body = get(base + "/metrics")
    assert code == 200 and "nodepool_launcher_ready 0" in body
    assert get(base + "/nope")[0] == 404
    assert get(base + "/node-list?node_id=x")[0] == 400
    src.fail = True
    clock = web[2].clock
    # A failed reading: the last snapshot is served, marked stale with its age ...
    clock.advance(webapp.CACHE_SECONDS + 0.1)
    code, headers, body = get(base + "/node-list?node_id=1", "application/json")
    assert code == 200 and json.loads(body)[0]["id"] == "0000000001"
    assert headers["X-Status-Stale"] == "Internal error"
    assert float(headers["X-Status-Age"]) >= webapp.CACHE_SECONDS
    assert headers["Cache-Control"] == "no-cache"
    # ... until it is too old: an unexpected error is 500 without its text (no internals
    # in error bodies) ...
    clock.advance(webapp.MAX_STALE)
    code, _, body = get(base + "/node-list?node_id=1", "application/json")
    assert code == 500 and "zookeeper went away" not in body
    # ... a temporary one (our own message) 503 with the reason.
    src.fail_with = TemporaryError("the launcher has not read the nodes yet")
    clock.advance(webapp.CACHE_SECONDS)
    code, _, body = get(base + "/node-list?node_id=2", "application/json")
    assert code == 503 and "has not read the nodes yet" in body
    code, _, body = get(base + "/metrics")
    assert code == 503 and "has not read the nodes yet" in body
