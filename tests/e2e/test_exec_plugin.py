"""A provider whose exec credential plugin hangs holds up neither a reload nor the other
providers, end to end.

Aspects: two providers of one launcher, one with the admin token, one whose kubeconfig user
is an exec plugin (a long `credentials-exec-timeout`, so the plugin is still hanging while
the test looks). When the plugin hangs, the operator's reload (what SIGHUP with an
unchanged file does, and a reload with a changed file) returns while the plugin still
runs, a second reload does not start a second run, and the other provider fulfils a
request meanwhile. Once the plugin answers, the reading ends.
"""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import pytest
import yaml

from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.credentials import ExecPlugin
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory, make_config

CONFIG = """
labels:
  - name: ns
  - name: ns-exec
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    api-backoff: [0.01]
    pools:
      - name: main
        max-servers: {max_servers}
        labels:
          - name: ns
            type: namespace
  - name: k8s-exec
    driver: kubernetes
    context: sim-exec
    api-backoff: [0.01]
    credentials-exec-timeout: 300
    pools:
      - name: main
        labels:
          - name: ns-exec
            type: namespace
"""
DEADLINE = 30.0


def _returns(fn: "object", what: str) -> None:
    done = threading.Event()

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        finally:
            done.set()
    threading.Thread(target=run, daemon=True).start()
    assert done.wait(DEADLINE), f"{what} did not return within {DEADLINE}s"


def test_hanging_plugin_blocks_no_reload_and_no_other_provider(
        launchers: LauncherFactory, zk: ZkConnection, zuul: ZuulClient, k8s_sim: Simulator,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.hand_out(k8s_sim.issue_admin_token(), expires_in=3600)
    document = k8s_sim.kubeconfig("sim")
    exec_part = k8s_sim.kubeconfig("sim-exec", user=plugin.user())
    for key in ("clusters", "users", "contexts"):
        document[key] += exec_part[key]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(document))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))

    launcher: Launcher = launchers(textwrap.dedent(CONFIG.format(max_servers=10)))
    runs = plugin.runs
    assert runs >= 1
    plugin.hang(True)
    try:
        _returns(launcher.refresh_credentials, "a reload with an unchanged configuration")
        wait_for(lambda: plugin.hanging_pids, DEADLINE, message="the plugin to hang")
        reading = [t for t in threading.enumerate() if t.name == "credentials-k8s-exec"]
        assert reading and reading[0].is_alive()  # still hanging: nobody waited for it

        # A changed configuration (of the other provider) applies; the exec provider is
        # kept, and its hanging run is not started a second time.
        changed = make_config(zk, textwrap.dedent(CONFIG.format(max_servers=9)))
        _returns(lambda: launcher.reload(changed), "a reload with a changed configuration")
        assert launcher.config.providers["k8s"].pools["main"].max_servers == 9
        assert plugin.runs == runs + 1

        request_id = zuul.submit(["ns"])
        body = zuul.wait(request_id, DEADLINE)
        assert body is not None and body["state"] == "fulfilled", body
    finally:
        plugin.hang(False)
    wait_for(lambda: not any(t.name == "credentials-k8s-exec" and t.is_alive()
                             for t in threading.enumerate()), DEADLINE,
             message="the credentials reading to end")
