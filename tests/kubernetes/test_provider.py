"""KubernetesProvider against the simulated cluster, through the official client over HTTPS.

Aspects: the LaunchResult/connection data Zuul reads for both label types (token equals the
TokenRequest token of the node's service account with its expiry recorded, no Secret made,
ca_crt only when TLS is verified, pod/host_id for kubectl), objects
created in the cluster (names, labels, RBAC, pod spec per key, form B), API calls per node,
the RBAC the token really gets, start/stop.
"""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.core.conditions import INITIALIZED, LAUNCHED, REGISTERED, TRUE, Condition
from nodepool_k8s.driver.base import RequestInfo
from nodepool_k8s.driver.kubernetes import guards, manifests
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider, KubernetesSettings
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.dev.simulator import Simulator
from tests.e2e.util import node_api
from tests.helpers import Signal
from tests.kubernetes.conftest import ProviderFactory
from tests.kubernetes.factories import make_label, make_provider, make_spec

POD_LABEL = make_label(
    "pod-fedora", image="docker.io/fedora:40", image_pull="Always", cpu=2, memory=1024,
    storage=10, cpu_limit=4, memory_limit=2048, storage_limit=20, gpu=1.0,
    gpu_resource="nvidia.com/gpu", env=({"name": "FOO", "value": "bar"},),
    node_selector={"kubernetes.io/hostname": "sim-node-1"}, scheduler_name="default-scheduler",
    privileged=True, pod_security="privileged", volumes=({"name": "cache", "emptyDir": {}},),
    volume_mounts=({"name": "cache", "mountPath": "/cache"},), labels={"team": "ci"},
    dynamic_labels={"tenant": "{request.tenant_name}"}, annotations={"owner": "ci"},
    python_path="/usr/bin/python3", shell_type="bash", extra_resources={"licenses": 1})
NS_LABEL = make_label("k8s-namespace", "namespace", cpu=1, memory=512,
                      labels={"team": "ci"}, annotations={"team.example.org/owner": "ci"})
FORM_B = make_label("pod-raw", spec={"containers": [
    {"name": "main", "image": "busybox", "command": ["sleep", "infinity"]}]},
    labels={"kind": "raw"}, annotations={"note": "verbatim"})


def _assert_bound_token(sim: Simulator, token: str, namespace: str) -> None:
    """The token is a TokenRequest token of the namespace's zuul-worker account."""
    who = sim.authority.authenticate_token(token)
    assert who is not None and (who.sa_namespace, who.sa_name) == (namespace, "zuul-worker")


def _launch(provider: KubernetesProvider, label: str, **kw: Any) -> Any:
    seen: list[str] = []
    updates: list[Condition] = []

    def progress(external_id: str, *conditions: Condition) -> None:
        seen.append(external_id)
        updates.extend(conditions)

    result = provider.launch(make_spec(provider.config, label, **kw), threading.Event(),
                             progress=progress)
    assert set(seen) == {result.external_id}
    # Launched, Registered, Initialized, in that order, all True, with ordered times.
    assert [c.type for c in updates] == [LAUNCHED, REGISTERED, INITIALIZED]
    assert all(c.status == TRUE for c in updates)
    times = [c.last_transition_time or 0.0 for c in updates]
    assert times == sorted(times)
    return result


def test_namespace_launch_result(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS_LABEL)
    result = _launch(provider, "k8s-namespace")
    assert result.external_id == "main-0000000000"
    assert result.connection_type == "namespace"
    assert result.interface_ip is None and result.host_id is None
    assert result.cloud == "sim"
    assert result.python_path == "auto" and result.shell_type is None
    assert result.resources == {"instances": 1, "cores": 1, "ram": 512}
    # A namespace label's annotations are set on the namespace (not silently dropped).
    namespace = sim.get("namespaces", "main-0000000000")
    assert namespace is not None
    annotations = namespace["metadata"]["annotations"]
    assert annotations.pop("nodepool_config_hash")  # what drift replacement compares
    assert annotations == {"team.example.org/owner": "ci"}
    port = dict(result.connection_port)
    _assert_bound_token(sim, port.pop("token"), "main-0000000000")
    assert port == {
        "name": "main-0000000000", "namespace": "main-0000000000", "host": sim.url,
        "skiptls": False, "user": "zuul-worker",
        "ca_crt": base64.b64encode(str(sim.ca_pem).encode()).decode(),
    }
    # The expiry (default token-lifetime: one day) goes onto the node, never the token.
    expires = result.extra["token_expires"]
    assert isinstance(expires, int) and abs(expires - (time.time() + 86400)) < 600
    assert sim.list("secrets") == []
    assert result.connection_port["host"].startswith("https://")
    assert base64.b64decode(result.connection_port["ca_crt"]).decode() == sim.ca_pem
    assert "<redacted>" in repr(result) and result.connection_port["token"] not in repr(result)


