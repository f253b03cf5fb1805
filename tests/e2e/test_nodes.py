"""Kubernetes nodes end to end: Zuul-like client → ZooKeeper → launcher → official client over
HTTPS → simulated cluster, and back.

Aspects: a namespace label, a form A pod label that sets every key and a form B (verbatim
spec) pod label are fulfilled for a Zuul-like client in one request; each node carries
exactly what Zuul reads (nodepool-protocol.md B1.4); the kubeconfig Zuul's executor builds
from `connection_port` authenticates against the cluster with the node's own token and
gets the Role's rights, no more; the objects in the cluster (namespace `<pool>-<node id>`
and its labels, service account, Role, RoleBinding, pod spec per key); after
Zuul marks the nodes used and unlocks them, every namespace is deleted, every node znode
removed, and nothing is left in the cluster.
"""

from __future__ import annotations

import base64
import os
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from kazoo.client import KazooClient
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import assert_subset, leftovers, node_api, zuul_kubeconfig
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: k8s-namespace
  - name: pod-fedora
  - name: pod-raw
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 2
    boot-timeout: 60
    api-retries: 3
    api-backoff: [0.01, 0.05]
    api-timeout: 10
    pools:
      - name: main
        max-servers: 10
        node-attributes:
          executor-zone: sim-zone
        default-label-cpu: 1
        default-label-memory: 256
        allow-privileged: true     # pod-fedora
        allow-verbatim-spec: true  # pod-raw
        labels:
          - name: k8s-namespace
            type: namespace
            python-path: /usr/bin/python3.11
            shell-type: sh
            cpu: 1
            memory: 512
            storage: 5
            extra-resources:
              example.com/licenses: 2
            labels:
              team: ci
            dynamic-labels:
              zuul-tenant: "{request.tenant_name}"
              zuul-request: "{request[id]}"
            boot-timeout: 30
          - name: pod-fedora
            type: pod
            image: docker.io/fedora:40
            image-pull: Always
            python-path: /usr/bin/python3
            shell-type: bash
            cpu: 2
            memory: 1024
            storage: 10
            cpu-limit: 4
            memory-limit: 2048
            storage-limit: 20
            gpu: 1
            gpu-resource: nvidia.com/gpu
            env:
              - name: FOO
                value: bar
              - name: MY_POD
                valueFrom:
                  fieldRef:
                    fieldPath: metadata.name
            node-selector:
              kubernetes.io/hostname: sim-node-1
            privileged: true
            scheduler-name: ci-scheduler
            volumes:
              - name: cache
                emptyDir: {}
            volume-mounts:
              - name: cache
                mountPath: /cache
            labels:
              team: ci
            dynamic-labels:
              zuul-tenant: "{request.tenant_name}"
              zuul-first-label: "{request.labels[0]}"
            annotations:
              example.com/owner: ci
            extra-resources:
              example.com/licenses: 1
            boot-timeout: 45
          - name: pod-raw
            type: pod
            spec:
              containers:
                - name: main
                  image: docker.io/library/busybox:1.36
                  command: ["sleep", "infinity"]
                  ports:
                    - containerPort: 8080
              restartPolicy: OnFailure
              terminationGracePeriodSeconds: 5
              hostname: raw-host
            labels:
              kind: raw
            dynamic-labels:
              zuul-tenant: "{request.tenant_name}"
            annotations:
              note: verbatim
            boot-timeout: 30
"""

FORM_B_SPEC = {
    "containers": [{"name": "main", "image": "docker.io/library/busybox:1.36",
                    "command": ["sleep", "infinity"], "ports": [{"containerPort": 8080}]}],
    "restartPolicy": "OnFailure",
    "terminationGracePeriodSeconds": 5,
    "hostname": "raw-host",
}

NODE_TYPES = ["k8s-namespace", "pod-fedora", "pod-raw"]

# Every key Nodepool writes on a node (nodepool-protocol.md B1.4); Zuul copies them all.
NODE_KEYS = {
    "state", "state_time", "cloud", "provider", "pool", "type", "allocated_to", "az",
    "region", "public_ipv4", "private_ipv4", "public_ipv6", "host_id", "interface_ip",
    "connection_port", "ssh_port", "image_id", "launcher", "created_time", "external_id",
    "hostname", "comment", "user_data", "hold_job", "host_keys", "username",
    "connection_type", "shell_type", "hold_expiration", "resources", "slot", "attributes",
    "python_path", "tenant_name", "driver_data", "requestor", "node_properties",
}


def assert_bound_token(sim: Simulator, token: str, namespace: str) -> None:
    """`token` is a TokenRequest token bound to the namespace's zuul-worker account."""
    who = sim.authority.authenticate_token(token)
    assert who is not None, f"the token of {namespace} does not authenticate"
    assert (who.sa_namespace, who.sa_name) == (namespace, "zuul-worker")


