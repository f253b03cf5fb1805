"""The launcher's own credentials changing under a running provider.

Aspects:
- an exec plugin's token close to its expiry is renewed by the official client before each
  request (its `refresh_api_key_hook`), through our per-provider Configuration: calls and
  watches stay authenticated, no request goes out with the stale token; threads that meet
  an expired token together run the (slow) plugin once, not once each;
- a static kubeconfig token the server stops accepting (rotated) is replaced from the
  rewritten kubeconfig after the first 401, and the launch succeeds;
- an exec token refused before its expiry (revoked) is replaced by running the plugin once
  more, and the launch succeeds;
- in-cluster (no kubeconfig; the service account's `token` and `ca.crt`): a token file the
  kubelet rotated is read again after the first 401, and the launch succeeds;
- credentials the server keeps refusing: the launch raises ProviderUnavailable (reason
  Unauthorized: a TemporaryError, never a LaunchError), leaves nothing in the cluster, the
  kubeconfig is loaded again at most once per `credentials-backoff` step (on a ManualClock),
  one ERROR names the provider and the context, the provider's credentials condition says
  Rejected; once the plugin hands out a good token the next due reload heals it (one INFO,
  condition Accepted);
- the shared watches survive it: a watch that reconnects with a refused token gets the
  rewritten kubeconfig and sees new objects again, without a WARNING per round;
- a 403 is unchanged: Forbidden, not retried, no reload;
- a rewritten kubeconfig that names another server (or CA, or turns TLS verification off)
  is not followed by a running provider: refused as before, the condition says why, and
  `reload_credentials` answers False (the launcher replaces the provider then);
- the reload policy's steps and what counts as a change of trust (pure);
- a reload that yields no credential (the exec plugin fails) keeps the current one, and the
  condition says why.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client as k8s

from nodepool_k8s.core import errors as exceptions
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.credentials import (ReloadPolicy, credential_problem,
                                                        trust_change)
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider
from nodepool_k8s.core.errors import LaunchError, TemporaryError
from nodepool_k8s.dev.simulator import Simulator
from tests.credentials import ExecPlugin
from tests.helpers import Signal
from tests.kubernetes.conftest import FAST, ProviderFactory, watching
from tests.kubernetes.factories import make_label, make_provider, make_spec

NS = make_label("k8s-namespace", "namespace", boot_timeout=60)
OURS = "nodepool_provider_name=kubespray"
LOGGER = "nodepool_k8s"


def _launch(provider: KubernetesProvider, node_id: str = "0000000000") -> Any:
    return provider.launch(make_spec(provider.config, "k8s-namespace", node_id=node_id),
                           threading.Event())


def _refused(provider: KubernetesProvider, node_id: str = "0000000000") -> TemporaryError:
    """Launch while the credentials are refused: what it raises (never a LaunchError)."""
    with pytest.raises(TemporaryError) as info:
        _launch(provider, node_id)
    assert isinstance(info.value, exceptions.ProviderUnavailable), repr(info.value)
    assert info.value.reason == "Unauthorized"
    return info.value


def _errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith(LOGGER) and r.levelno >= logging.ERROR]


def _streaming(provider: KubernetesProvider) -> Any:
    """Wait until both shared watches stream and stop the API probe: from then on only the
    test's own calls send requests. Returns the provider's client.

    The probe (GET /version) is a request like any other: with a refused token a real API
    server answers it 401 too, so a probe sent beside a test's call would be a second
    refused request, and these tests count them."""
    client, pods = provider._connected()
    with watching(provider) as changes:
        changes.until(lambda: pods.watches and provider._namespace_watch().watches,
                      message="both watches to stream")
    probe = provider._probe
    assert probe is not None
    probe.stop()
    probe._thread.join(30)
    assert not probe._thread.is_alive()
    return client


def _exec_provider(sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
                   expires_in: int, **kw: Any) -> tuple[ExecPlugin, str, KubernetesProvider]:
    """A provider whose kubeconfig user is an exec plugin handing out a fresh admin token
    that expires in `expires_in` seconds, once both its watches stream."""
    plugin = ExecPlugin(tmp_path / "plugin")
    token = sim.issue_admin_token()
    plugin.hand_out(token, expires_in=expires_in)
    provider = make_k8s_provider(sim, NS, kubeconfig=plugin.write_kubeconfig(
        sim, tmp_path / "kubeconfig"), **kw)
    _streaming(provider)
    return plugin, token, provider


def _admin(sim: Simulator, tmp_path: Path) -> k8s.CoreV1Api:
    """The test's own admin client, with the admin token valid now."""
    path = sim.write_kubeconfig(tmp_path / "admin-now", context="sim",
                                token=sim.admin_token)
    return k8s.CoreV1Api(kubernetes.config.new_client_from_config(config_file=path,
                                                                  context="sim"))


# -- what the official client already does ------------------------------------------------------

