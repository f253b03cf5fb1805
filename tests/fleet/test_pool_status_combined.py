"""One status per pool across launchers, and drifted spares in it (real ZooKeeper, fake driver).

Aspects: two launchers serve pool `main`; after one of them loads a changed label (with a
drift budget of 0, so nothing is replaced and the spares stay drifted) its published
status says `Drifted` True (SparesDrifted, 2 spares) and the other's says False. The
combined status (`pool-list --json`, the table, `/pool-list`, `/metrics`) is one row with
both launchers inside it, `Drifted` True naming the launcher it comes from and what the
other says, `drifted` 2; `nodepool show` and `/node/<id>` give the spare a `Drifted`
condition by the configuration they read (ConfigurationChanged under the new one,
ConfigurationCurrent under the old).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.web.app import WebApp
from tests.helpers import ZkConnection, replaced, wait_for
from tests.launcher.test_min_ready import settle, spares
from tests.launchers import LauncherFactory, make_config

BODY = """
labels:
  - name: small
    min-ready: 2
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 4
        drift-budget:
          max-nodes: 0
        labels:
          - name: small
            type: namespace
"""
CHANGED = replaced(BODY, "type: namespace", "type: namespace\n            launch-delay: 0.01")


def records(launcher: Launcher) -> list[dict[str, Any]]:
    return [r for r in launcher.engine.pool_statuses.items().values()
            if r.get("pool") == "main"]


def condition(record: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in record["conditions"] if c["type"] == ctype)


def cli(zk: ZkConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str,
        *args: str) -> str:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + "zookeeper-timeout: 5\n" + body)
    capsys.readouterr()
    assert main(["-c", str(path), *args]) == 0
    return capsys.readouterr().out


def get(url: str, json_body: bool = True) -> Any:
    headers = {"Accept": "application/json"} if json_body else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=10) as response:
        body = response.read().decode("utf8")
    return json.loads(body) if json_body else body


def test_one_status_per_pool_with_drifted_spares(
        launchers: LauncherFactory, zk: ZkConnection, kazoo_client: KazooClient,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = launchers(BODY)
    settle(first, kazoo_client, 2)
    second = launchers(BODY)
    wait_for(lambda: len(records(first)) == 2, 15, message="both launchers publish main")
    second.reload(make_config(zk, CHANGED))

    def split() -> bool:
        found = {r["id"]: condition(r, "Drifted")["reason"] for r in records(first)}
        return sorted(found.values()) == ["NoneDrifted", "SparesDrifted"]
    wait_for(split, 15, message="the reloaded launcher sees drifted spares, the other not")
    mine = next(r for r in records(first) if condition(r, "Drifted")["status"] == "True")
    assert mine["drifted"] == 2
    assert "2 spare node(s)" in condition(mine, "Drifted")["message"]
    # Budget 0: nothing was replaced.
    assert len(spares(kazoo_client)) == 2

    out = json.loads(cli(zk, tmp_path, capsys, BODY, "pool-list", "--json"))
    assert len(out) == 1
    (pool,) = out
    assert sorted(entry["id"] for entry in pool["launchers"]) == sorted(
        r["id"] for r in records(first))
    assert all(entry["ready"] and not entry["paused"] for entry in pool["launchers"])
    drifted = condition(pool, "Drifted")
    assert (drifted["status"], drifted["reason"], pool["drifted"]) == (
        "True", "SparesDrifted", 2)
    assert "other launchers:" in drifted["message"] and "False/NoneDrifted" in \
        drifted["message"]
    # Launchers that agree: the condition as either publishes it.
    assert condition(pool, "Validated")["message"] == "1 label(s)"
    table = cli(zk, tmp_path, capsys, BODY, "pool-list")
    rows = [line for line in table.splitlines() if line.startswith("| fake")]
    assert len(rows) == 1 and "Launchers" in table and "Drifted" in table

    web = WebApp(LauncherStatus(second, Stats(RecordingBackend())), port=0).start()
    base = f"http://127.0.0.1:{web.port}"
    try:
        node_id = sorted(spares(kazoo_client))[0]
        wait_for(lambda: len(get(f"{base}/pool-list")) == 1
                 and get(f"{base}/pool-list")[0]["drifted"] == 2, 15,
                 message="the web app's snapshot shows the drift")
        metrics = get(f"{base}/metrics", json_body=False)
        assert 'nodepool_pool_drifted_spares{pool="main",provider="fake"} 2.0' in metrics
        assert 'nodepool_pool_combined_condition{condition="Drifted",pool="main",' \
            'provider="fake"} 1.0' in metrics
        assert 'nodepool_pool_launchers_ready{pool="main",provider="fake"} 2.0' in metrics
        # The node's own Drifted condition, by the web app's (the second launcher's)
        # configuration and by the configuration the CLI reads.
        detail = get(f"{base}/node/{node_id}")
        assert condition(detail, "Drifted")["reason"] == "ConfigurationChanged"
        assert detail["node"]["drifted"] is True
        changed = json.loads(cli(zk, tmp_path, capsys, CHANGED, "show", node_id, "--json"))
        assert condition(changed, "Drifted")["status"] == "True"
        text = cli(zk, tmp_path, capsys, CHANGED, "show", node_id)
        assert "Drifted: built from an older configuration" in text
        current = json.loads(cli(zk, tmp_path, capsys, BODY, "show", node_id, "--json"))
        assert condition(current, "Drifted")["reason"] == "ConfigurationCurrent"
        assert "failed" not in cli(zk, tmp_path, capsys, BODY, "show", node_id)
    finally:
        web.stop()
