"""`nodepool list`: Nodepool's columns, --detail, --json, redaction, the Locked column and
ten thousand nodes in one batched read."""

from __future__ import annotations

import json

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.views import listing
from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import Cli
from tests.helpers import in_use
from tests.launchers import LauncherFactory

HEADERS = [h for h, _ in listing.NODE_COLUMNS]
DETAIL_HEADERS = [h for h, _ in listing.NODE_DETAIL_COLUMNS]


def _headers(out: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("|"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_empty_installation(cli: Cli) -> None:
    result = cli("list")
    assert (result.code, result.err) == (0, "")
    assert _headers(result.out) == HEADERS
    assert result.table() == []
    assert cli("list", "--json").json() == []


def test_columns_locked_and_redacted(cli: Cli, launchers: LauncherFactory,
                                     zuul: ZuulClient) -> None:
    launchers()
    busy = in_use(zuul, ["large"])  # Zuul holds its lock
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None
    ready_id = body["nodes"][0]  # fulfilled, not yet accepted: ready and unlocked
    busy_id = busy.nodes[0].id

    result = cli("list")
    assert result.code == 0 and result.err == ""
    assert _headers(result.out) == HEADERS
    rows = {row[0]: dict(zip(HEADERS, row)) for row in result.table()}
    assert set(rows) == {busy_id, ready_id}
    assert rows[busy_id]["Provider"] == "fake"
    assert rows[busy_id]["Label"] == "large"
    assert rows[busy_id]["Server ID"] == f"main-{busy_id}"
    assert rows[busy_id]["State"] == "in-use"
    assert rows[busy_id]["Locked"] == "locked"
    assert rows[ready_id]["State"] == "ready"
    assert rows[ready_id]["Locked"] == "unlocked"
    assert rows[ready_id]["Age"].count(":") == 3  # dd:hh:mm:ss

    detail = cli("list", "--detail")
    assert _headers(detail.out) == DETAIL_HEADERS
    drows = {row[0]: dict(zip(DETAIL_HEADERS, row)) for row in detail.table()}
    assert drows[busy_id]["Pool"] == "main"
    assert drows[busy_id]["Port"] == "redacted"
    assert drows[ready_id]["Allocated To"] == request_id
    assert json.loads(drows[busy_id]["User Data"])["zuul_system"] == zuul.system_id
    assert "PoolWorker.fake-main" in drows[busy_id]["Launcher"]
    assert "fake-token" not in detail.out

    as_json = cli("list", "--json")
    assert as_json.code == 0 and "fake-token" not in as_json.out
    items = {item["id"]: item for item in as_json.json()}
    assert items[busy_id]["connection_port"] == "redacted"
    assert items[busy_id]["locked"] == "locked" and items[ready_id]["locked"] == "unlocked"
    assert items[busy_id]["label"] == ["large"]
    # The same keys as the web app's /node-list JSON.
    assert set(items[busy_id]) == set(listing.node_row(
        listing.NodeView(Node(id="0000000000", state="ready"), False), 0.0))
    # JSON always carries every key: --detail changes nothing but the table.
    detail_json = {item["id"]: item for item in cli("list", "--detail", "--json").json()}
    assert set(detail_json) == set(items)
    assert set(detail_json[busy_id]) == set(items[busy_id])
    zuul.release(busy)


def test_ten_thousand_nodes(cli: Cli, kazoo_client: KazooClient) -> None:
    """Created with batched transactions; listing uses batched reads (no per-node probes)."""
    count = 10_000
    kazoo_client.ensure_path(paths.NODES)
    body = json.dumps({"state": "ready", "provider": "fake", "pool": "main",
                       "type": ["small"], "external_id": "ns", "state_time": 1.0,
                       "connection_port": {"token": "secret-token", "host": "h"}}).encode()
    batch = 1000
    for start in range(0, count, batch):
        txn = kazoo_client.transaction()
        for index in range(start, start + batch):
            txn.create(paths.node_path(f"{index:010d}"), body)
        assert all(isinstance(r, str) for r in txn.commit())
    # A few of them are locked (a contender under the lock dir).
    locked = ["0000000007", "0000009999"]
    for node_id in locked:
        kazoo_client.create(f"{paths.node_lock_path(node_id)}/abc__lock__0000000000",
                            ephemeral=True, makepath=True)

    result = cli("list")
    assert result.code == 0
    rows = result.table()
    assert len(rows) == count
    assert [r[0] for r in rows] == [f"{i:010d}" for i in range(count)]
    locked_ids = [r[0] for r in rows if r[HEADERS.index("Locked")] == "locked"]
    assert locked_ids == locked

    as_json = cli("list", "--json")
    assert len(as_json.json()) == count
    assert "secret-token" not in as_json.out


def test_malformed_znodes_are_shown_not_fatal(cli: Cli, kazoo_client: KazooClient) -> None:
    """Empty znodes are skipped; every malformed record is a row in state `malformed` with
    its reason (never a traceback, exit 0); good records list as usual."""
    kazoo_client.create(paths.node_path("0000000001"), b"", makepath=True)
    bad = {
        "0000000002": b"not json",
        "0000000004": b"[" * 200_000,
        "0000000005": b"\xff\xfe{}",
        "0000000006": json.dumps({"state": 7, "type": "small"}).encode(),
        "0000000007": json.dumps({"state": "ready", "provider": ["a"]}).encode(),
        "0000000008": json.dumps({"state": "ready", "allocated_to": 12}).encode(),
        "0000000009": b'{"state": "ready", "resources": {"cores": NaN}}',
        "0000000010": b'{"state": "ready", "resources": {"ram": -Infinity}}',
        "0000000011": json.dumps({"state": "ready", "pool": {"x": 1}}).encode(),
    }
    for node_id, data in bad.items():
        kazoo_client.create(paths.node_path(node_id), data)
    kazoo_client.create(paths.node_path("0000000003"),
                        json.dumps({"state": "ready", "type": "small"}).encode())
    result = cli("list")
    assert result.code == 0
    rows = result.table()
    assert [r[0] for r in rows] == sorted([*bad, "0000000003"])
    states = {r[0]: r[HEADERS.index("State")] for r in rows}
    assert states.pop("0000000003") == "ready"
    assert set(states.values()) == {"malformed"}
    assert "Traceback" not in result.err

    detail = cli("list", "--json").json()
    reasons = {row["id"]: row.get("malformed") for row in detail}
    assert reasons["0000000003"] is None
    assert "nested too deeply" in reasons["0000000004"]
    assert "UTF-8" in reasons["0000000005"]
    assert "state" in reasons["0000000006"]
    assert "provider" in reasons["0000000007"]
    assert "allocated_to" in reasons["0000000008"]
    assert "resources" in reasons["0000000009"] and "resources" in reasons["0000000010"]
    assert "pool" in reasons["0000000011"]


def test_options_after_the_subcommand(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "-c", str(cli.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
