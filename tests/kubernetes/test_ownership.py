"""Ownership before every delete, and bound TokenRequest tokens, against the simulator.

Aspects: `delete` sends no DELETE for `kube-system`, an unlabelled namespace, another
installation's namespace (same provider name) or another node's namespace, and raises
NotOwned; a DELETE whose uid precondition no longer matches is refused by the API (409) and
deletes nothing; a failed create whose namespace turns out not to be ours is left alone; the
sweep lists only this installation's namespaces. Tokens: TokenRequest with the configured
lifetime (no Secret anywhere), expirationSeconds 599 or 2^32 + 1 is a 422, a token works for
its Role with RBAC enforced and is refused (401) once expired.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.driver.kubernetes.errors import Conflict
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider
from nodepool_k8s.core.errors import LaunchError, NotOwned
from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.kubernetes.conftest import ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

NS = make_label("k8s-namespace", "namespace")


def _admin(sim: Simulator, tmp_path: Any) -> k8s.CoreV1Api:
    path = sim.write_kubeconfig(tmp_path / "admin-kubeconfig")
    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=path,
                                                           persist_config=False))


def _token_api(sim: Simulator, token: str, tmp_path: Any) -> k8s.CoreV1Api:
    path = sim.write_kubeconfig(tmp_path / "token-kubeconfig", token=token)
    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=path,
                                                           persist_config=False))


def _launch(provider: KubernetesProvider, node_id: str = "0000000000") -> Any:
    return provider.launch(make_spec(provider.config, "k8s-namespace", node_id=node_id),
                           threading.Event())


def _status(call: Any) -> int:
    with pytest.raises(ApiException) as info:
        call()
    return int(info.value.status)


# -- delete ------------------------------------------------------------------------------------

def test_delete_refuses_namespaces_that_are_not_ours(make_sim: Any,
                                                     make_k8s_provider: ProviderFactory,
                                                     tmp_path: Any) -> None:
    sim = make_sim(enforce_rbac=True)
    mine = make_k8s_provider(sim, NS, installation_id="inst-a")
    theirs = make_k8s_provider(sim, NS, installation_id="inst-b")  # same provider name
    other_node = _launch(mine, "0000000001").external_id
    foreign = _launch(theirs, "0000000002").external_id
    admin = _admin(sim, tmp_path)
    # Looks like ours by provider label and node id, lacks the installation label.
    admin.create_namespace({"metadata": {"name": "main-0000000003", "labels": {
        "nodepool_provider_name": "kubespray", "nodepool_node_id": "0000000003"}}})
    sim.reset_counters()
    cases = [("kube-system", None), ("kube-system", "0000000009"),
             ("main-0000000003", "0000000003"), (foreign, "0000000002"), (foreign, None),
             (other_node, "0000000007")]
    for name, node_id in cases:
        with pytest.raises(NotOwned) as info:
            mine.delete_and_confirm(name, node_id=node_id)
        assert name in str(info.value)
    assert sim.counters.get("delete namespaces", 0) == 0, sim.counters
    for name in ("kube-system", "main-0000000003", foreign, other_node):
        assert sim.get("namespaces", name) is not None, name
    # The rightful owner still deletes its own (with the node id check passing).
    mine.delete_and_confirm(other_node, node_id="0000000001")
    theirs.delete_and_confirm(foreign, node_id="0000000002")
    assert sim.get("namespaces", other_node) is None and sim.get("namespaces", foreign) is None


@pytest.mark.parametrize("name", ["a" * 200_000, "a" * 64, "../kube-system", "Kube-System",
                                  "kube-system/finalize", "", "-x"])
def test_names_that_are_no_namespace_name_are_refused_without_a_call(
        sim: Simulator, make_k8s_provider: ProviderFactory, name: str) -> None:
    """A record can name anything; a huge name earned a 414 that was retried for ever."""
    provider = make_k8s_provider(sim, NS)
    sim.reset_counters()
    with pytest.raises(NotOwned) as info:
        provider.delete_and_confirm(name, node_id="0000000000")
    assert len(str(info.value)) < 200
    assert provider.ownership_problem(name, "0000000000") is not None
    assert sum(sim.counters.values()) == 0, sim.counters


def test_ownership_problem_before_a_ready_node_is_handed_out(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any, changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    changes.until(lambda: provider._namespace_watch().get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.reset_counters()
    assert provider.ownership_problem(name, "0000000000") is None  # from the watch
    assert "nodepool_node_id" in str(provider.ownership_problem(name, "0000000005"))
    assert "nodepool_provider_name" in str(provider.ownership_problem("kube-system", "0"))
    assert "does not exist" in str(provider.ownership_problem("main-0000000042", "42"))
    reads = sim.counters.get("get namespaces", 0)
    assert reads == 3, sim.counters
    # A refusal is remembered: a forged record costs one look, not one per request.
    for _ in range(3):
        assert provider.ownership_problem("kube-system", "0") is not None
    assert sim.counters.get("get namespaces", 0) == reads


def test_uid_precondition_mismatch_is_not_a_delete(sim: Simulator,
                                                   make_k8s_provider: ProviderFactory,
                                                   tmp_path: Any) -> None:
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    uid = sim.get("namespaces", name)["metadata"]["uid"]  # type: ignore[index]
    admin = _admin(sim, tmp_path)
    # The API itself: a stale uid is a 409 Conflict and the namespace stays.
    stale = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid="not-" + uid))
    assert _status(lambda: admin.delete_namespace(name, body=stale)) == 409
    # The provider's DELETE carries the uid it read: a replaced namespace is not deleted.
    with pytest.raises(Conflict):
        provider._delete_uid(provider._connected()[0], name, "not-" + uid, None)
    now = sim.get("namespaces", name)
    assert now is not None and "deletionTimestamp" not in now["metadata"]
    provider.delete_and_confirm(name, node_id="0000000000")
    assert sim.get("namespaces", name) is None


def test_delete_proves_ownership_from_the_watch_without_a_get(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    changes.until(lambda: provider._namespace_watch().get("", name) is not None,
                  message="the namespace watch to see the namespace")
    sim.reset_counters()
    provider.delete_and_confirm(name, node_id="0000000000")
    assert sim.get("namespaces", name) is None
    assert sim.counters.get("get namespaces", 0) == 0, sim.counters
    assert sim.counters.get("delete namespaces", 0) == 1, sim.counters


def test_a_stale_watch_copy_never_deletes_a_namespace_changed_since(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any, changes: Signal) -> None:
    """The DELETE carries the resourceVersion of the copy that was proven ours: a namespace
    relabelled after that copy was taken (here: the watch stopped, so its copy is as stale
    as a lagging watch's could be) is refused by the API, then judged afresh from a GET."""
    provider = make_k8s_provider(sim, NS)
    name = _launch(provider).external_id
    watch = provider._namespace_watch()
    changes.until(lambda: watch.get("", name) is not None,
                  message="the namespace watch to see the namespace")
    watch.stop()
    admin = _admin(sim, tmp_path)
    admin.patch_namespace(name, {"metadata": {"labels": {"nodepool_installation_id": None}}})
    sim.reset_counters()
    with pytest.raises(NotOwned):
        provider.delete_and_confirm(name, node_id="0000000000")
    now = sim.get("namespaces", name)
    assert now is not None and "deletionTimestamp" not in now["metadata"]
    assert sim.counters.get("get namespaces", 0) == 1, sim.counters


def test_failed_create_leaves_a_namespace_that_is_not_ours(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any) -> None:
    # A namespace of our name exists but is someone else's (our POST gets 409): nothing is
    # deleted; a fresh name is used instead.
    provider = make_k8s_provider(sim, NS, api_timeout=0.3, api_retries=1)
    _admin(sim, tmp_path).create_namespace({"metadata": {"name": "main-0000000000"}})
    sim.reset_counters()
    result = _launch(provider)
    assert result.external_id.startswith("main-0000000000-r")
    assert sim.get("namespaces", "main-0000000000") is not None
    assert sim.counters.get("delete namespaces", 0) == 0


def test_lost_create_answer_then_409_for_a_foreign_namespace(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any) -> None:
    # A retried create meets 409, but the GET shows the namespace is another installation's:
    # it is not taken over (no contents created in it), and not deleted.
    provider = make_k8s_provider(sim, NS, api_timeout=0.3, api_retries=1,
                                 installation_id="inst-a")
    other = make_k8s_provider(sim, NS, installation_id="inst-b")
    sim.fail_next("create", "namespaces", count=1, code=503)  # our first try "fails"...
    # ...while the other installation creates the same name in between.
    _launch(other)
    sim.reset_counters()
    result = _launch(provider)
    assert result.external_id != "main-0000000000"
    assert sim.counters.get("delete namespaces", 0) == 0
    labels = sim.get("namespaces", "main-0000000000")["metadata"]["labels"]  # type: ignore
    assert labels["nodepool_installation_id"] == "inst-b"
    assert sim.list("serviceaccounts", "main-0000000000")[0]["metadata"]["labels"][
        "nodepool_installation_id"] == "inst-b"


def test_list_resources_sees_only_this_installation(sim: Simulator,
                                                    make_k8s_provider: ProviderFactory) -> None:
    a = make_k8s_provider(sim, NS, installation_id="inst-a")
    b = make_k8s_provider(sim, NS, installation_id="inst-b")
    ns_a = _launch(a, "0000000001").external_id
    ns_b = _launch(b, "0000000001").external_id
    assert ns_a != ns_b
    assert [r.external_id for r in a.list_resources()] == [ns_a]
    assert [r.external_id for r in b.list_resources()] == [ns_b]


# -- tokens ------------------------------------------------------------------------------------

def test_tokens_come_from_token_request(make_sim: Any, make_k8s_provider: ProviderFactory,
                                        tmp_path: Any) -> None:
    sim = make_sim(enforce_rbac=True)
    provider = make_k8s_provider(sim, NS, token_lifetime=3600)
    sim.reset_counters()
    result = _launch(provider)
    assert sim.counters.get("create serviceaccounts/token") == 1
    assert not [k for k in sim.counters if "secrets" in k], sim.counters
    assert not [s for s in sim.list("secrets")
                if s.get("type") == "kubernetes.io/service-account-token"]
    assert abs(result.extra["token_expires"] - (time.time() + 3600)) < 120
    token = result.connection_port["token"]
    api = _token_api(sim, token, tmp_path)
    ns = result.external_id
    api.list_namespaced_pod(ns)  # its Role allows it
    assert _status(lambda: api.list_namespaced_pod("default")) == 403
    # Expired: refused outright (401), as on a real cluster.
    sim.authority.now = lambda: time.time() + 3601
    assert _status(lambda: api.list_namespaced_pod(ns)) == 401


def test_token_request_outside_ten_minutes_to_2_32_seconds_is_invalid(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any) -> None:
    provider = make_k8s_provider(sim, NS)
    ns = _launch(provider).external_id
    admin = _admin(sim, tmp_path)
    body = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=599))
    assert _status(lambda: admin.create_namespaced_service_account_token(
        "zuul-worker", ns, body)) == 422
    long = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=2 ** 32 + 1))
    assert _status(lambda: admin.create_namespaced_service_account_token(
        "zuul-worker", ns, long)) == 422
    ok = k8s.AuthenticationV1TokenRequest(
        spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=600))
    answer = admin.create_namespaced_service_account_token("zuul-worker", ns, ok)
    assert answer.status.token and answer.status.expiration_timestamp
    # A provider built around the config check (599) fails the launch for good, and
    # removes its namespace.
    short = make_k8s_provider(sim, NS, name="short", token_lifetime=599)
    with pytest.raises(LaunchError) as info:
        _launch(short, "0000000005")
    assert info.value.reason == "Invalid" and not info.value.retryable
    assert sim.get("namespaces", "main-0000000005") is None


def test_provider_config_installation_reaches_every_object(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, make_label("pod-fedora"), installation_id="inst-z")
    spec = make_spec(provider.config, "pod-fedora")
    result = provider.launch(spec, threading.Event())
    ns = result.external_id
    for kind, name in (("serviceaccounts", "zuul-worker"), ("roles", "zuul-restricted"),
                       ("rolebindings", "zuul-role"), ("pods", "pod-fedora")):
        obj = sim.get(kind, name, ns)
        assert obj is not None and \
            obj["metadata"]["labels"]["nodepool_installation_id"] == "inst-z", kind