def test_exec_token_near_expiry_is_renewed_before_each_request(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path) -> None:
    # Inside the client's 5 minutes of skew: it runs the plugin again before every request.
    plugin, first, provider = _exec_provider(sim, make_k8s_provider, tmp_path, 120)
    runs = plugin.runs
    assert runs >= 3  # the load, then the watches' lists and watches

    plugin.hand_out(sim.issue_admin_token(), expires_in=120)
    sim.revoke_token(first)
    result = _launch(provider)
    assert result.external_id == "main-0000000000"
    assert plugin.runs > runs  # the hook ran the plugin for the launch's calls
    assert sim.rejected_requests == 0  # no request went out with the revoked token


def test_threads_meeting_an_expired_exec_token_run_the_plugin_once(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path) -> None:
    plugin = ExecPlugin(tmp_path / "plugin", delay=0.5)
    plugin.hand_out(sim.issue_admin_token(), expires_in=120)  # renewed before each request
    provider = make_k8s_provider(sim, NS, kubeconfig=plugin.write_kubeconfig(
        sim, tmp_path / "kubeconfig"))
    client = _streaming(provider)
    plugin.hand_out(sim.issue_admin_token(), expires_in=3600)
    runs = plugin.runs
    threads = [threading.Thread(target=client.call,
                                args=("list namespaces", client.core.list_namespace))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert plugin.runs == runs + 1  # the first renewed it; the others found it renewed


# -- a 401: load the credentials again, once, and carry on --------------------------------------

def test_rotated_kubeconfig_token_is_loaded_after_the_first_401(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim",
                                      token=sim.admin_token)
    provider = make_k8s_provider(sim, NS, kubeconfig=kubeconfig)
    _streaming(provider)
    # The operator rotates the token and writes the kubeconfig; the old token is refused.
    new = sim.rotate_admin_token()
    sim.write_kubeconfig(kubeconfig, context="sim", token=new)

    result = _launch(provider)
    assert result.external_id == "main-0000000000"
    assert sim.rejected_requests == 1  # the one call that found out
    assert not _errors(caplog)  # healed at once: nothing for an operator to do
    assert provider.credentials_condition()["reason"] == "Accepted"


def test_exec_token_refused_before_its_expiry_runs_the_plugin_again(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path) -> None:
    # An hour: the client sees no reason to renew it.
    plugin, first, provider = _exec_provider(sim, make_k8s_provider, tmp_path, 3600)
    runs = plugin.runs

    plugin.hand_out(sim.issue_admin_token(), expires_in=3600)
    sim.revoke_token(first)
    result = _launch(provider)
    assert result.external_id == "main-0000000000"
    assert plugin.runs == runs + 1


def test_in_cluster_token_rotated_by_the_kubelet_is_read_again(
        sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sim.ca_pem is not None
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_text(sim.ca_pem)
    first = sim.issue_admin_token()
    (account / "token").write_text(first)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(sim.port))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))  # so: in-cluster
    provider = KubernetesProvider(
        make_provider(NS, context=None), kubeconfig=None,
        settings=dataclasses.replace(FAST, service_account=str(account)))
    try:
        provider.start()
        with watching(provider) as changes:
            changes.until(provider.watches_synced, message="the provider's watches to sync")
        _streaming(provider)
        assert "in-cluster" in provider.credentials_condition()["message"]
        # The kubelet writes a fresh token; the old one is refused from now on.
        (account / "token").write_text(sim.issue_admin_token())
        sim.revoke_token(first)
        result = _launch(provider)
        assert result.external_id == "main-0000000000"
        assert sim.rejected_requests == 1, sim.rejected_log
    finally:
        provider.stop()


def test_refused_credentials_leave_the_launch_waiting_and_reload_on_a_backoff(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    clock = ManualClock()
    plugin = ExecPlugin(tmp_path / "plugin")
    token = sim.issue_admin_token()
    plugin.hand_out(token, expires_in=3600)
    provider = make_k8s_provider(sim, NS, clock=clock, credentials_backoff=(30.0, 60.0),
                                 kubeconfig=plugin.write_kubeconfig(
                                     sim, tmp_path / "kubeconfig"))
    _streaming(provider)
    runs = plugin.runs
    sim.revoke_token(token)  # and the plugin keeps handing out that token

    error = _refused(provider, "0000000001")
    assert "kubespray" in str(error) and "sim" in str(error)
    assert plugin.runs == runs + 1  # reloaded once, still refused
    for node in range(2, 6):  # within the backoff: no reload, no call beyond the first
        _refused(provider, f"000000000{node}")
    assert plugin.runs == runs + 1
    assert sim.list("namespaces", label_selector=OURS) == []
    condition = provider.credentials_condition()
    assert (condition["status"], condition["reason"]) == ("False", "Rejected")
    assert "sim" in condition["message"]

    clock.advance(30.0)
    _refused(provider, "0000000006")
    assert plugin.runs == runs + 2  # the backoff's first step has passed: one more reload

    plugin.hand_out(sim.issue_admin_token(), expires_in=3600)  # the operator fixes it
    clock.advance(30.0)
    _refused(provider, "0000000007")  # the second step (60 s) has not passed yet
    assert plugin.runs == runs + 2
    clock.advance(30.0)
    result = _launch(provider, "0000000008")
    assert result.external_id == "main-0000000008"
    assert plugin.runs == runs + 3

    errors = _errors(caplog)
    assert len(errors) == 1, [r.getMessage() for r in errors]  # once, not per call
    assert "kubespray" in errors[0].getMessage() and "sim" in errors[0].getMessage()
    assert any("accepts the launcher's credentials again" in r.getMessage()
               for r in caplog.records if r.levelno == logging.INFO)
    assert provider.credentials_condition()["reason"] == "Accepted"


def test_watches_reconnect_with_the_rewritten_kubeconfig(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, changes: Signal) -> None:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim",
                                      token=sim.admin_token)
    provider = make_k8s_provider(sim, NS, kubeconfig=kubeconfig)
    # The file first, then the server: a request refused in between would find the old
    # file and rightly warn (the credentials did not change), which is not this test's point.
    new = "rotated-" + secrets.token_hex(16)
    sim.write_kubeconfig(kubeconfig, context="sim", token=new)
    sim.rotate_admin_token(new)
    sim.end_watches()  # every watch must connect again, with what it holds: refused

    labels = {manifests.PROVIDER_LABEL: "kubespray",
              manifests.INSTALLATION_LABEL: provider.installation_id,
              manifests.NODE_ID_LABEL: "0000000042"}
    _admin(sim, tmp_path).create_namespace(
        {"metadata": {"name": "main-0000000042", "labels": labels}})
    changes.until(lambda: provider._namespace_watch().get("", "main-0000000042"), 30,
                  message="the namespace watch to see the new namespace")
    assert sim.rejected_requests >= 1
    warnings = [r for r in caplog.records if r.name.startswith(LOGGER)
                and r.levelno >= logging.WARNING]
    assert not warnings, [r.getMessage() for r in warnings]


