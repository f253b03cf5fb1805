"""Guarded namespaces and the launcher's own rights, end to end: Zuul-like client → ZooKeeper →
launcher → official client over HTTPS → simulated cluster with RBAC enforced.

Aspects: a namespace node's namespace carries the Pod Security enforce label and a
ResourceQuota/LimitRange matching its label; with the node's own token a privileged pod, a
LoadBalancer service and a pod above the label's cpu are refused, a plain pod gets the
LimitRange defaults; a pod label that is allowed to be privileged gets a privileged
namespace. The launcher authenticated as the service account of
etc/kubernetes/launcher-deployment.yaml, bound by etc/kubernetes/launcher-rbac.yaml and
nothing else, serves namespace and pod nodes; without that binding the request fails and
the log names the missing permission; with `job-role: role` the simulator's escalation
prevention refuses the Role it would grant. Both files apply with `kubectl apply -f`.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import PoolLabel
from nodepool_k8s.driver.kubernetes import guards, manifests
from nodepool_k8s.simulator import Simulator
from nodepool_k8s.testing.zuul_client import ZuulClient
from tests.e2e.util import node_api
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

REPO = Path(__file__).resolve().parents[2]
RBAC_YAML = REPO / "etc" / "kubernetes" / "launcher-rbac.yaml"
DEPLOYMENT_YAML = REPO / "etc" / "kubernetes" / "launcher-deployment.yaml"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

PROVIDER = """
labels:
  - name: k8s-namespace
  - name: pod-privileged
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 1
    boot-timeout: 30
    api-retries: 1
    api-backoff: [0.01]
    api-timeout: 10
{extra}
    pools:
      - name: main
        max-servers: 10
        allow-privileged: true
        labels:
          - name: k8s-namespace
            type: namespace
            cpu: 1
            memory: 512
          - name: pod-privileged
            type: pod
            image: docker.io/library/busybox:1.36
            privileged: true
            cpu: 0.5
            memory: 128
"""


def config(extra: str = "") -> str:
    return PROVIDER.format(extra=extra)


def _fulfil(zuul: ZuulClient, labels: list[str]) -> dict[str, Any]:
    request_id = zuul.submit(labels)
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    return body


def _refused(call: Any) -> str:
    with pytest.raises(ApiException) as refused:
        call()
    assert refused.value.status == 403, refused.value
    return str(refused.value.body)


def _pod(name: str, **container: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox", **container}]}}


def test_namespace_is_guarded(launchers: LauncherFactory, zuul: ZuulClient,
                              k8s_sim: Simulator) -> None:
    launchers(config())
    body = _fulfil(zuul, ["k8s-namespace", "pod-privileged"])
    ns_id, pod_id = body["nodes"]
    namespace = f"main-{ns_id}"
    labels = k8s_sim.get("namespaces", namespace)["metadata"]["labels"]  # type: ignore[index]
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"
    quota = k8s_sim.get("resourcequotas", guards.QUOTA_NAME, namespace)
    assert quota is not None and quota["spec"]["hard"] == {
        "requests.cpu": "1", "limits.cpu": "1", "requests.memory": "512Mi",
        "limits.memory": "512Mi", "services.loadbalancers": "0", "services.nodeports": "0"}
    limits = k8s_sim.get("limitranges", guards.LIMIT_RANGE_NAME, namespace)
    assert limits is not None and limits["spec"]["limits"] == [{
        "type": "Container", "default": {"cpu": "1", "memory": "512Mi"},
        "defaultRequest": {"cpu": "0.1", "memory": "128Mi"}}]
    # The privileged pod label's namespace is privileged, or its pod could not run.
    pod_ns = k8s_sim.get("namespaces", f"main-{pod_id}")
    assert pod_ns is not None
    assert pod_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

    # What the job can do with its own token, with RBAC enforced.
    k8s_sim.config.enforce_rbac = True
    node = zuul.get_node(ns_id)
    assert node is not None
    core = node_api(node["connection_port"])
    why = _refused(lambda: core.create_namespaced_pod(
        namespace, _pod("root", securityContext={"privileged": True})))
    assert 'violates PodSecurity \\"baseline:latest\\"' in why or \
        'violates PodSecurity "baseline:latest"' in why
    why = _refused(lambda: core.create_namespaced_pod(namespace, {
        "metadata": {"name": "host"}, "spec": {
            "hostNetwork": True, "containers": [{"name": "main", "image": "busybox"}]}}))
    assert "host namespaces" in why
    why = _refused(lambda: core.create_namespaced_pod(
        namespace, _pod("greedy", resources={"requests": {"cpu": "2"}})))
    assert "exceeded quota: nodepool-quota" in why and "requests.cpu" in why
    why = _refused(lambda: core.create_namespaced_service(namespace, {
        "metadata": {"name": "lb"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}}))
    assert "exceeded quota" in why and "services.loadbalancers" in why
    core.create_namespaced_service(namespace, {"metadata": {"name": "internal"},
                                               "spec": {"ports": [{"port": 80}]}})
    plain = core.create_namespaced_pod(namespace, _pod("plain"))
    assert plain.spec.containers[0].resources.requests == {"cpu": "0.1", "memory": "128Mi"}
    assert plain.spec.containers[0].resources.limits == {"cpu": "1", "memory": "512Mi"}


# -- the launcher's own rights -------------------------------------------------------------------

def kubectl(sim: Simulator, *args: str) -> str:
    assert KUBECTL is not None and sim.kubeconfig_path
    result = subprocess.run([KUBECTL, "--kubeconfig", sim.kubeconfig_path, *args],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


@pytest.fixture
def launcher_account(k8s_sim: Simulator, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> Simulator:
    """The shipped RBAC and deployment applied; $KUBECONFIG authenticates as the
    deployment's service account (a TokenRequest token), RBAC enforced."""
    assert "created" in kubectl(k8s_sim, "apply", "-f", str(RBAC_YAML))
    assert "created" in kubectl(k8s_sim, "apply", "-f", str(DEPLOYMENT_YAML))
    token = kubectl(k8s_sim, "create", "token", "nodepool-launcher", "-n", "nodepool",
                    "--duration=1h").strip()
    path = k8s_sim.write_kubeconfig(tmp_path / "launcher-kubeconfig", token=token)
    monkeypatch.setenv("KUBECONFIG", path)
    k8s_sim.config.enforce_rbac = True
    return k8s_sim


