"""`nodepool hold`: a ready node is held with the reason as comment; nodes Zuul has locked,
nodes being deleted and unknown ids are refused."""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.views import listing
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import (MIN_READY, Cli, foreign_node, lock_contenders, ready_node,
                                record)
from tests.helpers import in_use
from tests.launchers import LauncherFactory

DETAIL = [h for h, _ in listing.NODE_DETAIL_COLUMNS]


def test_hold_a_ready_node(cli: Cli, launchers: LauncherFactory,
                           kazoo_client: KazooClient) -> None:
    launchers(MIN_READY)
    node_id = ready_node(kazoo_client)
    result = cli("hold", node_id, "--reason", "debugging flaky job")
    assert (result.code, result.err) == (0, "")
    row = result.table()[0]
    assert row[0] == node_id and row[6] == "hold" and row[8] == "unlocked"
    data = record(kazoo_client, node_id)
    assert data["state"] == "hold" and data["comment"] == "debugging flaky job"
    assert lock_contenders(kazoo_client, node_id) == []
    # Other fields survive the write (the whole record was re-read under the lock).
    assert data["external_id"] == f"main-{node_id}" and data["provider"] == "fake"
    detail = cli("list", "--detail")
    rows = {r[0]: dict(zip(DETAIL, r)) for r in detail.table()}
    assert rows[node_id]["Comment"] == "debugging flaky job"
    # The launcher keeps held nodes; it tops min-ready up with a new one instead.
    assert ready_node(kazoo_client) != node_id
    assert record(kazoo_client, node_id)["state"] == "hold"


def test_hold_without_reason(cli: Cli, kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    assert cli("hold", node_id).code == 0
    assert record(kazoo_client, node_id)["comment"] == "held with nodepool hold"


def test_refuses_a_node_zuul_has_locked(cli: Cli, launchers: LauncherFactory,
                                        zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    launchers()
    nodeset = in_use(zuul, ["small"])
    node_id = nodeset.nodes[0].id
    result = cli("hold", node_id, "--lock-timeout", "0.2")
    assert (result.code, result.out) == (1, "")
    assert result.err == (f"nodepool hold: node {node_id} is locked by another client"
                          " (in use?); cannot hold it\n")
    assert record(kazoo_client, node_id)["state"] == "in-use"
    zuul.release(nodeset)


def test_refuses_a_node_being_deleted(cli: Cli, kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    assert cli("delete", node_id).code == 0
    result = cli("hold", node_id)
    assert result.code == 1
    assert result.err == (f"nodepool hold: node {node_id} is being deleted (state deleting);"
                          " cannot hold it\n")
    assert record(kazoo_client, node_id)["state"] == "deleting"
    assert lock_contenders(kazoo_client, node_id) == []


def test_unknown_id(cli: Cli) -> None:
    result = cli("hold", "7")
    assert (result.code, result.out) == (1, "")
    assert result.err == "nodepool hold: node 0000000007 not found\n"
