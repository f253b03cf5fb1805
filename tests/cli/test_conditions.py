"""Lifecycle conditions, failure reasons, timings and the event log, through the engine
(fake driver: it sets the same conditions as the Kubernetes driver), the CLI and the web app.

Aspects: a ready node carries Launched, Registered, Initialized and Ready, all True, in
order, with ordered times, and the phase timers go to statsd and Prometheus; `nodepool
show` prints the conditions table and the timings (`--json` the same document as
`/node/<id>`); a failed launch keeps its reason on the node (kept visible here by a
deletion that cannot be confirmed), the request gets `declined_reasons`, the reason counter
is bumped, and `nodepool events` / `/events` show the failure, filtered; `list --detail`
and `request-list --detail` show Host ID, Reason and Declined Reasons; the keys Zuul reads
are unchanged (extra keys only). The ready node's life runs the launcher's pool worker
and cleanup worker one pass at a time in the test's thread (tests/launcher/upkeep/), so
what they report is there when they return.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.views import prometheus
from nodepool_k8s.driver.base import LaunchSpec
from nodepool_k8s.core.errors import LaunchError, TemporaryError
from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.web.app import WebApp
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import Cli, fake_provider
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection, wait_for
from tests.launcher.upkeep.support import make_upkeep
from tests.launchers import LauncherFactory

BODY = """
labels:
  - name: small
  - name: large
  - name: nowhere
providers:
  - name: fake
    driver: fake
    launch-retries: 2
    pools:
      - name: main
        max-servers: 20
        labels:
          - name: small
            type: namespace
          - name: large
            type: pod
            cpu: 2
            memory: 1024