@needs_kubectl
def test_launcher_rbac_is_sufficient(launcher_account: Simulator, launchers: LauncherFactory,
                                     zuul: ZuulClient) -> None:
    sim = launcher_account
    launchers(config("    job-role: cluster-role"))
    body = _fulfil(zuul, ["k8s-namespace", "pod-privileged"])
    ns_id, pod_id = body["nodes"]
    binding = sim.get("rolebindings", manifests.ROLE_BINDING, f"main-{ns_id}")
    assert binding is not None and binding["roleRef"]["kind"] == "ClusterRole"
    assert sim.get("roles", manifests.NAMESPACE_ROLE, f"main-{ns_id}") is None
    # The job's token has the shipped ClusterRole's rights in its namespace.
    node = zuul.get_node(ns_id)
    assert node is not None
    core = node_api(node["connection_port"])
    core.create_namespaced_config_map(f"main-{ns_id}", {"metadata": {"name": "data"}})
    pod_node = zuul.get_node(pod_id)
    assert pod_node is not None
    pod_core = node_api(pod_node["connection_port"])
    assert pod_core.read_namespaced_pod("pod-privileged", f"main-{pod_id}").status.phase \
        == "Running"
    _refused(lambda: pod_core.create_namespaced_config_map(f"main-{pod_id}",
                                                           {"metadata": {"name": "x"}}))


def test_shipped_job_roles_match_the_driver() -> None:
    documents = {d["metadata"]["name"]: d for d in yaml.safe_load_all(RBAC_YAML.read_text())
                 if d["kind"] == "ClusterRole"}
    assert documents[guards.CLUSTER_ROLES["namespace"]]["rules"] == manifests.NAMESPACE_RULES
    assert documents[guards.CLUSTER_ROLES["pod"]]["rules"] == manifests.POD_RULES
    assert documents[manifests.CLEANUP_CLUSTER_ROLE]["rules"] == manifests.cleanup_rules()
    launcher_rules = documents["nodepool-launcher"]["rules"]
    assert not any("secrets" in rule["resources"] for rule in launcher_rules)
    assert not any(verb in rule["verbs"] for rule in launcher_rules
                   for verb in ("escalate", "*"))