def ownership(node_id: str, label: str, installation: str) -> dict[str, str]:
    return {"nodepool_node_id": node_id, "nodepool_provider_name": "k8s",
            "nodepool_pool_name": "main", "nodepool_node_label": label,
            "nodepool_installation_id": installation}


@pytest.fixture
def served(launchers: LauncherFactory, zuul: ZuulClient) -> tuple[Launcher, str, dict[str, Any]]:
    """One request for all three labels, fulfilled: (launcher, request id, request body)."""
    launcher = launchers(CONFIG)
    request_id = zuul.submit(NODE_TYPES)
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    return launcher, request_id, body


def test_nodes_carry_what_zuul_reads(served: tuple[Launcher, str, dict[str, Any]],
                                     zuul: ZuulClient, k8s_sim: Simulator) -> None:
    launcher, request_id, body = served
    assert body["declined_by"] == [] and len(body["nodes"]) == 3
    nodes = {label: zuul.get_node(node_id) for label, node_id in zip(NODE_TYPES, body["nodes"])}
    pool_id = next(w.id for w in launcher.pool_workers.values())
    ca_b64 = base64.b64encode(k8s_sim.ca_pem.encode()).decode()  # type: ignore[union-attr]
    for label, node_id in zip(NODE_TYPES, body["nodes"]):
        node = nodes[label]
        assert node is not None
        namespace = f"main-{node_id}"
        assert NODE_KEYS <= set(node), NODE_KEYS - set(node)
        # What the scheduler/executor index and check.
        assert node["state"] == "ready"
        assert node["type"] == [label]  # a list
        assert node["allocated_to"] == request_id
        assert node["tenant_name"] == "tenant-1"
        assert node["requestor"] == zuul.system_id
        assert node["provider"] == "k8s" and node["pool"] == "main"
        assert node["launcher"] == pool_id
        assert node["attributes"] == {"executor-zone": "sim-zone"}
        assert node["cloud"] == "sim"
        assert node["external_id"] == namespace
        assert node["username"] is None and node["hostname"] is None
        assert node["ssh_port"] == node["connection_port"]
        port = node["connection_port"]
        assert isinstance(port, dict)
        assert_bound_token(k8s_sim, port["token"], namespace)
        # The token's expiry is on the node (the default token-lifetime: one day).
        assert abs(node["token_expires"] - (time.time() + 86400)) < 600
        expected_port = {"name": namespace, "namespace": namespace, "host": k8s_sim.url,
                         "skiptls": False, "token": port["token"],
                         "user": "zuul-worker", "ca_crt": ca_b64}
        if label == "k8s-namespace":
            assert node["connection_type"] == "namespace"
            assert port == expected_port
            assert node["interface_ip"] is None and node["host_id"] is None
        else:
            assert node["connection_type"] == "kubectl"
            assert port == dict(expected_port, pod=label)
            assert node["interface_ip"] == label  # Ansible's ansible_host
            pod = k8s_sim.get("pods", label, namespace)
            assert pod is not None and pod["status"]["phase"] == "Running"
            assert node["host_id"] == pod["spec"]["nodeName"] == "sim-node-1"
        assert port["host"].startswith("https://")
        assert base64.b64decode(port["ca_crt"]).decode() == k8s_sim.ca_pem
    assert nodes["k8s-namespace"]["python_path"] == "/usr/bin/python3.11"  # type: ignore
    assert nodes["k8s-namespace"]["shell_type"] == "sh"  # type: ignore[index]
    assert nodes["pod-fedora"]["python_path"] == "/usr/bin/python3"  # type: ignore[index]
    assert nodes["pod-fedora"]["shell_type"] == "bash"  # type: ignore[index]
    assert nodes["pod-raw"]["python_path"] == "auto"  # type: ignore[index]
    assert nodes["pod-raw"]["shell_type"] is None  # type: ignore[index]
    # Requests, not limits; form B counts the pool's default-label-* requests.
    assert nodes["k8s-namespace"]["resources"] == {  # type: ignore[index]
        "instances": 1, "cores": 1, "ram": 512, "ephemeral-storage": 5,
        "example.com/licenses": 2}
    assert nodes["pod-fedora"]["resources"] == {  # type: ignore[index]
        "instances": 1, "cores": 2, "ram": 1024, "ephemeral-storage": 10,
        "nvidia.com/gpu": 1, "example.com/licenses": 1}
    assert nodes["pod-raw"]["resources"] == {  # type: ignore[index]
        "instances": 1, "cores": 1, "ram": 256}