"""


def test_ready_node_conditions_show_and_timers(zk: ZkConnection, zkc: ZkClient,
                                               zuul: ZuulClient, cli: Cli) -> None:
    # The launcher's pool worker and cleanup worker, one pass at a time in this thread.
    world = make_upkeep(zk, zkc, BODY)
    engine = world.deps
    worker, launches = world.pool_worker()
    request_id = zuul.submit(["large"])
    worker.run_once()
    launches.run_all()
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] == "fulfilled"
    node_id = body["nodes"][0]
    node = zuul.get_node(node_id)
    assert node is not None
    conditions = node["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [
        ("Launched", "True"), ("Registered", "True"), ("Initialized", "True"),
        ("Ready", "True")]
    times = [c["last_transition_time"] for c in conditions]
    assert times == sorted(times)
    assert node["host_id"] == "fake-k8s-node"
    # Timers per provider/pool/label, and the Prometheus histogram.
    backend = engine.stats.backend
    timings = backend.keys("timing")  # type: ignore[attr-defined]
    for phase in ("launch", "register", "initialize", "ready"):
        assert f"nodepool.launch.provider.fake.phase.{phase}" in timings
        assert f"nodepool.launch.provider.fake.pool.main.phase.{phase}" in timings
        assert f"nodepool.launch.label.large.phase.{phase}" in timings
    # The whole launch is a timer of its own, so the phases add up to it.
    assert not [k for k in timings if k.endswith(".phase.total")]
    for key in ("nodepool.launch.provider.fake.ready_time",
                "nodepool.launch.provider.fake.pool.main.ready_time",
                "nodepool.launch.label.large.ready_time"):
        assert key in timings
    text = prometheus.render([], [], True, {}, process=False,
                             histograms=engine.stats.histograms())
    assert 'phase="total"' not in text
    assert 'nodepool_node_phase_seconds_count{label="large",phase="ready",pool="main",' \
           'provider="fake"} 1.0' in text
    assert 'nodepool_node_launch_seconds_count{label="large",pool="main",' \
           'provider="fake"} 1.0' in text

    shown = cli("show", node_id)
    assert shown.code == 0, shown.err
    assert "Host ID" in shown.out and "fake-k8s-node" in shown.out
    for name in ("Launched", "Registered", "Initialized", "Ready", "PodRunning",
                 "HandedToZuul", "Timings:", "total"):
        assert name in shown.out, shown.out
    detail = cli("show", node_id, "--json").json()
    types = [c["type"] for c in detail["conditions"]]
    # The stored launch conditions, then the one derived from the configuration read.
    assert types == ["Launched", "Registered", "Initialized", "Ready", "Drifted"]
    assert (detail["conditions"][-1]["status"], detail["conditions"][-1]["reason"]) == (
        "False", "ConfigurationCurrent")
    assert set(detail["timings"]) == {"launch", "register", "initialize", "ready", "total"}
    assert detail["failure"] is None and detail["node"]["connection_port"] == "redacted"
    listed = cli("list", "--detail", "--json").json()
    assert [r["host_id"] for r in listed if r["id"] == node_id] == ["fake-k8s-node"]
    table = cli("list", "--detail")
    assert "Host ID" in table.out and "Reason" in table.out

    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    world.full_pass()
    assert zuul.get_node(node_id) is None  # the used node deleted
    # Launch and deletion are in the event log (batched: flushed here).
    engine.events.flush()
    kinds = [e["kind"] for e in zk_events.read_events(engine.zk) if e.get("node") == node_id]
    assert kinds == [zk_events.LAUNCHED, zk_events.DELETED]
    events = cli("events", "--node", node_id.lstrip("0") or "0", "--json").json()
    assert [e["kind"] for e in events] == kinds
    assert "deletion" in json.dumps(backend.keys("timing"))  # type: ignore[attr-defined]


def test_failed_launch_keeps_its_reason(launchers: LauncherFactory, zuul: ZuulClient,
                                        cli: Cli, kazoo_client: KazooClient) -> None:
    launcher = launchers(BODY)
    fake = fake_provider(launcher)

    def pull_fails(spec: LaunchSpec) -> None:  # after the resource exists (Launched)
        raise LaunchError("the registry said no", reason="ErrImagePull")

    fake.on_launch = pull_fails
    # Keep the failed node's record: its deletion cannot be confirmed for now.
    fake.fail_next(1000, TemporaryError("cloud unreachable"), op="delete")
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "failed"
    pool_id = body["declined_by"][0]
    assert body["declined_reasons"] == {
        pool_id: {"reason": "ErrImagePull",
                  "message": "a node launch failed"}}

    def kept() -> list[tuple[str, dict[str, Any]]]:
        found = [(i, zuul.get_node(i)) for i in kazoo_client.get_children(paths.NODES)]
        return [(i, n) for i, n in found if n and n.get("delete_failures")]

    [(node_id, node)] = wait_for(kept, message="the failed node, kept by its failed deletion")
    by_type = {c["type"]: c for c in node["conditions"]}
    assert by_type["Launched"]["status"] == "True"
    assert by_type["Registered"]["status"] == "False"  # the first phase not completed
    assert by_type["Registered"]["reason"] == "ErrImagePull"
    assert "the registry said no" in by_type["Registered"]["message"]
    assert by_type["Initialized"]["status"] == "Unknown"
    assert by_type["Deleting"]["reason"] == "DeleteFailed"
    increments = launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined]
    # The reason in its own branch; Nodepool's error.* keys count the failure once.
    assert "nodepool.launch.provider.fake.reason.ErrImagePull" in increments
    assert len([k for k in increments
                if k.startswith("nodepool.launch.provider.fake.error.")]) == 1

    shown = cli("show", node_id)
    assert "What to do:" in shown.out and "ErrImagePull" in shown.out
    row = [r for r in cli("list", "--json").json() if r["id"] == node_id]
    assert row[0]["reason"] == "DeleteFailed"  # the latest False condition
    requests = cli("request-list", "--detail")
    assert "Declined Reasons" in requests.out and "ErrImagePull" in requests.out

    events = cli("events", "--provider", "fake", "--json").json()
    kinds = [(e["kind"], e.get("reason")) for e in events]
    assert (zk_events.ATTEMPT_FAILED, "ErrImagePull") in kinds
    assert (zk_events.LAUNCH_FAILED, "ErrImagePull") in kinds
    assert cli("events", "--provider", "other", "--json").json() == []
    assert cli("events", "--since", "1h").code == 0
    with pytest.raises(SystemExit) as usage:
        cli("events", "--since", "soon")
    assert usage.value.code == 2  # argparse's usage error

    web = WebApp(LauncherStatus(launcher, launcher.engine.stats), port=0).start()
    try:
        base = f"http://127.0.0.1:{web.port}"
        req = urllib.request.Request(f"{base}/node/{node_id}",
                                     headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as answer:
            detail = json.loads(answer.read())
        assert detail["failure"]["reason"] == "DeleteFailed"
        assert detail["node"]["id"] == node_id
        with urllib.request.urlopen(f"{base}/node/{node_id}", timeout=10) as answer:
            assert b"Conditions:" in answer.read()
        req = urllib.request.Request(f"{base}/events?provider=fake",
                                     headers={"Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as answer:
            served = json.loads(answer.read())
        assert [e["kind"] for e in served] == [e["kind"] for e in events]
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/node/x1", timeout=10)
        assert info.value.code == 400
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/node/99999999", timeout=10)
        assert info.value.code == 404
    finally:
        web.stop()


def test_declined_label_reason(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(BODY)
    request_id = zuul.submit(["nowhere"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "failed"
    [(pool, entry)] = body["declined_reasons"].items()
    assert pool in body["declined_by"] and entry["reason"] == "LabelNotServed"
