"""Pause, drain and resume across two real launcher processes, through the `nodepool` CLI.

Both launchers serve provider `fake` pool `main` (min-ready 2). Paused: both pool
components report paused, a request only that pool can serve waits (it is neither declined
nor fulfilled); drained: the spare nodes go, the node in use stays ("drained"), and once
it is released the pool is "empty"; resumed: the waiting request is fulfilled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import Cli
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import Processes

pytestmark = pytest.mark.slow

CONFIG = """
labels:
  - name: small
    min-ready: 2
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 6
        labels:
          - name: small
            type: namespace
"""


def pool_components(client: KazooClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if not client.exists(paths.POOL_COMPONENTS):
        return found
    for name in client.get_children(paths.POOL_COMPONENTS):
        try:
            data, _ = client.get(f"{paths.POOL_COMPONENTS}/{name}")
        except NoNodeError:
            continue
        found.append(json.loads(data))
    return found


def nodes(client: KazooClient) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if not client.exists(paths.NODES):
        return out
    for node_id in client.get_children(paths.NODES):
        try:
            out[node_id] = json.loads(client.get(paths.node_path(node_id))[0])
        except (NoNodeError, ValueError):
            continue
    return out


def ready_spares(client: KazooClient) -> list[str]:
    return [i for i, n in nodes(client).items()
            if n.get("state") == "ready" and not n.get("allocated_to")]


def test_pause_drain_resume_across_two_processes(processes: Processes, zk: ZkConnection,
                                                 kazoo_client: KazooClient, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    processes.start(CONFIG)
    processes.start(CONFIG)
    cli = Cli(tmp_path / "nodepool-0.yaml", capsys)
    wait_for(lambda: len(pool_components(kazoo_client)) == 2, 30, message="both registered")
    wait_for(lambda: len(ready_spares(kazoo_client)) >= 2, 30, message="min-ready nodes")
    with ZuulClient(zk.hosts) as zuul:
        request_id = zuul.submit(["small"])
        assert (zuul.wait(request_id) or {}).get("state") == "fulfilled"
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        busy = nodeset.nodes[0].id

        result = cli("pause", "fake/main", "--reason", "cluster upgrade", "--json")
        assert result.code == 0, result.err
        (row,) = result.json()
        assert row["state"] == "paused" and row["reason"] == "cluster upgrade"
        assert "@" in row["by"] and row["source"] == "operator"
        wait_for(lambda: all(c.get("paused") for c in pool_components(kazoo_client)), 30,
                 message="both launchers to pause the pool")
        waiting = zuul.submit(["small"])

        result = cli("drain", "fake/main", "--reason", "decommission", "--json")
        assert result.code == 0, result.err
        assert result.json()[0]["state"] in ("draining", "drained")

        def drained() -> Any:
            (row,) = cli("pool-state", "fake/main", "--json").json()
            return row if row["state"] == "drained" else None
        row = wait_for(drained, 30, message="the spare nodes to be deleted")
        assert row["in_use"] == 1 and row["spare"] == 0 and row["action"] == "drain"
        assert nodes(kazoo_client)[busy]["state"] == "in-use"
        # The request only this pool can serve waited through pause and drain.
        body = zuul.get_request(waiting) or {}
        assert body.get("state") == "requested" and not body.get("declined_by"), body

        zuul.release(nodeset)
        wait_for(lambda: cli("pool-state", "--json").json()[0]["state"] == "empty", 30,
                 message="the used node to go too")
        table = cli("pool-state")
        assert "empty" in table.out and "decommission" in table.out

        result = cli("resume", "fake/main", "--json")
        assert result.code == 0 and result.json()[0]["state"] == "active"
        assert (zuul.wait(waiting, 30) or {}).get("state") == "fulfilled", processes.logs()
        assert cli("resume", "fake/main").err.startswith("warning:")


def test_unknown_targets_are_refused(zk: ZkConnection, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + CONFIG)
    cli = Cli(path, capsys)
    result = cli("pause", "nope")
    assert result.code == 1 and "no provider 'nope'" in result.err
    result = cli("drain", "fake/other")
    assert result.code == 1 and "has no pool 'other'" in result.err