def test_zuul_kubeconfig_works_with_the_node_token(
        served: tuple[Launcher, str, dict[str, Any]], zuul: ZuulClient,
        k8s_sim: Simulator) -> None:
    """The executor's kubeconfig, built from connection_port only, reaches the cluster over
    verified TLS; the token has its Role's rights in its own namespace and nothing else."""
    _, request_id, body = served
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    k8s_sim.config.enforce_rbac = True
    by_label = {held.data["type"][0]: held.data for held in nodeset.nodes}

    ns_port = by_label["k8s-namespace"]["connection_port"]
    core = node_api(ns_port)
    namespace = ns_port["namespace"]
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "job-data"}})
    assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == []
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_config_map("default", {"metadata": {"name": "escape"}})
    assert denied.value.status == 403
    with pytest.raises(ApiException) as denied:
        core.list_namespace()  # cluster-scoped: not granted
    assert denied.value.status == 403

    pod_port = by_label["pod-fedora"]["connection_port"]
    core = node_api(pod_port)
    pod = core.read_namespaced_pod(pod_port["pod"], pod_port["namespace"])
    assert pod.status.phase == "Running"
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_config_map(pod_port["namespace"],
                                          {"metadata": {"name": "nope"}})
    assert denied.value.status == 403
    with pytest.raises(ApiException) as denied:
        core.delete_namespaced_pod(pod_port["pod"], pod_port["namespace"])
    assert denied.value.status == 403
    # Another node's namespace is out of reach of this token.
    with pytest.raises(ApiException) as denied:
        core.list_namespaced_pod(by_label["pod-raw"]["connection_port"]["namespace"])
    assert denied.value.status == 403

    # A wrong token is refused: the cluster really checks what the kubeconfig carries.
    with pytest.raises(ApiException) as denied:
        node_api(dict(ns_port, token="not-a-token")).list_namespaced_pod(namespace)
    assert denied.value.status == 401
    zuul.release(nodeset)


