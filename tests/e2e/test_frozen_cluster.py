"""A frozen API server costs no builds when another cluster can serve the label.

Two providers (two simulated clusters) serve the same label; the preferred one (its pool's
priority is higher) takes every request. Its API server then stops answering without going
away (`Simulator.freeze`: connections accepted, nothing answered), while its launches are
under way (their namespaces exist; the next create hangs).

Aspects:
- the pool reports `ApiReachable` False, logs `api-unreachable`, registers paused, and
  hands the requests it holds back (declined with `HandedBack`, its launches cancelled):
  all ten are fulfilled by the other cluster within 30 s; the hand-backs are counted;
- once the API server answers again the provider is back by itself (`ApiReachable` True,
  `api-reachable` logged) and what the abandoned launches created there is removed.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher import lifecycle
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.runtime.stats import PROM_HANDED_BACK
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.core.model import NodeRequest
from tests.e2e.util import our_namespaces, wait_cluster_empty
from tests.helpers import wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory

# The preferred cluster (`near`, pool priority 1) and the other one (`far`, priority 2).
# Launch calls get 3 s to answer, 3 retries 5 s apart: a launch would give up by itself
# only after about 27 s; the probe (every 0.5 s, 0.5 s to answer) notices the freeze first.
PROVIDER = """
  - name: {name}
    driver: kubernetes
    context: {context}
    launch-retries: 1
    api-retries: 3
    api-backoff: [5]
    api-connect-timeout: 1
    api-read-timeout: 3
    api-probe-interval: 0.5
    api-probe-connect-timeout: 0.5
    api-probe-read-timeout: 0.5
    hand-back-after: 1
    pools:
      - name: main
        priority: {priority}
        max-servers: 20
        labels:
          - name: ns
            type: namespace
"""
CONFIG = "labels:\n  - name: ns\nproviders:\n" + PROVIDER.format(
    name="near", context="sim", priority=1) + PROVIDER.format(
    name="far", context="sim2", priority=2)
SETTINGS = dataclasses.replace(TEST_SETTINGS, cleanup_interval=1.0)
COUNT = 10


@pytest.fixture
def far_sim(tmp_path: Path, sim_tls_material: str, k8s_sim: Simulator,
            monkeypatch: pytest.MonkeyPatch) -> Any:
    """A second cluster (context "sim2"); $KUBECONFIG names both clusters' kubeconfigs."""
    sim = Simulator(SimulatorConfig(tls=True, tls_material_dir=sim_tls_material)).start()
    try:
        path = sim.write_kubeconfig(tmp_path / "kubeconfig-far", context="sim2")
        assert k8s_sim.kubeconfig_path is not None
        monkeypatch.setenv("KUBECONFIG", os.pathsep.join([k8s_sim.kubeconfig_path, path]))
        yield sim
    finally:
        sim.stop()


def api_condition(launcher: Launcher, provider: str) -> tuple[str, str]:
    for record in launcher.engine.pool_statuses.items().values():
        if record.get("provider") == provider:
            for c in record.get("conditions") or []:
                if c["type"] == "ApiReachable":
                    return c["status"], c["reason"]
    return "", ""


def api_events(launcher: Launcher) -> list[str]:
    return [e["kind"] for e in zk_events.read_events(launcher.zk)
            if e["kind"] in (zk_events.API_UNREACHABLE, zk_events.API_REACHABLE)
            and e.get("provider") == "near"]


def test_requests_move_off_a_frozen_cluster(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        far_sim: Simulator) -> None:
    near = k8s_sim
    launcher = launchers(CONFIG, settings=SETTINGS)
    for provider in ("near", "far"):
        wait_for(lambda: api_condition(launcher, provider) == ("True", "Reachable"), 30,
                 message=f"{provider}'s API server reachable")
    # The near cluster creates the namespaces, then its answers stop.
    near.stall_next("create", "resourcequotas", count=1000, seconds=20)
    ids = [zuul.submit(["ns"]) for _ in range(COUNT)]
    wait_for(lambda: len(our_namespaces(near, "near")) == COUNT, 30,
             message="every launch under way in the near cluster")
    near.freeze()

    wait_for(lambda: api_condition(launcher, "near") == ("False", "Unreachable"), 30,
             message="the near pool to report its API server unreachable")
    # Every request is served by the far cluster, within 30 s of the freeze.
    wait_for(lambda: all((zuul.get_request(i) or {}).get("state") == "fulfilled"
                         for i in ids), 30, message="every request fulfilled")
    for request_id in ids:
        body = zuul.get_request(request_id)
        assert body is not None
        node = zuul.get_node(body["nodes"][0])
        assert node is not None and node["provider"] == "far", node
        reasons = lifecycle.declined_reasons(NodeRequest.from_dict("x", body))
        assert [r["reason"] for r in reasons.values()] == ["HandedBack"], reasons
    assert zk_events.API_UNREACHABLE in api_events(launcher)
    handed = sum(v for (name, labels), v in launcher.engine.stats.counters().items()
                 if name == PROM_HANDED_BACK and ("provider", "near") in labels)
    assert handed == COUNT

    near.clear_faults()
    near.thaw()
    wait_for(lambda: api_condition(launcher, "near") == ("True", "Reachable"), 30,
             message="the near pool to report its API server reachable again")
    wait_for(lambda: api_events(launcher)[-1:] == [zk_events.API_REACHABLE], 30,
             message="an api-reachable event")
    # What the given-up launches created there is removed (their nodes' deletion).
    wait_cluster_empty(near, 60)
