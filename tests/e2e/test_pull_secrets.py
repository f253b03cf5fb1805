"""Private registries (`image-pull-secrets`) end to end: Zuul-like client → ZooKeeper →
launcher → official client over HTTPS → simulated cluster, and back.

Aspects: a pod label gets the pool's default pull Secret, another its own instead (the
label's list replaces the default); each node's namespace holds a copy of exactly its named
Secrets (type and data, our labels) and the pod names them in imagePullSecrets; the job's
token (the pod label's role) can neither read nor list the copy; once the nodes are used,
the copies go with their namespaces and the operator's Secrets stay. A missing Secret fails
the node for good with `PullSecretMissing` (one attempt, the request failed, the reason
and the Secret's namespace/name on the node's condition and in the event log); a Secret of
another type fails it with `PullSecretRefused`.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kazoo.client import KazooClient
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import paths
from tests.e2e.test_faults import failed_attempts, pool_id
from tests.e2e.util import admin_api, node_api
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: pod-default
  - name: pod-own
  - name: pod-missing
  - name: pod-opaque
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 3
    boot-timeout: 60
    api-retries: 2
    api-backoff: [0.01]
    api-timeout: 10
    pools:
      - name: main
        max-servers: 10
        default-label-image-pull-secrets:
          - name: registry-credentials
            namespace: registries
        labels:
          - name: pod-default
            type: pod
            image: registry.example.com/ci/fedora:40
          - name: pod-own
            type: pod
            image: mirror.example.com/ci/fedora:40
            image-pull-secrets:
              - name: mirror
                namespace: registries
          - name: pod-missing
            type: pod
            image: registry.example.com/ci/fedora:40
            image-pull-secrets:
              - name: not-there
                namespace: registries
          - name: pod-opaque
            type: pod
            image: registry.example.com/ci/fedora:40
            image-pull-secrets:
              - name: plain
                namespace: registries
"""

OPERATOR_SECRETS = ["registries/mirror", "registries/plain",
                    "registries/registry-credentials"]


def place(sim: Simulator, name: str, kind: str, data: dict[str, str]) -> None:
    core = admin_api(sim)
    if sim.get("namespaces", "registries") is None:
        core.create_namespace({"metadata": {"name": "registries"}})
    core.create_namespaced_secret("registries", {
        "metadata": {"name": name, "labels": {"origin": "ops"}}, "type": kind, "data": data})


def secrets(sim: Simulator) -> list[str]:
    return sorted(f"{s['metadata']['namespace']}/{s['metadata']['name']}"
                  for s in sim.list("secrets"))


@pytest.fixture
def registries(k8s_sim: Simulator) -> Simulator:
    """The operator's Secrets: two registry credentials and one plain Secret."""
    for name in ("registry-credentials", "mirror"):
        auth = base64.b64encode(f'{{"auths": {{"{name}.example.com": {{}}}}}}'.encode())
        place(k8s_sim, name, "kubernetes.io/dockerconfigjson",
              {".dockerconfigjson": auth.decode()})
    place(k8s_sim, "plain", "Opaque", {"token": "c2VjcmV0"})
    assert secrets(k8s_sim) == OPERATOR_SECRETS
    return k8s_sim


def test_copies_follow_the_labels_and_leave_with_the_nodes(
        launchers: LauncherFactory, zuul: ZuulClient, registries: Simulator,
        kazoo_client: KazooClient) -> None:
    sim = registries
    launchers(CONFIG)
    request_id = zuul.submit(["pod-default", "pod-own"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    expected = {"pod-default": "registry-credentials", "pod-own": "mirror"}
    for label, node_id in zip(["pod-default", "pod-own"], body["nodes"]):
        node = zuul.get_node(node_id)
        assert node is not None and node["state"] == "ready"
        namespace, name = node["external_id"], expected[label]
        # Exactly the named Secret, copied (type, data), with the node's labels.
        assert [s["metadata"]["name"] for s in sim.list("secrets", namespace)] == [name]
        copy, source = sim.get("secrets", name, namespace), sim.get("secrets", name,
                                                                    "registries")
        assert copy is not None and source is not None
        assert (copy["type"], copy["data"]) == (source["type"], source["data"])
        assert copy["metadata"]["labels"][manifests.NODE_ID_LABEL] == node_id
        assert "origin" not in copy["metadata"]["labels"]
        pod = sim.get("pods", label, namespace)
        assert pod is not None and pod["spec"]["imagePullSecrets"] == [{"name": name}]
        # The job's token cannot read the credential through the API.
        sim.config.enforce_rbac = True
        try:
            core = node_api(node["connection_port"])
            for call, args in ((core.read_namespaced_secret, (name, namespace)),
                               (core.list_namespaced_secret, (namespace,))):
                with pytest.raises(ApiException) as info:
                    call(*args)
                assert info.value.status == 403
        finally:
            sim.config.enforce_rbac = False
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="the used nodes removed")
    # The copies went with their namespaces; the operator's Secrets are untouched.
    wait_for(lambda: secrets(sim) == OPERATOR_SECRETS, 30, message="only the sources left")


@pytest.mark.parametrize("label,reason,fragment", [
    ("pod-missing", "PullSecretMissing",
     "image pull Secret registries/not-there does not exist"),
    ("pod-opaque", "PullSecretRefused", "image pull Secret registries/plain is not copied:"
     " its type is 'Opaque'"),
])
def test_an_unusable_secret_fails_the_node_with_its_reason(
        launchers: LauncherFactory, zuul: ZuulClient, registries: Simulator,
        kazoo_client: KazooClient, label: str, reason: str, fragment: str) -> None:
    sim = registries
    launcher = launchers(CONFIG)
    request_id = zuul.submit([label])
    body: Any = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    # Not retried: the operator must act (launch-retries is 3).
    assert failed_attempts(launcher) == [(1, reason)]
    assert body["declined_reasons"][pool_id(launcher)]["reason"] == reason
    entry = wait_for(lambda: [e for e in zk_events.read_events(launcher.zk)
                              if e["kind"] == zk_events.LAUNCH_FAILED],
                     message="the failed launch in the event log")[-1]
    assert entry["reason"] == reason and fragment in entry["message"], entry
    false = [c for c in entry["conditions"] if c["status"] == "False"]
    assert [(c["type"], c["reason"]) for c in false] == [("Registered", reason)]
    assert fragment in false[0]["message"]
    zuul.cancel(request_id)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="the failed node removed")
    # Nothing was copied, no pod made; the attempt's namespace is gone.
    wait_for(lambda: not sim.list("namespaces", label_selector="nodepool_provider_name=k8s"),
             30, message="the attempt's namespace removed")
    assert secrets(sim) == OPERATOR_SECRETS and sim.list("pods") == []