# -- what does not change -----------------------------------------------------------------------

def test_403_stays_a_permission_problem(sim: Simulator, make_k8s_provider: ProviderFactory,
                                        tmp_path: Path) -> None:
    plugin, _, provider = _exec_provider(sim, make_k8s_provider, tmp_path, 3600)
    runs = plugin.runs
    sim.fail_next("create", "namespaces", code=403)
    with pytest.raises(LaunchError) as info:
        _launch(provider)
    assert (info.value.reason, info.value.retryable) == ("Forbidden", False)
    assert sim.counters["create namespaces"] == 1
    assert plugin.runs == runs  # no reload for a permission problem


def test_a_reload_without_credentials_keeps_the_current_ones(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path) -> None:
    plugin, token, provider = _exec_provider(sim, make_k8s_provider, tmp_path, 3600)
    configuration = provider._connected()[0].configuration
    before = dict(configuration.api_key)
    plugin.credential.unlink()  # the plugin now fails (exit status 1)
    sim.revoke_token(token)

    _refused(provider)
    # A fresh load without the plugin's token would have sent requests anonymously (a real
    # cluster answers those with 403, a permission problem that fails launches).
    assert configuration.api_key == before
    condition = provider.credentials_condition()
    assert condition["reason"] == "Rejected" and "no credential" in condition["message"]


def test_a_kubeconfig_naming_another_server_is_not_followed_in_place(
        sim: Simulator, make_sim: Any, make_k8s_provider: ProviderFactory,
        tmp_path: Path) -> None:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim",
                                      token=sim.admin_token)
    provider = make_k8s_provider(sim, NS, kubeconfig=kubeconfig)
    _streaming(provider)
    other = make_sim()
    other.write_kubeconfig(kubeconfig, context="sim", token=other.admin_token)
    sim.rotate_admin_token()

    _refused(provider)  # another server (and CA): never switched to behind our back
    assert other.counters.get("total", 0) == 0
    condition = provider.credentials_condition()
    assert condition["reason"] == "Rejected" and "another host" in condition["message"]
    assert provider.reload_credentials() is False  # the launcher replaces the provider


# -- the pure parts -----------------------------------------------------------------------------

def test_reload_policy_steps() -> None:
    policy = ReloadPolicy((1.0, 5.0, 60.0))
    assert [policy.wait_after(n) for n in (1, 2, 3, 4, 100)] == [1.0, 5.0, 60.0, 60.0, 60.0]
    assert ReloadPolicy(()).wait_after(1) == 0.0


def test_trust_changes_are_named() -> None:
    def configuration(**fields: Any) -> k8s.Configuration:
        found = k8s.Configuration()
        found.host, found.ssl_ca_cert = "https://api:6443", "/ca.pem"
        for name, value in fields.items():
            setattr(found, name, value)
        return found
    live = configuration()
    assert trust_change(live, configuration(api_key={"BearerToken": "Bearer new"})) is None
    assert trust_change(live, configuration(cert_file="/new.pem")) is None
    assert "host" in (trust_change(live, configuration(host="https://other:6443")) or "")
    assert "verify_ssl" in (trust_change(live, configuration(verify_ssl=False)) or "")
    assert "ssl_ca_cert" in (trust_change(live, configuration(ssl_ca_cert="/b.pem")) or "")
    assert credential_problem(configuration()) is not None
    assert credential_problem(configuration(api_key={"BearerToken": "Bearer x"})) is None