@needs_kubectl
def test_without_the_binding_the_launch_fails_clearly(
        launcher_account: Simulator, launchers: LauncherFactory, zuul: ZuulClient,
        caplog: pytest.LogCaptureFixture) -> None:
    kubectl(launcher_account, "delete", "clusterrolebinding", "nodepool-launcher")
    caplog.set_level(logging.WARNING)
    launchers(config("    job-role: cluster-role"))
    request_id = zuul.submit(["k8s-namespace"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert ('User "system:serviceaccount:nodepool:nodepool-launcher" cannot create resource'
            ' "namespaces"') in caplog.text


@needs_kubectl
def test_role_mode_needs_rights_the_shipped_role_does_not_give(
        launcher_account: Simulator, launchers: LauncherFactory, zuul: ZuulClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """`job-role: role` creates a Role per namespace: Kubernetes refuses it to an account
    that neither holds its rights nor may `escalate` (first the roles create itself)."""
    caplog.set_level(logging.WARNING)
    launchers(config())
    request_id = zuul.submit(["k8s-namespace"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert 'cannot create resource "roles"' in caplog.text


@needs_kubectl
def test_escalation_prevention(launcher_account: Simulator, tmp_path: Path) -> None:
    """A binding to a role the creator may not `bind` (nor holds the rights of) is refused."""
    token = kubectl(launcher_account, "create", "token", "nodepool-launcher", "-n",
                    "nodepool", "--duration=1h").strip()
    path = launcher_account.write_kubeconfig(tmp_path / "kc", token=token)
    api = k8s_config.new_client_from_config(path, context="sim")
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": "main-9999999999"}})
    # Binding a ClusterRole it may `bind`: allowed; any other ClusterRole: refused.
    binding = guards.cluster_role_binding_body("main-9999999999",
                                               PoolLabel("x", "namespace"), {})
    rbac.create_namespaced_role_binding("main-9999999999", binding)
    other = dict(binding, metadata={"name": "other"},
                 roleRef=dict(binding["roleRef"], name="cluster-admin"))
    why = _refused(lambda: rbac.create_namespaced_role_binding("main-9999999999", other))
    assert "not found and no bind permission" in why


@needs_kubectl
def test_deployment_example_applies(k8s_sim: Simulator) -> None:
    kubectl(k8s_sim, "apply", "-f", str(RBAC_YAML))
    out = kubectl(k8s_sim, "apply", "-f", str(DEPLOYMENT_YAML))
    for what in ("namespace/nodepool", "serviceaccount/nodepool-launcher",
                 "secret/nodepool-config", "deployment.apps/nodepool-launcher"):
        assert f"{what} created" in out, out
    deployment = k8s_sim.get("deployments", "nodepool-launcher", "nodepool")
    assert deployment is not None
    pod_spec = deployment["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "nodepool-launcher"
    container = pod_spec["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {"-c", "/etc/nodepool/nodepool.yaml", "-s", "/etc/nodepool/secure.conf"} <= \
        set(container["command"])
    assert pod_spec["volumes"][0]["secret"]["secretName"] == "nodepool-config"
    for kind, name in (("clusterroles", "nodepool-launcher"),
                       ("clusterroles", "nodepool-zuul"),
                       ("clusterroles", "nodepool-zuul-restricted"),
                       ("clusterrolebindings", "nodepool-launcher")):
        assert k8s_sim.get(kind, name) is not None, (kind, name)
    # The example configuration in the Secret is itself valid.
    documents = list(yaml.safe_load_all(DEPLOYMENT_YAML.read_text()))
    secret = next(d for d in documents if d["kind"] == "Secret")
    loaded = load_config_text(secret["stringData"]["nodepool.yaml"])
    assert loaded.providers["this-cluster"].job_role == "cluster-role"


# -- a node namespace that stays Terminating, with the launcher's shipped rights -----------------

def _released_job_node(zuul: ZuulClient) -> tuple[str, Any]:
    request_id = zuul.submit(["k8s-namespace"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    return str(body["nodes"][0]), nodeset


def _hold_of(sim: Simulator, namespace: str) -> dict[str, Any]:
    binding = sim.get("rolebindings", manifests.CLEANUP_BINDING, namespace)
    assert binding is not None, f"no cleanup binding in {namespace}"
    return binding


@needs_kubectl
def test_cluster_role_mode_clears_a_job_finalizer(launcher_account: Simulator,
                                                  launchers: LauncherFactory,
                                                  zuul: ZuulClient) -> None:
    """With only the shipped rights (RBAC enforced), a finalizer the job set is removed
    after `terminating-grace` through the launcher's own binding in that namespace."""
    sim = launcher_account
    launchers(config("    job-role: cluster-role\n    terminating-grace: 1"))
    node_id, nodeset = _released_job_node(zuul)
    namespace = f"main-{node_id}"
    binding = _hold_of(sim, namespace)
    assert binding["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    assert binding["roleRef"]["name"] == manifests.CLEANUP_CLUSTER_ROLE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "nodepool-launcher",
                                    "namespace": "nodepool"}]
    job = node_api(nodeset.nodes[0].data["connection_port"])
    job.create_namespaced_config_map(namespace, {"metadata": {
        "name": "held", "finalizers": ["example.com/never-removed"]}})
    zuul.release(nodeset)
    wait_for(lambda: sim.get("namespaces", namespace) is None, 30,
             message="the namespace to go")
    wait_for(lambda: zuul.get_node(node_id) is None, 30, message="the node to go")


@needs_kubectl
def test_cluster_role_mode_hold_does_not_delay_a_clean_deletion(
        launcher_account: Simulator, launchers: LauncherFactory, zuul: ZuulClient) -> None:
    """The launcher's hold goes as soon as its binding is all that is left: a namespace the
    job left clean goes at once, long before `terminating-grace`."""
    sim = launcher_account
    launchers(config("    job-role: cluster-role\n    terminating-grace: 3600"))
    node_id, nodeset = _released_job_node(zuul)
    namespace = f"main-{node_id}"
    assert _hold_of(sim, namespace)["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    zuul.release(nodeset)
    wait_for(lambda: sim.get("namespaces", namespace) is None, 30,
             message="the namespace to go")
    wait_for(lambda: zuul.get_node(node_id) is None, 30, message="the node to go")
