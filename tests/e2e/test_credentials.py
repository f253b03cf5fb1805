"""The launcher's Kubernetes credentials going stale while it runs, end to end.

Aspects:
- the API server stops accepting the launcher's token (rotated; `$KUBECONFIG` not yet
  rewritten): a request waits instead of failing, no launch counts toward the label's
  circuit breaker, the pool's published status shows `Credentials: Rejected` naming the
  context, one ERROR is logged; once the operator rewrites the kubeconfig the next reload
  picks it up, the request is fulfilled, the condition turns `Accepted`, nothing is left;
- `SIGHUP` with an unchanged nodepool.yaml (a `LauncherService` in this process, its
  reload requested as the signal relay does) reads the kubeconfig again: a token rotated
  ahead of time is in use before the old one is revoked, so no request is ever refused;
- `SIGHUP` after the kubeconfig was pointed at another cluster replaces the provider (a
  running one never switches servers in place): the next node is made there.
"""

from __future__ import annotations

import logging
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.config.loader import load_config
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.service import LauncherService
from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import finish
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory

CONFIG = """
labels:
  - name: ns
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 3
    api-retries: 1
    api-backoff: [0.01]
    credentials-backoff: [0.2]
    pools:
      - name: main
        max-servers: 10
        breaker-threshold: 2
        labels:
          - name: ns
            type: namespace
"""


def pool_record(launcher: Launcher) -> dict[str, Any] | None:
    records = [r for r in launcher.engine.pool_statuses.items().values()
               if r.get("pool") == "main"]
    return records[0] if records else None


def credentials(launcher: Launcher) -> dict[str, Any] | None:
    record = pool_record(launcher)
    found = [c for c in (record or {}).get("conditions") or [] if c["type"] == "Credentials"]
    return found[0] if found else None


def state(zuul: ZuulClient, request_id: str) -> str | None:
    body = zuul.get_request(request_id)
    return body["state"] if body else None


def test_refused_credentials_keep_the_request_waiting(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nodepool_k8s")
    launcher = launchers(CONFIG)
    assert k8s_sim.kubeconfig_path is not None
    k8s_sim.rotate_admin_token()  # $KUBECONFIG still holds the old, now refused, token

    request_id = zuul.submit(["ns"])
    wait_for(lambda: state(zuul, request_id) == "failed"
             or (credentials(launcher) or {}).get("reason") == "Rejected", 30,
             message="the request to fail or the pool to report the credentials")
    assert state(zuul, request_id) in ("requested", "pending")
    condition = credentials(launcher)
    assert condition is not None and condition["status"] == "False", condition
    assert "context sim" in condition["message"], condition
    # Let several launches meet the refusal: none may count against the label.
    wait_for(lambda: k8s_sim.rejected_requests >= 4, 30, message="a few refused calls")
    assert state(zuul, request_id) in ("requested", "pending")
    record = pool_record(launcher)
    assert record is not None and record["suspended"] == {}, record
    assert not launcher.engine.breakers.get("k8s.main"), launcher.engine.breakers.items()

    # The operator writes the new token into the kubeconfig; the next reload takes it.
    k8s_sim.write_kubeconfig(k8s_sim.kubeconfig_path, context="sim")
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    wait_for(lambda: (credentials(launcher) or {}).get("reason") == "Accepted", 30,
             message="the pool to report the credentials accepted again")
    errors = [r.getMessage() for r in caplog.records
              if r.name.startswith("nodepool_k8s") and r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "k8s" in errors[0] and "sim" in errors[0], errors
    finish(zuul, request_id, k8s_sim, kazoo_client)


class Service:
    """A LauncherService running on a thread of this process."""

    def __init__(self, path: Path) -> None:
        self.service = LauncherService(str(path), None, load_config(str(path)),
                                       settings=TEST_SETTINGS, webapp=False,
                                       poll_interval=0.1)
        self.status: list[int] = []
        self.thread = threading.Thread(target=lambda: self.status.append(self.service.run()),
                                       name="test-service")
        self.thread.start()

    def stop(self) -> None:
        self.service.request_stop()
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_sighup_reads_the_kubeconfig_again(
        zk: ZkConnection, zuul: ZuulClient, k8s_sim: Simulator, kazoo_client: KazooClient,
        tmp_path: Path) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + "zookeeper-timeout: 5.0\n" + textwrap.dedent(CONFIG))
    service = Service(path)
    try:
        wait_for(lambda: service.service.launcher.ready, 30, message="the launcher to serve")
        assert k8s_sim.kubeconfig_path is not None
        # Rotated ahead of time: the new token is valid, the old one still is too.
        new = k8s_sim.issue_admin_token()
        k8s_sim.write_kubeconfig(k8s_sim.kubeconfig_path, context="sim", token=new)
        reloads = service.service.reloads
        service.service.request_reload()  # what SIGHUP does
        wait_for(lambda: service.service.reloads > reloads, 30, message="the reload")
        k8s_sim.rotate_admin_token()  # the old token is refused from now on

        request_id = zuul.submit(["ns"])
        body = zuul.wait(request_id, 30)
        assert body is not None and body["state"] == "fulfilled", body
        # The reload switched before any refusal: everything the launch sent (it was
        # submitted after the reload) used the new token. A background read already on its
        # way when the token was rotated may still carry the old one, as it may against a
        # real API server; none of the launch's writes may.
        namespace = f"main-{body['nodes'][0]}"
        assert [r for r in k8s_sim.rejected_log
                if r[0] != "GET" or namespace in r[1]] == []
        finish(zuul, request_id, k8s_sim, kazoo_client)
    finally:
        service.stop()


def test_sighup_follows_a_kubeconfig_naming_another_cluster(
        zk: ZkConnection, zuul: ZuulClient, k8s_sim: Simulator, kazoo_client: KazooClient,
        tmp_path: Path) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(zk.config_yaml() + "zookeeper-timeout: 5.0\n" + textwrap.dedent(CONFIG))
    other = Simulator(SimulatorConfig(tls=True)).start()
    service = Service(path)
    try:
        wait_for(lambda: service.service.launcher.ready, 30, message="the launcher to serve")
        assert k8s_sim.kubeconfig_path is not None
        other.write_kubeconfig(k8s_sim.kubeconfig_path, context="sim")
        reloads = service.service.reloads
        service.service.request_reload()  # what SIGHUP does
        wait_for(lambda: service.service.reloads > reloads, 30, message="the reload")

        request_id = zuul.submit(["ns"])
        body = zuul.wait(request_id, 30)
        assert body is not None and body["state"] == "fulfilled", body
        namespace = f"main-{body['nodes'][0]}"
        assert other.get("namespaces", namespace) is not None  # a new provider, on `other`
        assert k8s_sim.get("namespaces", namespace) is None
        finish(zuul, request_id, other, kazoo_client)
    finally:
        service.stop()
        other.stop()