def test_cluster_objects(served: tuple[Launcher, str, dict[str, Any]],
                         k8s_sim: Simulator) -> None:
    launcher, request_id, body = served
    installation = launcher.config.installation_id
    assert installation.startswith("zk-")  # derived from the ZooKeeper hosts and chroot
    ns_id, pod_id, raw_id = body["nodes"]

    # -- namespace label: namespace, SA, Role `zuul`, RoleBinding; no pod, no Secret.
    ns = f"main-{ns_id}"
    namespace = k8s_sim.get("namespaces", ns)
    assert namespace is not None and namespace["status"]["phase"] == "Active"
    labels = namespace["metadata"]["labels"]
    assert labels.pop("kubernetes.io/metadata.name") == ns  # set by the API server
    assert labels.pop("pod-security.kubernetes.io/enforce") == "baseline"  # guards.py
    assert labels.pop("pod-security.kubernetes.io/warn") == "baseline"
    assert labels == {"team": "ci", "zuul-tenant": "tenant-1", "zuul-request": request_id,
                      **ownership(ns_id, "k8s-namespace", installation)}
    sa = k8s_sim.get("serviceaccounts", "zuul-worker", ns)
    assert sa is not None and sa["metadata"]["labels"]["nodepool_node_id"] == ns_id
    assert k8s_sim.list("secrets") == []  # tokens come from TokenRequest, never a Secret
    role = k8s_sim.get("roles", "zuul", ns)
    assert role is not None
    rules = {(tuple(r["apiGroups"]), resource): sorted(r["verbs"])
             for r in role["rules"] for resource in r["resources"]}
    all_verbs = sorted(["create", "delete", "get", "list", "patch", "update", "watch"])
    assert rules[("",), "pods/log"] == ["get", "list", "watch"]  # not Nodepool's `pods/logs`
    assert rules[("",), "endpoints"] == ["get", "list", "watch"]  # CVE-2021-25740
    assert (("",), "secrets") not in rules  # allow-job-secrets is off
    assert rules[("",), "pods/exec"] == all_verbs
    assert rules[("apps",), "deployments"] == all_verbs  # under their real API groups
    assert rules[("apps",), "replicasets"] == all_verbs
    assert rules[("batch",), "jobs"] == all_verbs
    assert ("",) not in {g for (g, res) in rules if res in ("deployments", "jobs")}
    assert role["rules"] == manifests.NAMESPACE_RULES
    binding = k8s_sim.get("rolebindings", "zuul-role", ns)
    assert binding is not None
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "zuul"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "zuul-worker",
                                    "namespace": ns}]
    assert k8s_sim.list("pods", ns) == []

    # -- form A pod label, every key.
    ns = f"main-{pod_id}"
    assert k8s_sim.get("namespaces", ns)["metadata"]["labels"]["nodepool_node_label"] == \
        "pod-fedora"  # type: ignore[index]
    role = k8s_sim.get("roles", "zuul-restricted", ns)
    assert role is not None and role["rules"] == manifests.POD_RULES
    restricted = {resource: sorted(r["verbs"]) for r in role["rules"]
                  for resource in r["resources"]}
    assert restricted == {"pods": ["get", "list", "watch"], "pods/exec": ["create", "get"],
                          "pods/log": ["get", "list", "watch"],
                          "pods/portforward": ["create", "get"]}
    assert k8s_sim.get("rolebindings", "zuul-role", ns)["roleRef"]["name"] == \
        "zuul-restricted"  # type: ignore[index]
    assert k8s_sim.get("serviceaccounts", "zuul-worker", ns) is not None
    pod = k8s_sim.get("pods", "pod-fedora", ns)
    assert pod is not None
    meta = pod["metadata"]
    assert meta["labels"] == {"team": "ci", "zuul-tenant": "tenant-1",
                              "zuul-first-label": "k8s-namespace",
                              **ownership(pod_id, "pod-fedora", installation)}
    assert meta["annotations"] == {"example.com/owner": "ci"}
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"  # inside spec (Nodepool put it beside it)
    assert "restartPolicy" not in pod
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "sim-node-1"}
    assert spec["schedulerName"] == "ci-scheduler"
    assert spec["volumes"] == [{"name": "cache", "emptyDir": {}}]
    [container] = spec["containers"]
    assert container["name"] == "pod-fedora"
    assert container["image"] == "docker.io/fedora:40"
    assert container["imagePullPolicy"] == "Always"
    assert container["command"] == ["/bin/sh", "-c"]
    assert container["args"] == ["while true; do sleep 30; done;"]
    assert container["env"] == [
        {"name": "FOO", "value": "bar"},
        {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert container["securityContext"] == {"privileged": True}
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "1024Mi", "ephemeral-storage": "10M",
                     "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "memory": "2048Mi", "ephemeral-storage": "20M",
                   "nvidia.com/gpu": "1"}}
    # python-path, shell-type and extra-resources are node data / quota only.
    assert "example.com/licenses" not in str(pod)

    # -- form B: the spec verbatim (the server only adds defaults).
    ns = f"main-{raw_id}"
    raw = k8s_sim.get("pods", "pod-raw", ns)
    assert raw is not None
    assert_subset(FORM_B_SPEC, raw["spec"], "spec")
    assert raw["spec"]["restartPolicy"] == "OnFailure"  # theirs, not ours
    assert raw["metadata"]["labels"] == {"kind": "raw", "zuul-tenant": "tenant-1",
                                         **ownership(raw_id, "pod-raw", installation)}
    assert raw["metadata"]["annotations"] == {"note": "verbatim"}
    assert k8s_sim.get("roles", "zuul-restricted", ns) is not None

    # Exactly the three namespaces, nothing else of ours anywhere.
    ours = k8s_sim.list("namespaces", label_selector="nodepool_provider_name=k8s")
    assert sorted(n["metadata"]["name"] for n in ours) == sorted(
        f"main-{n}" for n in body["nodes"])
    assert len(k8s_sim.list("pods")) == 2
    for kind in ("serviceaccounts", "roles", "rolebindings"):
        assert len(k8s_sim.list(kind)) == 3, kind
    assert not [s for s in k8s_sim.list("secrets")
                if s.get("type") == "kubernetes.io/service-account-token"]


