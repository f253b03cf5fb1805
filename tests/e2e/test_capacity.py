"""Capacity awareness end to end: a full cluster pauses the pool, freed capacity resumes it.

Aspects:
- the simulated cluster has one node with 2 cpu allocatable; a pod of someone else requests
  both: the launcher's provider (`capacity: {nodes: true}`) sees no room for its label (1
  cpu), so a request pauses the pool (Capacity NoneAvailable, Quota AtLimit in scope
  cloud) and no namespace or pod is created for it meanwhile (nothing sits Unschedulable);
- the CLI (`pool-list --json`), the web app (`/pool-list`, `/metrics`) and the published
  status agree at each step;
- deleting the occupying pod frees the node: the capacity watch wakes the pool, the request
  is served (its pod scheduled on that node) and Capacity reads Sufficient again.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from kubernetes import client as k8s

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.simulator.config import DEFAULT_NODE
from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.web.app import WebApp
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.test_pool_status import condition, get
from tests.e2e.util import NamespaceLog, admin_api
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: app
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    boot-timeout: 60
    api-backoff: [0.01, 0.02]
    capacity:
      nodes: true
    pools:
      - name: main
        labels:
          - name: app
            type: pod
            image: docker.io/fedora:40
            cpu: 1
            memory: 256
"""


@pytest.fixture
def k8s_sim(tmp_path: Path) -> Iterator[Simulator]:
    """One node with 2 cpu and 4Gi allocatable (the scheduler fits requests in them)."""
    sim = Simulator(SimulatorConfig(
        tls=True, node_allocatable={DEFAULT_NODE: {"cpu": "2", "memory": "4Gi"}})).start()
    try:
        sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim")
        yield sim
    finally:
        sim.stop()


def hog(core: k8s.CoreV1Api) -> None:
    """Someone else's pod taking the whole node."""
    core.create_namespace({"metadata": {"name": "others"}})
    core.create_namespaced_pod("others", {
        "metadata": {"name": "hog"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "resources": {"requests": {"cpu": "2"}}}]}})
    wait_for(lambda: core.read_namespaced_pod("hog", "others").spec.node_name == DEFAULT_NODE,
             15, message="the hog bound to the node")


def pool_record(launcher: Any) -> dict[str, Any] | None:
    found = [r for r in launcher.engine.pool_statuses.items().values()
             if r.get("pool") == "main"]
    return found[0] if found else None


def capacity_is(launcher: Any, reason: str) -> bool:
    record = pool_record(launcher)
    return record is not None and condition(record, "Capacity")["reason"] == reason


def cli_pools(zk: ZkConnection, tmp_path: Path,
              capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + "zookeeper-timeout: 5\n" + textwrap.dedent(CONFIG))
    capsys.readouterr()
    assert main(["-c", str(path), "pool-list", "--json"]) == 0
    out: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return out


def metric_lines(base: str) -> list[str]:
    return [line for line in get(f"{base}/metrics", json_body=False).splitlines()
            if line.startswith("nodepool_pool_condition{") and 'condition="Capacity"' in line]


def test_full_cluster_pauses_and_freed_capacity_resumes(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator, zk: ZkConnection,
        namespace_log: NamespaceLog, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    core = admin_api(k8s_sim)
    launcher = launchers(CONFIG)
    web = WebApp(LauncherStatus(launcher, Stats(RecordingBackend())), port=0).start()
    base = f"http://127.0.0.1:{web.port}"
    try:
        # An empty node: room for the label.
        wait_for(lambda: capacity_is(launcher, "Sufficient"), 15,
                 message="Capacity Sufficient on an empty node")

        # The node is full: a request pauses the pool, nothing is created for it.
        hog(core)
        request_id = zuul.submit(["app"])
        wait_for(lambda: capacity_is(launcher, "NoneAvailable")
                 and (pool_record(launcher) or {}).get("requests_queued") == 1, 15,
                 message="pool paused with Capacity NoneAvailable")
        record = pool_record(launcher)
        assert record is not None
        assert condition(record, "Capacity")["status"] == "False"
        assert condition(record, "Quota")["reason"] == "AtLimit"
        assert "cloud" in condition(record, "Quota")["message"]
        assert record["capacity"]["labels"]["app"]["available"] is False
        assert zuul.get_request(request_id)["state"] == "pending"  # type: ignore[index]
        assert namespace_log.added == ["others"]
        pods = core.list_pod_for_all_namespaces().items
        assert [(p.metadata.namespace, p.metadata.name) for p in pods] == [("others", "hog")]

        # CLI, web and metrics agree.
        (cli,) = cli_pools(zk, tmp_path, capsys)
        assert condition(cli, "Capacity")["reason"] == "NoneAvailable"
        assert cli["requests_queued"] == 1
        (web_pool,) = get(f"{base}/pool-list")
        assert condition(web_pool, "Capacity")["reason"] == "NoneAvailable"
        assert web_pool["requests_queued"] == 1
        # 1 only while the status is True
        assert [line.rsplit(" ", 1)[1] for line in metric_lines(base)] == ["0.0"]

        # Capacity frees: the watch wakes the pool; the request is served on that node.
        core.delete_namespaced_pod("hog", "others")
        body = zuul.wait(request_id, 60)
        assert body is not None and body["state"] == "fulfilled"
        assert len(namespace_log.added) == 2
        ours = [p for p in core.list_pod_for_all_namespaces().items
                if p.metadata.namespace == namespace_log.added[1]]
        assert len(ours) == 1 and ours[0].spec.node_name == DEFAULT_NODE
        # One of two cpus used: room for one more; queue empty.
        wait_for(lambda: capacity_is(launcher, "Sufficient")
                 and (pool_record(launcher) or {}).get("requests_queued") == 0
                 and (pool_record(launcher) or {}).get("nodes") == {"ready": 1}, 15,
                 message="Capacity Sufficient again")
        (cli,) = cli_pools(zk, tmp_path, capsys)
        assert condition(cli, "Capacity")["reason"] == "Sufficient"
        assert cli["nodes"] == {"ready": 1}
        (web_pool,) = get(f"{base}/pool-list")
        assert condition(web_pool, "Capacity")["reason"] == "Sufficient"
        assert [line.rsplit(" ", 1)[1] for line in metric_lines(base)] == ["1.0"]
    finally:
        web.stop()
