"""A kubeconfig exec credential plugin that hangs, with `credentials-exec-timeout`.

Aspects: the plugin's run is killed (its process, and what it started) once the timeout
has passed, and that load of the credentials fails: the provider's launch then fails with
the typed temporary `ProviderUnavailable` (Unauthorized: the request waits), and an
operator's reload of its credentials returns, keeping the current ones. Meanwhile another
provider of the same cluster keeps serving. The plugin keeps its own arguments,
environment and working directory under the limit.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from nodepool_k8s.core import errors
from nodepool_k8s.dev.simulator import Simulator
from tests.credentials import ExecPlugin
from tests.helpers import wait_for
from tests.kubernetes.conftest import ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

NS = make_label("k8s-namespace", "namespace", boot_timeout=60)
# Generous: the test waits on outcomes, never on how long they took.
DEADLINE = 30.0


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class Outcome:
    """`fn()` on a thread of its own: what it returned or raised, once it is done."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                self.error = exc
            finally:
                self.done.set()
        threading.Thread(target=run, daemon=True).start()

    def wait(self, what: str) -> "Outcome":
        assert self.done.wait(DEADLINE), f"{what} did not return within {DEADLINE}s"
        return self


def _launch(provider: Any, node_id: str) -> Any:
    return provider.launch(make_spec(provider.config, "k8s-namespace", node_id=node_id),
                           threading.Event())


def test_hanging_plugin_is_killed_and_only_its_provider_waits(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    token = sim.issue_admin_token()
    plugin.hand_out(token, expires_in=3600)
    hanging = make_k8s_provider(sim, NS, name="exec", credentials_exec_timeout=1.0,
                                kubeconfig=plugin.write_kubeconfig(sim, tmp_path / "kc"))
    other = make_k8s_provider(sim, NS, name="other")
    try:
        plugin.hand_out(sim.issue_admin_token(), expires_in=3600)  # valid, once it runs
        plugin.hang(True)
        sim.revoke_token(token)  # the next request is refused: the plugin must run

        refused = Outcome(lambda: _launch(hanging, "0000000001"))
        served = Outcome(lambda: _launch(other, "0000000002")).wait("the other launch")
        assert served.error is None, served.error
        assert served.result.external_id == "main-0000000002"

        refused.wait("the launch whose plugin hangs")
        assert isinstance(refused.error, errors.ProviderUnavailable), refused.error
        assert refused.error.reason == "Unauthorized"
        assert any("did not finish within 1s" in r.getMessage() for r in caplog.records)
        pids = plugin.hanging_pids
        assert pids
        wait_for(lambda: not any(_running(pid) for pid in pids), DEADLINE,
                 message="the hanging plugin runs to be killed")

        # The operator's reload returns too, keeping the current (refused) credentials.
        reloaded = Outcome(hanging.reload_credentials).wait("the credentials reload")
        assert reloaded.error is None and reloaded.result is True
    finally:
        plugin.hang(False)


def test_plugin_keeps_its_arguments_environment_and_directory(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path) -> None:
    plugin = ExecPlugin(tmp_path / "plugin")
    plugin.hand_out(sim.issue_admin_token(), expires_in=3600)
    seen = tmp_path / "seen"
    script = tmp_path / "kc-dir" / "wrapper"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n"
                      f"printf '%s|%s|%s' \"$1\" \"$PLUGIN_GREETING\" \"$PWD\" > '{seen}'\n"
                      f"exec '{plugin.script}'\n")
    script.chmod(0o755)
    user = {"exec": {**plugin.user()["exec"], "command": "./wrapper", "args": ["first arg"],
                     "env": [{"name": "PLUGIN_GREETING", "value": "hello"}]}}
    kubeconfig = sim.write_kubeconfig(script.parent / "kubeconfig", user=user)
    provider = make_k8s_provider(sim, NS, name="exec", kubeconfig=kubeconfig)
    assert _launch(provider, "0000000003").external_id == "main-0000000003"
    assert seen.read_text() == f"first arg|hello|{os.path.realpath(script.parent)}"
