"""Pool status and the circuit breaker, end to end against the simulated cluster.

Aspects:
- a label whose image does not exist (the simulator's image-pull fault) fails in pool `a`;
  after `breaker-threshold` failed launches the breaker trips: pool `a` shows `Suspended`
  (LabelSuspended, reason ErrImagePull) in the published status, the CLI (`pool-list`),
  the web app (`/pool-list`, `/metrics`), and every launcher's pool `a` agrees (the state
  is shared in ZooKeeper), and `pool-list`, `/pool-list` and the pool-level series of
  `/metrics` show one status per pool with both launchers inside it;
- while suspended, pool `a` declines the label at once (no namespace is created for it
  there) and pool `b`, serving the same label with a good image, takes every request;
- the image fixed in the configuration resets the breaker, and pool `a` (preferred,
  priority 1) serves the label again.
"""

from __future__ import annotations

import json
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.web.app import WebApp
from nodepool_k8s.zk.pool_status import POOL_STATUS, read_all
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import NamespaceLog
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory, make_config

BAD_IMAGE = "registry.invalid/ci/missing:1"
GOOD_IMAGE = "docker.io/fedora:40"

CONFIG = """
labels:
  - name: app
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 1
    boot-timeout: 60
    api-backoff: [0.01, 0.02]
    pools:
      - name: a
        priority: 1
        breaker-threshold: 2
        breaker-backoff: 3600
        labels:
          - name: app
            type: pod
            image: {image_a}
      - name: b
        priority: 2
        labels:
          - name: app
            type: pod
            image: {image_b}
"""


def config(image_a: str = BAD_IMAGE) -> str:
    return CONFIG.format(image_a=image_a, image_b=GOOD_IMAGE)


def statuses(launcher: Launcher, pool: str) -> list[dict[str, Any]]:
    return [r for r in launcher.engine.pool_statuses.items().values() if r.get("pool") == pool]


def condition(record: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in record["conditions"] if c["type"] == ctype)


def suspended_everywhere(launchers: list[Launcher]) -> bool:
    for launcher in launchers:
        found = statuses(launcher, "a")
        if len(found) != len(launchers) or not all(
                condition(r, "Suspended")["reason"] == "LabelSuspended" for r in found):
            return False
    return True


def get(url: str, json_body: bool = True) -> Any:
    headers = {"Accept": "application/json"} if json_body else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=10) as response:
        body = response.read().decode("utf8")
    return json.loads(body) if json_body else body


def cli_pool_list(zk: ZkConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                  *extra: str) -> str:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + "zookeeper-timeout: 5\n" + textwrap.dedent(config()))
    capsys.readouterr()
    assert main(["-c", str(path), "pool-list", *extra]) == 0
    return capsys.readouterr().out


def test_breaker_trips_moves_work_and_resets(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator, zk: ZkConnection,
        namespace_log: NamespaceLog, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    k8s_sim.set_faults(image_pull_fail=("registry.invalid/*",))
    first = launchers(config())
    second = launchers(config())  # a second launcher sharing the provider and its pools
    web = WebApp(LauncherStatus(first, Stats(RecordingBackend())), port=0).start()
    base = f"http://127.0.0.1:{web.port}"
    try:
        # Before any failure: both launchers publish both pools, nothing suspended.
        wait_for(lambda: len(statuses(first, "a")) == 2 and len(statuses(first, "b")) == 2,
                 15, message="every pool's status published")
        assert all(condition(r, "Suspended")["status"] == "False"
                   for r in statuses(first, "a"))

        # Each request fails in pool a (bad image), is declined there and served by b.
        for _ in range(2):
            _, nodes = zuul.run_build(["app"], timeout=60)
            assert len(nodes) == 1
        wait_for(lambda: suspended_everywhere([first, second]), 15,
                 message="pool a suspended in every launcher's view")
        record = statuses(second, "a")[0]
        assert record["suspended"]["app"]["reason"] in ("ErrImagePull", "ImagePullBackOff")
        assert record["suspended"]["app"]["failures"] == 2

        # Suspended: pool a declines at once (no pod there), pool b serves.
        created = len(namespace_log.added)
        for _ in range(2):
            _, nodes = zuul.run_build(["app"], timeout=60)
            node = zuul.get_node(nodes[0])
            assert node is not None and node["pool"] == "b"
        assert len(namespace_log.added) == created + 2  # pool b's two, none in pool a

        # The CLI, the web app and the metrics tell the same story: one status per pool,
        # the two launchers serving it listed inside it.
        workers = sorted(r["id"] for r in read_all(first.zk, POOL_STATUS).values())
        out = json.loads(cli_pool_list(zk, tmp_path, capsys, "--json"))
        assert [(r["pool"], condition(r, "Suspended")["reason"]) for r in out] == [
            ("a", "LabelSuspended"), ("b", "NoneSuspended")]
        assert sorted(entry["id"] for r in out for entry in r["launchers"]) == workers
        assert all(len(r["launchers"]) == 2 for r in out)
        table = cli_pool_list(zk, tmp_path, capsys)
        assert "LabelSuspended" not in table and "app" in table  # suspended label column
        assert len([line for line in table.splitlines() if line.startswith("| k8s")]) == 2
        web_pools = get(f"{base}/pool-list")
        assert [r["pool"] for r in web_pools] == ["a", "b"]
        assert sorted(entry["id"] for r in web_pools for entry in r["launchers"]) == workers
        metrics = get(f"{base}/metrics", json_body=False)
        combined = [line for line in metrics.splitlines()
                    if line.startswith("nodepool_pool_combined_condition{")
                    and 'condition="Suspended"' in line]
        assert sorted(combined) == [
            'nodepool_pool_combined_condition{condition="Suspended",pool="a",provider="k8s"}'
            " 1.0",
            'nodepool_pool_combined_condition{condition="Suspended",pool="b",provider="k8s"}'
            " 0.0"]
        assert 'nodepool_pool_launchers{pool="a",provider="k8s"} 2.0' in metrics
        suspended = [line for line in metrics.splitlines()
                     if line.startswith("nodepool_pool_condition{")
                     and 'condition="Suspended"' in line]
        # One series per pool worker, named by stable labels (no per-process id, no reason).
        assert len(suspended) == 4 and not any("pool_id=" in line or "reason=" in line
                                               for line in suspended)
        assert sorted(line.rsplit(" ", 1)[1] for line in suspended if 'pool="a"' in line) \
            == ["1.0", "1.0"]
        assert len({line.rsplit(" ", 1)[0] for line in suspended}) == 4

        # The image fixed in config: the breaker resets; the preferred pool a serves again.
        for launcher in (first, second):
            launcher.reload(make_config(zk, config(image_a=GOOD_IMAGE)))
        wait_for(lambda: all(condition(r, "Suspended")["status"] == "False"
                             for r in statuses(first, "a")) and len(statuses(first, "a")) == 2,
                 15, message="pool a no longer suspended")
        _, nodes = zuul.run_build(["app"], timeout=60)
        node = zuul.get_node(nodes[0])
        assert node is not None and node["pool"] == "a"
    finally:
        web.stop()
