"""The pools' `ApiReachable` condition follows the API server, end to end.

Aspects:
- the API server goes away (`stop_serving`): the pool's published `ApiReachable` turns
  False with reason `Unreachable` within a bounded wait, an `api-unreachable` event is
  logged; it comes back (`resume_serving`): True (`Reachable`) again, `api-reachable`
  logged, and a request is fulfilled; capacity awareness being off reads `Disabled`,
  neutral, all along;
- the cluster's CA is rotated (`rotate_ca`): the condition turns False with reason
  `TLSUntrusted`; once the operator writes the new CA into the kubeconfig, the running
  provider (the same instance: no reload, no SIGHUP) trusts it, the condition turns True
  and a request is fulfilled.
"""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.views import pools as pool_view
from nodepool_k8s.zk import events as zk_events
from tests.e2e.util import finish
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: ns
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 1
    api-retries: 1
    api-backoff: [0.05]
    api-probe-interval: 0.2
    api-probe-connect-timeout: 2
    api-probe-read-timeout: 2
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: ns
            type: namespace
"""


def condition(launcher: Launcher, ctype: str) -> dict[str, Any]:
    records = [r for r in launcher.engine.pool_statuses.items().values()
               if r.get("pool") == "main"]
    found = [c for c in (records[0].get("conditions") or [] if records else [])
             if c["type"] == ctype]
    return found[0] if found else {}


def reads(launcher: Launcher, status: str, reason: str) -> bool:
    c = condition(launcher, "ApiReachable")
    return (c.get("status"), c.get("reason")) == (status, reason)


def api_events(launcher: Launcher) -> list[tuple[str, str | None]]:
    return [(e["kind"], e.get("reason")) for e in zk_events.read_events(launcher.zk)
            if e["kind"] in (zk_events.API_UNREACHABLE, zk_events.API_REACHABLE)
            and e.get("provider") == "k8s" and e.get("pool") == "main"]


def fulfil_and_finish(zuul: ZuulClient, k8s_sim: Simulator,
                      kazoo_client: KazooClient) -> None:
    request_id = zuul.submit(["ns"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    finish(zuul, request_id, k8s_sim, kazoo_client)


def test_an_api_outage_turns_the_condition_false_and_back(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    launcher = launchers(CONFIG)
    wait_for(lambda: reads(launcher, "True", "Reachable"), 30,
             message="the pool to report its API server reachable")
    capacity = condition(launcher, "Capacity")
    assert (capacity["status"], capacity["reason"], capacity["neutral"]) \
        == ("Unknown", "Disabled", True), capacity
    assert not condition(launcher, "ApiReachable")["neutral"]

    k8s_sim.stop_serving()
    wait_for(lambda: reads(launcher, "False", "Unreachable"), 30,
             message="the pool to report its API server unreachable")
    # The first to notice may be the probe (refused) or a watch cut mid-stream; a later
    # message alone changes no condition, so the pool need not publish it again.
    message = condition(launcher, "ApiReachable")["message"].lower()
    assert any(word in message for word in ("refused", "reset", "closed", "aborted",
                                            "broken", "connection")), message
    rows = pool_view.pool_rows(launcher.engine.pool_statuses.items().values())
    assert rows[0]["api_reachable"] == "Unreachable", rows
    wait_for(lambda: api_events(launcher) == [(zk_events.API_UNREACHABLE, "Unreachable")],
             30, message="an api-unreachable event")

    k8s_sim.resume_serving()
    wait_for(lambda: reads(launcher, "True", "Reachable"), 30,
             message="the pool to report its API server reachable again")
    wait_for(lambda: api_events(launcher)[-1:] == [(zk_events.API_REACHABLE, "Reachable")],
             30, message="an api-reachable event")
    fulfil_and_finish(zuul, k8s_sim, kazoo_client)


def test_a_rotated_ca_is_followed_without_a_reload(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    launcher = launchers(CONFIG)
    provider = launcher.providers["k8s"]
    wait_for(lambda: reads(launcher, "True", "Reachable"), 30,
             message="the pool to report its API server reachable")

    k8s_sim.rotate_ca()  # the kubeconfig still holds the old CA
    wait_for(lambda: reads(launcher, "False", "TLSUntrusted"), 30,
             message="the pool to report the server's certificate untrusted")
    assert "CERTIFICATE_VERIFY_FAILED" in condition(launcher, "ApiReachable")["message"]

    assert k8s_sim.kubeconfig_path is not None
    k8s_sim.write_kubeconfig(k8s_sim.kubeconfig_path, context="sim")  # the new CA
    wait_for(lambda: reads(launcher, "True", "Reachable"), 30,
             message="the pool to report its API server reachable with the new CA")
    assert launcher.providers["k8s"] is provider  # followed in place, not replaced
    fulfil_and_finish(zuul, k8s_sim, kazoo_client)
