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
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.simulator.resources import RESOURCES, by_plural
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import node_api
from tests.helpers import in_use, wait_for
from tests.launchers import LauncherFactory

REPO = Path(__file__).resolve().parents[2]
RBAC_YAML = REPO / "etc" / "kubernetes" / "launcher-rbac.yaml"
DEPLOYMENT_YAML = REPO / "etc" / "kubernetes" / "launcher-deployment.yaml"
POLICY_YAML = REPO / "etc" / "kubernetes" / "job-policy.yaml"
NETWORK_YAML = REPO / "etc" / "kubernetes" / "network-policies.yaml"
SHIPPED = (RBAC_YAML, DEPLOYMENT_YAML, POLICY_YAML, NETWORK_YAML)
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

PROVIDER = """
labels:
  - name: k8s-namespace
  - name: k8s-secrets
  - name: pod-privileged
  - name: pod-registry
  - name: pod-unlisted
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
            object-quota: {{configmaps: 3, persistentvolumeclaims: 1, storage: 1000}}
          - name: k8s-secrets
            type: namespace
            allow-job-secrets: true
          - name: pod-privileged
            type: pod
            image: docker.io/library/busybox:1.36
            privileged: true
            cpu: 0.5
            memory: 128
          - name: pod-registry
            type: pod
            image: registry.example.com/ci/busybox:1.36
            image-pull-secrets:
              - name: registry-credentials   # named by the shipped example Role
                namespace: nodepool
          - name: pod-unlisted
            type: pod
            image: registry.example.com/ci/busybox:1.36
            image-pull-secrets:
              - name: other-credentials      # not named by it
                namespace: nodepool
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
        "limits.memory": "512Mi", "services.loadbalancers": "0", "services.nodeports": "0",
        "pods": "50", "services": "20", "secrets": "50", "configmaps": "3",
        "persistentvolumeclaims": "1", "requests.storage": "1000M"}
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

    # Object counts: three configmaps (kube-root-ca.crt, which the cluster adds, among them).
    why = ""
    for index in range(4):
        try:
            core.create_namespaced_config_map(namespace, {"metadata": {"name": f"c{index}"}})
        except ApiException as exc:
            assert exc.status == 403, exc
            why = str(exc.body)
            break
    assert "exceeded quota: nodepool-quota" in why and "configmaps=3" in why
    why = _refused(lambda: core.create_namespaced_persistent_volume_claim(
        namespace, _claim("huge", "2G")))
    assert "exceeded quota: nodepool-quota" in why and "requests.storage" in why
    core.create_namespaced_persistent_volume_claim(namespace, _claim("data", "500M"))
    why = _refused(lambda: core.create_namespaced_persistent_volume_claim(
        namespace, _claim("more", "1M")))
    assert "persistentvolumeclaims=1" in why

    # The role: endpoints are read-only, secrets are not the job's (allow-job-secrets).
    assert core.list_namespaced_endpoints(namespace).items == []
    why = _refused(lambda: core.create_namespaced_endpoints(namespace, {
        "metadata": {"name": "internal"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}))
    assert 'cannot create resource \\"endpoints\\"' in why or \
        'cannot create resource "endpoints"' in why
    why = _refused(lambda: core.create_namespaced_secret(namespace, _token_secret()))
    assert 'cannot create resource \\"secrets\\"' in why or \
        'cannot create resource "secrets"' in why


def create_documents(sim: Simulator, path: Path) -> list[str]:
    """Create every object of a shipped file as the admin, through the official client
    (no kubectl needed): `<plural>/<name>` of each."""
    api = k8s_config.new_client_from_config(sim.kubeconfig_path, context="sim")
    created = []
    for document in yaml.safe_load_all(path.read_text()):
        group, _, version = document["apiVersion"].rpartition("/")
        plural = next(r.plural for r in RESOURCES
                      if r.kind == document["kind"] and r.group == group)
        resource = by_plural(plural)
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        if resource.namespaced:
            prefix += f"/namespaces/{document['metadata']['namespace']}"
        api.call_api(f"{prefix}/{plural}", "POST", body=document,
                     header_params={"Content-Type": "application/json"},
                     auth_settings=["BearerToken"], response_types_map={201: "object"},
                     _return_http_data_only=True)
        created.append(f"{plural}/{document['metadata']['name']}")
    return created


def test_the_shipped_policy_refuses_token_secrets(launchers: LauncherFactory,
                                                  zuul: ZuulClient,
                                                  k8s_sim: Simulator) -> None:
    """With `allow-job-secrets` a job may create Secrets: without the shipped policy it can
    mint a token that never expires; with it, that Secret is refused (in node namespaces
    only), other Secrets are not."""
    launchers(config())
    (node_id,) = _fulfil(zuul, ["k8s-secrets"])["nodes"]
    namespace = f"main-{node_id}"
    k8s_sim.config.enforce_rbac = True
    node = zuul.get_node(node_id)
    assert node is not None
    core = node_api(node["connection_port"])
    core.create_namespaced_secret(namespace, {"metadata": {"name": "plain"},
                                              "stringData": {"password": "x"}})
    # The threat: the token controller fills in a token for zuul-worker, with no expiry.
    core.create_namespaced_secret(namespace, _token_secret("before"))
    minted = wait_for(lambda: (core.read_namespaced_secret("before", namespace).data
                               or {}).get("token"), message="the minted token")
    assert minted

    # Scoped by the label every namespace of a launcher carries (and nothing else does).
    for document in yaml.safe_load_all(POLICY_YAML.read_text()):
        spec = document["spec"]
        selector = (spec.get("matchConstraints") or spec.get("matchResources"))[
            "namespaceSelector"]
        assert selector == {"matchExpressions": [
            {"key": manifests.INSTALLATION_LABEL, "operator": "Exists"}]}
    assert create_documents(k8s_sim, POLICY_YAML) == [
        "validatingadmissionpolicies/nodepool-no-token-secrets",
        "validatingadmissionpolicybindings/nodepool-no-token-secrets"]
    why = _refused(lambda: core.create_namespaced_secret(namespace, _token_secret("after")))
    assert "ValidatingAdmissionPolicy 'nodepool-no-token-secrets' with binding" \
        " 'nodepool-no-token-secrets' denied request: a CI job may not create" in why
    core.create_namespaced_secret(namespace, {"metadata": {"name": "plain-2"},
                                              "stringData": {"password": "y"}})
    # A namespace the launcher did not create is out of the policy's scope.
    admin = k8s.CoreV1Api(k8s_config.new_client_from_config(k8s_sim.kubeconfig_path,
                                                            context="sim"))
    admin.create_namespace({"metadata": {"name": "elsewhere"}})
    admin.create_namespaced_secret("elsewhere", _token_secret("allowed"))


def _claim(name: str, size: str) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}}


def _token_secret(name: str = "forever") -> dict[str, Any]:
    """What a job would create to get a token for zuul-worker that never expires."""
    return {"metadata": {"name": name,
                         "annotations": {"kubernetes.io/service-account.name": "zuul-worker"}},
            "type": "kubernetes.io/service-account-token"}


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
    _refused(lambda: core.create_namespaced_secret(f"main-{ns_id}",
                                                   {"metadata": {"name": "s"}}))
    # With allow-job-secrets the launcher binds the secrets ClusterRole (it may `bind` it).
    (secrets_id,) = _fulfil(zuul, ["k8s-secrets"])["nodes"]
    binding = sim.get("rolebindings", manifests.ROLE_BINDING, f"main-{secrets_id}")
    assert binding is not None and binding["roleRef"]["name"] == "nodepool-zuul-with-secrets"
    secrets_node = zuul.get_node(secrets_id)
    assert secrets_node is not None
    node_api(secrets_node["connection_port"]).create_namespaced_secret(
        f"main-{secrets_id}", {"metadata": {"name": "s"}})


def test_shipped_job_roles_match_the_driver() -> None:
    documents = {d["metadata"]["name"]: d for d in yaml.safe_load_all(RBAC_YAML.read_text())
                 if d["kind"] == "ClusterRole"}
    # Every ClusterRole the driver binds holds exactly the rules of the Role it would create.
    for label in (PoolLabel("n", "namespace"), PoolLabel("n", "namespace",
                                                         allow_job_secrets=True),
                  PoolLabel("p", "pod", image="busybox")):
        assert documents[guards.cluster_role_name(label)]["rules"] == \
            manifests.role_rules(label), label
    assert set(guards.CLUSTER_ROLES.values()) <= set(documents)
    bindable = next(rule for rule in documents["nodepool-launcher"]["rules"]
                    if rule["verbs"] == ["bind"])
    assert sorted(bindable["resourceNames"]) == sorted(
        [*guards.CLUSTER_ROLES.values(), manifests.CLEANUP_CLUSTER_ROLE])
    assert documents[manifests.CLEANUP_CLUSTER_ROLE]["rules"] == manifests.cleanup_rules()
    launcher_rules = documents["nodepool-launcher"]["rules"]
    assert not any("secrets" in rule["resources"] for rule in launcher_rules)
    # Reading pull Secrets: `get` only, only on the Secrets named, only in one namespace.
    deployment = {(d["kind"], d["metadata"]["name"]): d
                  for d in yaml.safe_load_all(DEPLOYMENT_YAML.read_text()) if d}
    reader = deployment[("Role", "nodepool-launcher-pull-secrets")]
    assert reader["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                                "verbs": ["get"], "resourceNames": ["registry-credentials"]}]
    binding = deployment[("RoleBinding", "nodepool-launcher-pull-secrets")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "nodepool-launcher",
                                    "namespace": "nodepool"}]
    assert not any(verb in rule["verbs"] for rule in launcher_rules
                   for verb in ("escalate", "*"))


@needs_kubectl
def test_launcher_rbac_copies_only_the_pull_secrets_it_names(
        launcher_account: Simulator, launchers: LauncherFactory, zuul: ZuulClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """The example Role of launcher-deployment.yaml lets the launcher read the Secret it
    names in its own namespace; the cleanup ClusterRole, bound in the node's namespace,
    lets it create the copy there. Another Secret beside it stays out of reach."""
    sim = launcher_account
    for name in ("registry-credentials", "other-credentials"):
        kubectl(sim, "create", "secret", "docker-registry", name, "-n", "nodepool",
                "--docker-server=registry.example.com", "--docker-username=ci",
                "--docker-password=s3cret")
    caplog.set_level(logging.WARNING)
    launchers(config("    job-role: cluster-role"))
    (node_id,) = _fulfil(zuul, ["pod-registry"])["nodes"]
    copy = sim.get("secrets", "registry-credentials", f"main-{node_id}")
    source = sim.get("secrets", "registry-credentials", "nodepool")
    assert copy is not None and source is not None and copy["data"] == source["data"]
    pod = sim.get("pods", "pod-registry", f"main-{node_id}")
    assert pod is not None
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
    request_id = zuul.submit(["pod-unlisted"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert 'cannot get resource "secrets"' in caplog.text


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


def _example_config(tmp_path: Path) -> Any:
    """The configuration in the example's Secret as the launcher would load it there: the
    pod IP in its environment, the TLS files mounted (here: empty stand-ins)."""
    documents = list(yaml.safe_load_all(DEPLOYMENT_YAML.read_text()))
    secret = next(d for d in documents if d["kind"] == "Secret")
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_text("stand-in")
    secure = secret["stringData"]["secure.conf"].replace("/etc/nodepool-tls", str(tmp_path))
    return load_config_text(secret["stringData"]["nodepool.yaml"], path="nodepool.yaml",
                            env={"NODEPOOL_POD_IP": "10.1.2.3"}, secure_text=secure,
                            secure_path="secure.conf")


def test_the_shipped_in_cluster_set_up(k8s_sim: Simulator, tmp_path: Path) -> None:
    """Every shipped file is accepted by the API server (no kubectl needed), and together
    they keep jobs off ZooKeeper and the status port: TLS and an ACL to ZooKeeper, the web
    app on the pod's address, NetworkPolicies admitting only the launcher, Zuul and the
    operator's clients."""
    admin = k8s.CoreV1Api(k8s_config.new_client_from_config(k8s_sim.kubeconfig_path,
                                                            context="sim"))
    admin.create_namespace({"metadata": {"name": "zuul"}})  # ZooKeeper's, not shipped
    created = [name for path in SHIPPED for name in create_documents(k8s_sim, path)]
    for what in ("networkpolicies/zookeeper-clients", "networkpolicies/nodepool-launcher",
                 "validatingadmissionpolicies/nodepool-no-token-secrets",
                 "deployments/nodepool-launcher", "clusterroles/nodepool-zuul-with-secrets"):
        assert what in created, created

    config = _example_config(tmp_path)
    assert config.warnings == ()  # TLS on, ACL on: nothing travels or lies open
    assert config.zookeeper_tls is not None and config.zookeeper_acl is not None
    assert config.zookeeper_acl.enabled and config.zookeeper_acl.grants[0].scheme == "x509"
    assert [s.port for s in config.zookeeper_servers] == [2281]
    assert config.webapp.listen_address == "10.1.2.3"

    deployment = k8s_sim.get("deployments", "nodepool-launcher", "nodepool")
    assert deployment is not None
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert {"name": "NODEPOOL_POD_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    assert container["readinessProbe"]["httpGet"]["port"] == "http"
    assert container["ports"] == [{"name": "http", "containerPort": config.webapp.port}]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["zookeeper-tls"] == "/etc/nodepool-tls"

    zk_policy = k8s_sim.get("networkpolicies", "zookeeper-clients", "zuul")
    assert zk_policy is not None and zk_policy["spec"]["policyTypes"] == ["Ingress"]
    [clients, peers] = zk_policy["spec"]["ingress"]
    assert clients["ports"] == [{"protocol": "TCP", "port": 2281}]
    launcher_peer = clients["from"][0]
    assert launcher_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "nodepool"}
    assert launcher_peer["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    # No rule admits a peer by namespace alone or by address: a job's pods match none.
    for rule in (clients, peers):
        assert all("podSelector" in peer and "ipBlock" not in peer for peer in rule["from"])
    web_policy = k8s_sim.get("networkpolicies", "nodepool-launcher", "nodepool")
    assert web_policy is not None
    assert web_policy["spec"]["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    [web] = web_policy["spec"]["ingress"]
    assert web["ports"] == [{"protocol": "TCP", "port": config.webapp.port}]
    assert web["from"] == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]


@needs_kubectl
def test_deployment_example_applies(k8s_sim: Simulator, tmp_path: Path) -> None:
    kubectl(k8s_sim, "apply", "-f", str(RBAC_YAML))
    out = kubectl(k8s_sim, "apply", "-f", str(DEPLOYMENT_YAML))
    for what in ("namespace/nodepool", "serviceaccount/nodepool-launcher",
                 "secret/nodepool-config", "deployment.apps/nodepool-launcher"):
        assert f"{what} created" in out, out
    kubectl(k8s_sim, "create", "namespace", "zuul")
    out = kubectl(k8s_sim, "apply", "-f", str(POLICY_YAML), "-f", str(NETWORK_YAML))
    for what in ("validatingadmissionpolicy.admissionregistration.k8s.io/"
                 "nodepool-no-token-secrets",
                 "validatingadmissionpolicybinding.admissionregistration.k8s.io/"
                 "nodepool-no-token-secrets",
                 "networkpolicy.networking.k8s.io/zookeeper-clients",
                 "networkpolicy.networking.k8s.io/nodepool-launcher"):
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
                       ("clusterroles", "nodepool-zuul-with-secrets"),
                       ("clusterroles", "nodepool-zuul-restricted"),
                       ("clusterrolebindings", "nodepool-launcher")):
        assert k8s_sim.get(kind, name) is not None, (kind, name)
    # The example configuration in the Secret is itself valid.
    loaded = _example_config(tmp_path)
    assert loaded.providers["this-cluster"].job_role == "cluster-role"


# -- a node namespace that stays Terminating, with the launcher's shipped rights -----------------

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
    nodeset = in_use(zuul, ["k8s-namespace"], 60)
    node_id = nodeset.nodes[0].id
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
    nodeset = in_use(zuul, ["k8s-namespace"], 60)
    node_id = nodeset.nodes[0].id
    namespace = f"main-{node_id}"
    assert _hold_of(sim, namespace)["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    zuul.release(nodeset)
    wait_for(lambda: sim.get("namespaces", namespace) is None, 30,
             message="the namespace to go")
    wait_for(lambda: zuul.get_node(node_id) is None, 30, message="the node to go")
