"""`nodepool request-list`, `label-list` and `info PROVIDER`, as tables and as JSON."""

from __future__ import annotations

import re

from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.views import listing
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.client import ZkClient
from tests.cli.conftest import CONFIG, Cli, foreign_node, parse_table
from tests.helpers import ZkConnection, in_use
from tests.launcher.requests.support import WorkerDeps
from tests.launcher.requests.test_pool_worker import worker_for
from tests.launchers import LauncherFactory, make_config

REQUEST_HEADERS = [h for h, _ in listing.REQUEST_COLUMNS]


def test_request_list(cli: Cli, zuul: ZuulClient) -> None:
    # No launcher: the requests stay `requested`, in Zuul's exact format.
    low = zuul.submit(["small"], priority="300", relative_priority=0, event_id="ev-low")
    late = zuul.submit(["large", "small"], priority="100", relative_priority=5,
                       event_id="ev-late")
    early = zuul.submit(["small"], priority="100", relative_priority=1, event_id="ev-early")

    result = cli("request-list")
    assert (result.code, result.err) == (0, "")
    header = result.out.splitlines()[1]
    assert [cell.strip() for cell in header.strip("|").split("|")] == REQUEST_HEADERS
    rows = [dict(zip(REQUEST_HEADERS, r)) for r in result.table()]
    # Served order: priority prefix, then relative priority, then sequence.
    assert [r["Request ID"] for r in rows] == [early, late, low]
    # Since the submission, as `list`'s Age (dd:hh:mm:ss).
    assert re.fullmatch(r"\d\d:\d\d:\d\d:\d\d", rows[1].pop("Age"))
    assert rows[1] == {"Request ID": late, "Priority": "5", "State": "requested",
                       "Requestor": zuul.system_id, "Node Types": "large,small",
                       "Nodes": "", "Declined By": "", "Event ID": "ev-late"}

    items = cli("request-list", "--json").json()
    assert [i["id"] for i in items] == [early, late, low]
    assert items[1]["node_types"] == ["large", "small"]
    assert items[1]["relative_priority"] == 5 and items[1]["tenant_name"] == "tenant-1"


def test_request_list_shows_the_launchers_work(cli: Cli, launchers: LauncherFactory,
                                               zuul: ZuulClient) -> None:
    launchers()
    done = zuul.submit(["small", "large"])
    body = zuul.wait(done)
    assert body is not None
    unknown = zuul.submit(["no-such-label"])
    failed = zuul.wait(unknown)
    assert failed is not None and failed["state"] == "failed"

    items = {i["id"]: i for i in cli("request-list", "--json").json()}
    assert items[done]["state"] == "fulfilled" and items[done]["nodes"] == body["nodes"]
    assert items[unknown]["state"] == "failed"
    assert items[unknown]["declined_by"] == failed["declined_by"] != []
    rows = {r[0]: dict(zip(REQUEST_HEADERS, r)) for r in cli("request-list").table()}
    assert rows[done]["Nodes"] == ",".join(body["nodes"])
    assert rows[unknown]["Declined By"] == ",".join(failed["declined_by"])


def test_label_list(cli: Cli, zk: ZkConnection, zkc: ZkClient) -> None:
    # Nothing registered: no labels (the configuration alone does not count).
    assert cli("label-list", "--json").json() == []
    # A launcher's pool worker registers its pool.
    worker_for(WorkerDeps(zkc, make_config(zk, CONFIG), ManualClock()))
    result = cli("label-list")
    assert result.code == 0
    assert result.table() == [["large"], ["small"]]
    assert cli("label-list", "--json").json() == [{"label": "large"}, {"label": "small"}]


def test_info(cli: Cli, launchers: LauncherFactory, zuul: ZuulClient,
              kazoo_client: KazooClient) -> None:
    launcher = launchers()
    nodeset = in_use(zuul, ["large"])
    node_id = nodeset.nodes[0].id
    foreign_node(kazoo_client, provider="other")  # not listed under "fake"

    result = cli("info", "fake")
    assert (result.code, result.err) == (0, "")
    nodes_part, pools_part = result.out.split("Pools:\n")
    assert nodes_part.startswith("Nodes:\n")
    assert parse_table(nodes_part) == [[node_id, f"main-{node_id}", "in-use", "large", "main"]]
    pool_headers = [h for h, _ in listing.POOL_COLUMNS]
    pools = [dict(zip(pool_headers, r)) for r in parse_table(pools_part)]
    worker = next(iter(launcher.pool_workers.values()))
    assert pools == [{"Pool": "main", "Pool ID": worker.id, "Hostname": pools[0]["Hostname"],
                      "Supported Labels": "large,small", "Paused": "False",
                      "State": "running"}]

    info = cli("info", "fake", "--json").json()
    assert info["provider"] == "fake"
    assert [n["id"] for n in info["nodes"]] == [node_id]
    assert info["nodes"][0]["connection_port"] == "redacted"
    assert info["pools"][0]["supported_labels"] == ["large", "small"]
    assert info["pools"][0]["paused"] is False and info["pools"][0]["id"] == worker.id
    zuul.release(nodeset)


def test_info_of_a_provider_without_nodes(cli: Cli, kazoo_client: KazooClient) -> None:
    # Configured but not running: empty tables, success.
    result = cli("info", "fake")
    assert result.code == 0
    nodes_part, pools_part = result.out.split("Pools:\n")
    assert parse_table(nodes_part) == [] and parse_table(pools_part) == []
    # Known only from its nodes (e.g. removed from this configuration): still shown.
    node_id = foreign_node(kazoo_client, provider="retired")
    assert [n["id"] for n in cli("info", "retired", "--json").json()["nodes"]] == [node_id]


def test_info_of_an_unknown_provider(cli: Cli) -> None:
    result = cli("info", "nope")
    assert (result.code, result.out) == (1, "")
    assert result.err == ("nodepool info: provider 'nope' is not in the configuration and has"
                          " neither nodes nor registered pools\n")