def test_used_nodes_are_cleaned_up(served: tuple[Launcher, str, dict[str, Any]],
                                   zuul: ZuulClient, k8s_sim: Simulator,
                                   kazoo_client: KazooClient) -> None:
    launcher, request_id, body = served
    nodeset = zuul.accept(request_id)
    assert zuul.get_request(request_id) is None  # Zuul deleted it
    zuul.use(nodeset)
    for held in nodeset.nodes:
        assert zuul.get_node(held.id)["state"] == "in-use"  # type: ignore[index]
    # While Zuul holds the nodes nothing is deleted.
    assert sorted(n["metadata"]["name"] for n in k8s_sim.list(
        "namespaces", label_selector="nodepool_provider_name=k8s")) == sorted(
        f"main-{n}" for n in body["nodes"])
    zuul.release(nodeset)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="every used node removed from ZooKeeper")
    assert leftovers(k8s_sim) == {}, "something was left in the cluster"
    # Deleted through the API (namespaces, each with its contents), not left to a sweep.
    assert k8s_sim.counters.get("delete namespaces", 0) == 3
    wait_for(lambda: launcher.deleter.deleted == 3, message="the deleter's count")
    keys = launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined]
    assert keys.count("nodepool.launch.provider.k8s.ready") == 3
    assert not [k for k in keys if "error" in k or "leaked" in k]


def test_insecure_context_from_a_kubeconfig_list(launchers: LauncherFactory, zuul: ZuulClient,
                                                 k8s_sim: Simulator, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """$KUBECONFIG may list several files (missing ones skipped, contexts merged); with
    `insecure-skip-tls-verify` the node says `skiptls: true` and carries no `ca_crt`, and
    Zuul's kubeconfig then skips verification too."""
    document = k8s_sim.kubeconfig("sim")
    for cluster in document["clusters"]:
        del cluster["cluster"]["certificate-authority-data"]
        cluster["cluster"]["insecure-skip-tls-verify"] = True
    unrelated = {"apiVersion": "v1", "kind": "Config", "current-context": "elsewhere",
                 "clusters": [{"name": "far", "cluster": {"server": "https://192.0.2.1:6443"}}],
                 "users": [{"name": "someone", "user": {"token": "x"}}],
                 "contexts": [{"name": "elsewhere",
                               "context": {"cluster": "far", "user": "someone"}}]}
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(unrelated))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(
        str(tmp_path / name) for name in ("missing.yaml", "a.yaml", "b.yaml")))
    launchers(CONFIG)
    request_id = zuul.submit(["k8s-namespace", "pod-raw"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    for node_id in body["nodes"]:
        node = zuul.get_node(node_id)
        assert node is not None and node["cloud"] == "sim"
        port = node["connection_port"]
        assert port["skiptls"] is True and "ca_crt" not in port
        assert port["host"] == k8s_sim.url
        assert_bound_token(k8s_sim, port["token"], port["namespace"])
        document_, _ = zuul_kubeconfig(port)
        assert document_["clusters"][0]["cluster"]["insecure-skip-tls-verify"] is True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning
            names = [p.metadata.name for p in
                     node_api(port).list_namespaced_pod(port["namespace"]).items]
        assert names == ([port["pod"]] if node["connection_type"] == "kubectl" else [])
