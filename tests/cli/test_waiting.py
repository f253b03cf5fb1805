"""Why a request waits, and how long, through the engine (fake driver, real ZooKeeper), the
CLI and the pool's queued gauge.

Aspects: a drained pool notes `PoolDraining` on every request it holds back (an extra key,
written once: further passes write nothing), counts them all in `requests_queued` (the
status record, statsd and so `nodepool_pool_requests_queued`), and `request-list
--detail`, `--json` and `show REQUEST_ID` say so; on resume they are served and the note
goes with the state change. A request the pool accepted and holds at quota notes
`WaitingForQuota` (its own lock, one write); one behind it that the paused pool did not
take shows the computed `PoolWaiting`; both count as queued. With no launcher at all,
`request-list` says no pool serves the label. Every row has an Age.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk.pool_status import status_path
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import Cli, parse_table
from tests.helpers import wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory, small_pool

SETTINGS = dataclasses.replace(TEST_SETTINGS, pool_status_interval=0.1)
AGE = re.compile(r"^\d\d:\d\d:\d\d:\d\d$")
QUEUED_KEY = "nodepool.pool.fake.main.requests_queued"


def waiting_reasons(zuul: ZuulClient, request_id: str) -> dict[str, Any]:
    return dict((zuul.get_request(request_id) or {}).get("waiting_reasons") or {})


def published_queued(client: KazooClient, pool_id: str) -> Any:
    try:
        return json.loads(client.get(status_path(pool_id))[0]).get("requests_queued")
    except Exception:
        return None


def last_gauge(backend: RecordingBackend, key: str) -> float | None:
    values = [v for (kind, k, v) in list(backend.sent) if kind == "gauge" and k == key]
    return values[-1] if values else None


def pool_id(launcher: Launcher) -> str:
    return launcher.pool_workers[("fake", "main")].id


def test_a_drained_pool_says_why_its_requests_wait_and_counts_them(
        launchers: LauncherFactory, zuul: ZuulClient, cli: Cli,
        kazoo_client: KazooClient) -> None:
    backend = RecordingBackend()
    launcher = launchers(small_pool(20), settings=SETTINGS, stats=Stats(backend))
    me = pool_id(launcher)
    assert cli("drain", "fake/main", "--reason", "node upgrade").code == 0
    worker = launcher.pool_workers[("fake", "main")]
    wait_for(lambda: worker.registration is not None and all(
        c.paused for c in launcher.component_cache.pools()), message="the pool paused")

    waiting = [zuul.submit(["small"]) for _ in range(12)]

    def noted() -> bool:
        return all(waiting_reasons(zuul, r).get(me, {}).get("reason") == "PoolDraining"
                   for r in waiting)
    wait_for(noted, 30, message="every request to say the pool is draining")
    note = waiting_reasons(zuul, waiting[0])[me]
    assert "drained" in note["message"] and "node upgrade" in note["message"], note
    body = zuul.get_request(waiting[0]) or {}
    assert body["state"] == "requested" and body["declined_by"] == []

    # Queued counts what really waits: all twelve, in the record and in statsd.
    wait_for(lambda: published_queued(kazoo_client, me) == 12, 30,
             message="requests_queued == 12 in the pool's status")
    wait_for(lambda: last_gauge(backend, QUEUED_KEY) == 12, 30,
             message="the statsd gauge at 12")

    # Written once: passes that find the same cause write nothing.
    before, passes = launcher.zk.writes.snapshot(), worker.passes
    for _ in range(5):
        seen = worker.passes
        worker.wake()
        wait_for(lambda: worker.passes > seen, message="another pass")
    assert worker.passes >= passes + 5
    assert launcher.zk.writes.snapshot()[0] == before[0]

    # The CLI: the Waiting column, the JSON, `show REQUEST_ID`, and the age.
    result = cli("request-list", "--detail")
    assert result.code == 0, result.err
    header = [c.strip() for c in result.out.splitlines()[1].strip("|").split("|")]
    rows = {r[0]: dict(zip(header, r)) for r in parse_table(result.out)}
    assert "PoolDraining" in rows[waiting[0]]["Waiting"]
    assert AGE.match(rows[waiting[0]]["Age"])
    items = {i["id"]: i for i in cli("request-list", "--json").json()}
    assert items[waiting[3]]["waiting"][me].startswith("PoolDraining: pool fake/main is")
    assert AGE.match(items[waiting[3]]["age"])
    shown = cli("show", waiting[5])
    assert shown.code == 0, shown.err
    assert "PoolDraining" in shown.out and "What to do: " in shown.out
    assert cli("show", waiting[5], "--json").json()["request"]["waiting"] == \
        items[waiting[5]]["waiting"]

    assert cli("resume", "fake/main").code == 0
    for request_id in waiting:
        body = zuul.wait(request_id, 30) or {}
        assert body.get("state") == "fulfilled", body
        assert "waiting_reasons" not in body, body
    wait_for(lambda: published_queued(kazoo_client, me) == 0, 30,
             message="requests_queued back to 0")


def test_a_request_held_at_quota_and_one_behind_it(launchers: LauncherFactory,
                                                   zuul: ZuulClient, cli: Cli,
                                                   kazoo_client: KazooClient) -> None:
    launcher = launchers(small_pool(1), settings=SETTINGS)
    me = pool_id(launcher)
    first = zuul.submit(["small"])
    assert (zuul.wait(first) or {}).get("state") == "fulfilled"
    nodeset = zuul.accept(first)
    zuul.use(nodeset)

    held = zuul.submit(["small"])
    wait_for(lambda: waiting_reasons(zuul, held).get(me, {}).get("reason")
             == "WaitingForQuota", message="the held request to say it waits for quota")
    assert (zuul.get_request(held) or {}).get("state") == "pending"
    behind = zuul.submit(["small"])
    wait_for(lambda: published_queued(kazoo_client, me) == 2, 30,
             message="both requests counted as queued")
    # Nothing is written on `behind` (a pause for capacity passes by itself); the CLI
    # says why from the pool's registration.
    assert waiting_reasons(zuul, behind) == {}
    items = {i["id"]: i for i in cli("request-list", "--json").json()}
    assert items[held]["waiting"][me].startswith("WaitingForQuota: ")
    assert items[behind]["waiting"][me].startswith("PoolWaiting: ")

    # One node at a time: each request's node is used and returned for the next one.
    for request_id in (held, behind):
        zuul.release(nodeset)
        body = zuul.wait(request_id, 30) or {}
        assert body.get("state") == "fulfilled", body
        assert "waiting_reasons" not in body, body
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
    zuul.release(nodeset)


def test_no_pool_serves_the_label(zuul: ZuulClient, cli: Cli) -> None:
    # No launcher runs: nothing is registered, nothing can serve it.
    request_id = zuul.submit(["small", "large"])
    (item,) = cli("request-list", "--json").json()
    assert item["id"] == request_id and AGE.match(item["age"])
    assert item["waiting"] == {
        "*": "NoPoolServesLabel: no registered pool serves large, small"}
    shown = cli("show", request_id)
    assert shown.code == 0 and "NoPoolServesLabel" in shown.out
    assert "(every pool)" in shown.out


def test_show_refuses_what_is_no_id(cli: Cli) -> None:
    for bad in ("100-../x", "abc", "1-2", "100-"):
        with pytest.raises(SystemExit) as exit_info:
            cli("show", bad)
        assert exit_info.value.code == 2, bad
    result = cli("show", "100-0000000042")
    assert result.code == 1 and "request 100-0000000042 not found" in result.err


TENANT_LIMITED = """
labels:
  - name: small