def test_namespace_objects(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS_LABEL)
    _launch(provider, "k8s-namespace", node_id="0000000005")
    ns = sim.get("namespaces", "main-0000000005")
    assert ns is not None
    labels = ns["metadata"]["labels"]
    keys = ("team", "nodepool_node_id", "nodepool_provider_name", "nodepool_pool_name",
            "nodepool_node_label")
    assert {k: labels[k] for k in keys} == {
        "team": "ci", "nodepool_node_id": "0000000005", "nodepool_provider_name": "kubespray",
        "nodepool_pool_name": "main", "nodepool_node_label": "k8s-namespace"}
    assert sim.get("serviceaccounts", "zuul-worker", "main-0000000005") is not None
    assert labels["nodepool_installation_id"] == "default"
    assert sim.list("secrets", "main-0000000005") == []
    role = sim.get("roles", "zuul", "main-0000000005")
    assert role["rules"] == manifests.NAMESPACE_RULES
    binding = sim.get("rolebindings", "zuul-role", "main-0000000005")
    assert binding["roleRef"]["name"] == "zuul"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "zuul-worker",
                                    "namespace": "main-0000000005"}]
    assert sim.list("pods", "main-0000000005") == []


# The default `object-quota` as the ResourceQuota states it.
COUNTS = {"pods": "50", "services": "20", "secrets": "50", "configmaps": "50",
          "persistentvolumeclaims": "10", "requests.storage": "10000M"}