tenant-resource-limits:
  - tenant-name: limited
    max-servers: 1
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            type: namespace
      - name: two
        max-servers: 10
        labels:
          - name: small
            type: namespace
"""


def test_a_tenant_at_its_limit(launchers: LauncherFactory, zuul: ZuulClient, cli: Cli,
                               kazoo_client: KazooClient) -> None:
    launcher = launchers(TENANT_LIMITED, settings=SETTINGS)
    pools = {w.ref.pool: w.id for w in launcher.pool_workers.values()}
    first = zuul.submit(["small"], tenant_name="limited")
    assert (zuul.wait(first) or {}).get("state") == "fulfilled"
    second = zuul.submit(["small"], tenant_name="limited")
    # The tenant's limit binds in both pools: each says so, and counts it as queued.
    wait_for(lambda: {p: e.get("reason") for p, e in waiting_reasons(zuul, second).items()}
             == {pools["main"]: "TenantAtLimit", pools["two"]: "TenantAtLimit"},
             30, message="both pools to say the tenant is at its limit")
    for pool in ("main", "two"):
        wait_for(lambda: published_queued(kazoo_client, pools[pool]) == 1, 30,
                 message=f"pool {pool} to count the request as queued")
    assert "limited" in waiting_reasons(zuul, second)[pools["main"]]["message"]
    items = {i["id"]: i for i in cli("request-list", "--json").json()}
    assert items[second]["waiting"][pools["two"]].startswith("TenantAtLimit: tenant limited")

    nodeset = zuul.accept(first)
    zuul.use(nodeset)
    zuul.release(nodeset)
    body = zuul.wait(second, 30) or {}
    assert body.get("state") == "fulfilled" and "waiting_reasons" not in body, body