def test_without_resource_quota_external_services_stay_refused(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # `resource-quota: false` lifts the compute limits only; NodePort/LoadBalancer services
    # stay refused until `allow-external-services` says otherwise (doc/security.md).
    label = make_label("ns-free", "namespace", cpu=1, memory=512, resource_quota=False)
    provider = make_k8s_provider(sim, label)
    result = _launch(provider, "ns-free")
    namespace = result.external_id
    quota = sim.get("resourcequotas", guards.QUOTA_NAME, namespace)
    assert quota is not None
    assert quota["spec"]["hard"] == {**COUNTS, "services.loadbalancers": "0",
                                     "services.nodeports": "0"}
    assert sim.get("limitranges", guards.LIMIT_RANGE_NAME, namespace) is None
    core = node_api(dict(result.connection_port))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_service(namespace, {
            "metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}})
    assert refused.value.status == 403 and "services.nodeports" in str(refused.value.body)
    # With both keys the quota keeps only the object counts (`object-quota`).
    both = make_label("ns-open", "namespace", cpu=1, resource_quota=False,
                      allow_external_services=True)
    result = _launch(make_k8s_provider(sim, both), "ns-open", node_id="0000000001")
    [quota] = sim.list("resourcequotas", result.external_id)
    assert quota["spec"]["hard"] == COUNTS


def test_pod_launch_result_and_spec(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, POD_LABEL)
    result = _launch(provider, "pod-fedora", node_id="0000000001")
    ns = "main-0000000001"
    assert result.connection_type == "kubectl"
    assert result.interface_ip == "pod-fedora"
    assert result.connection_port["pod"] == "pod-fedora"
    _assert_bound_token(sim, result.connection_port["token"], ns)
    assert result.host_id == "sim-node-1"
    assert result.python_path == "/usr/bin/python3" and result.shell_type == "bash"
    assert result.resources == {"instances": 1, "cores": 2, "ram": 1024,
                                "ephemeral-storage": 10, "nvidia.com/gpu": 1, "licenses": 1}
    pod = sim.get("pods", "pod-fedora", ns)
    assert pod["status"]["phase"] == "Running"
    assert pod["metadata"]["labels"]["tenant"] == "tenant-1"
    assert pod["metadata"]["labels"]["nodepool_node_id"] == "0000000001"
    assert pod["metadata"]["annotations"]["owner"] == "ci"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "sim-node-1"}
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["volumes"][0]["name"] == "cache"
    container = spec["containers"][0]
    assert container["name"] == "pod-fedora"
    assert container["image"] == "docker.io/fedora:40"
    assert container["imagePullPolicy"] == "Always"
    assert container["command"] == ["/bin/sh", "-c"]
    assert container["args"] == ["while true; do sleep 30; done;"]
    assert container["env"] == [{"name": "FOO", "value": "bar"}]
    assert container["securityContext"] == {"privileged": True}
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]
    assert container["resources"]["requests"] == {
        "cpu": "2", "memory": "1024Mi", "ephemeral-storage": "10M", "nvidia.com/gpu": "1"}
    assert container["resources"]["limits"] == {
        "cpu": "4", "memory": "2048Mi", "ephemeral-storage": "20M", "nvidia.com/gpu": "1"}
    role = sim.get("roles", "zuul-restricted", ns)
    assert role["rules"] == manifests.POD_RULES
    assert sim.get("rolebindings", "zuul-role", ns)["roleRef"]["name"] == "zuul-restricted"


def test_form_b_pod_spec_is_verbatim(sim: Simulator,
                                     make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, FORM_B)
    result = _launch(provider, "pod-raw")
    pod = sim.get("pods", "pod-raw", result.external_id)
    assert pod["spec"]["containers"][0]["command"] == ["sleep", "infinity"]
    assert pod["metadata"]["annotations"] == {"note": "verbatim"}
    assert pod["metadata"]["labels"]["kind"] == "raw"
    assert FORM_B.spec == {"containers": [
        {"name": "main", "image": "busybox", "command": ["sleep", "infinity"]}]}


def _launch_calls(sim: Simulator) -> dict[str, int]:
    # The provider's shared pod/secret watches may re-list or reconnect at any moment; those
    # calls serve every launch at once, so only the per-node calls are counted here.
    # Events are sent asynchronously and best-effort: not part of a node's API calls.
    return {k: v for k, v in sim.counters.items()
            if k != "total" and not k.startswith(("watch ", "list "))
            and not k.endswith(" events")}


def test_api_calls_per_node(sim: Simulator, make_k8s_provider: ProviderFactory,
                            changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS_LABEL, POD_LABEL)
    sim.reset_counters()
    result = _launch(provider, "k8s-namespace")
    # namespace, resourcequota, limitrange, serviceaccount, secret, role, rolebinding
    assert sum(_launch_calls(sim).values()) == 7, sim.counters
    sim.reset_counters()
    _launch(provider, "pod-fedora", node_id="0000000001")
    assert sum(_launch_calls(sim).values()) == 8, sim.counters
    # The ownership proof comes from the namespace watch's copy once it has one (else a GET).
    changes.until(lambda: provider._namespace_watch().get("", result.external_id) is not None,
                  message="the namespace watch to see the namespace")
    sim.reset_counters()
    provider.delete_and_confirm(result.external_id)
    assert _launch_calls(sim) == {"delete namespaces": 1}, sim.counters


def test_skiptls_omits_ca(sim: Simulator, make_k8s_provider: ProviderFactory,
                          tmp_path: Any) -> None:
    document = sim.kubeconfig(context="insecure")
    cluster = document["clusters"][0]["cluster"]
    del cluster["certificate-authority-data"]
    cluster["insecure-skip-tls-verify"] = True
    path = tmp_path / "insecure.yaml"
    path.write_text(yaml.safe_dump(document))
    provider = make_k8s_provider(sim, NS_LABEL, kubeconfig=str(path), context="insecure")
    result = _launch(provider, "k8s-namespace")
    assert result.connection_port["skiptls"] is True
    assert "ca_crt" not in result.connection_port
    assert result.cloud == "insecure"


def test_context_defaults_to_current(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS_LABEL, context=None)
    assert _launch(provider, "k8s-namespace").cloud == "sim"


def test_dynamic_label_from_request(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    label = make_label("ns-dyn", "namespace", dynamic_labels={"event": "{request.event_id}",
                                                              "broken": "{request.nope}"})
    provider = make_k8s_provider(sim, label)
    result = _launch(provider, "ns-dyn", request=RequestInfo(id="100-0000000001",
                                                             event_id="abc123"))
    labels = sim.get("namespaces", result.external_id)["metadata"]["labels"]
    assert labels["event"] == "abc123"
    assert "broken" not in labels


def _token_client(sim: Simulator, token: str, tmp_path: Any) -> k8s.CoreV1Api:
    ca = tmp_path / "ca.pem"
    ca.write_text(sim.ca_pem)
    configuration = k8s.Configuration()
    configuration.host = sim.url
    configuration.ssl_ca_cert = str(ca)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return k8s.CoreV1Api(k8s.ApiClient(configuration))


def _allowed(call: Any) -> bool:
    try:
        call()
        return True
    except k8s.ApiException as exc:
        assert exc.status == 403, exc
        return False


def test_token_gets_exactly_the_role(make_sim: Any, make_k8s_provider: ProviderFactory,
                                     tmp_path: Any) -> None:
    sim = make_sim(enforce_rbac=True)
    provider = make_k8s_provider(sim, NS_LABEL, POD_LABEL)
    ns_node = _launch(provider, "k8s-namespace")
    pod_node = _launch(provider, "pod-fedora", node_id="0000000001")
    ns_api = _token_client(sim, ns_node.connection_port["token"], tmp_path)
    pod_api = _token_client(sim, pod_node.connection_port["token"], tmp_path)
    cm = {"metadata": {"name": "cm"}, "data": {"a": "b"}}
    ns, pod_ns = ns_node.external_id, pod_node.external_id

    assert _allowed(lambda: ns_api.list_namespaced_pod(ns))
    assert _allowed(lambda: ns_api.create_namespaced_config_map(ns, cm))
    assert not _allowed(lambda: ns_api.list_namespaced_pod(pod_ns))  # other namespaces: no

    assert _allowed(lambda: pod_api.list_namespaced_pod(pod_ns))
    assert _allowed(lambda: pod_api.read_namespaced_pod("pod-fedora", pod_ns))
    assert not _allowed(lambda: pod_api.create_namespaced_config_map(pod_ns, cm))
    assert not _allowed(lambda: pod_api.delete_namespaced_pod("pod-fedora", pod_ns))


def test_start_and_stop_are_idempotent(sim: Simulator, tmp_path: Any) -> None:
    provider = KubernetesProvider(make_provider(NS_LABEL),
                                  kubeconfig=sim.write_kubeconfig(tmp_path / "kc"))
    with pytest.raises(TemporaryError):
        provider.launch(make_spec(provider.config, "k8s-namespace"), threading.Event())
    provider.start()
    provider.start()
    provider.stop()
    provider.stop()
    with pytest.raises(TemporaryError):
        provider.list_resources()


def test_kubeconfig_from_environment(sim: Simulator, tmp_path: Any,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # $KUBECONFIG is read at start(), not when the kubernetes package was imported.
    monkeypatch.setenv("KUBECONFIG", sim.write_kubeconfig(tmp_path / "env-kubeconfig"))
    provider = KubernetesProvider(make_provider(NS_LABEL))
    provider.start()
    try:
        assert provider.list_resources() == []
    finally:
        provider.stop()


def test_no_kubeconfig_falls_back_to_in_cluster(tmp_path: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    provider = KubernetesProvider(make_provider(NS_LABEL))
    with pytest.raises(TemporaryError, match="credentials"):
        provider.start()


def test_unknown_context_is_temporary_error(sim: Simulator, tmp_path: Any) -> None:
    provider = KubernetesProvider(make_provider(NS_LABEL, context="nope"),
                                  kubeconfig=sim.write_kubeconfig(tmp_path / "kc"))
    with pytest.raises(TemporaryError):
        provider.start()


def test_quota_for_label_and_cloud_limits(sim: Simulator,
                                          make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, POD_LABEL)
    assert provider.quota_for_label(POD_LABEL) == POD_LABEL.quota()
    limits = provider.cloud_limits()
    assert limits["instances"] == float("inf") and limits["anything"] == float("inf")


def test_timing_settings_come_from_the_provider_config() -> None:
    config = make_provider(NS_LABEL, unschedulable_grace=5.0, delete_timeout=42.0)
    provider = KubernetesProvider(config, kubeconfig="/nonexistent")
    assert (provider.unschedulable_grace, provider.delete_timeout) == (5.0, 42.0)
    assert provider.settings.cleanup_timeout == KubernetesSettings().cleanup_timeout
    defaults = KubernetesProvider(make_provider(NS_LABEL), kubeconfig="/nonexistent")
    assert (defaults.unschedulable_grace, defaults.delete_timeout) == (30.0, 300.0)
    # Explicit settings (tests, embedding code) still win over the configuration.
    explicit = KubernetesProvider(config, kubeconfig="/nonexistent",
                                  settings=KubernetesSettings(delete_timeout=1.5))
    assert (explicit.unschedulable_grace, explicit.delete_timeout) == (5.0, 1.5)
