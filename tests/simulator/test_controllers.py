"""Background controllers: pod phases, token secrets, namespace and pod deletion, RBAC."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.simulator.conftest import Kube, pod_body, token_secret_body
from tests.simulator.test_watch import Collector


def as_token(sim: Simulator, token: str, tmp_path: Path) -> client.CoreV1Api:
    """A client that authenticates with `token` instead of the admin's."""
    path = sim.write_kubeconfig(tmp_path / f"kubeconfig-{uuid.uuid4().hex}", token=token)
    return client.CoreV1Api(config.new_client_from_config(config_file=path, context="sim"))


def test_pod_goes_pending_scheduled_running(kube: Kube, k8s_sim: Simulator,
                                            changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "life"}})
    watches = k8s_sim.open_watches
    c = Collector(kube.core.list_namespaced_pod, "life", timeout_seconds=10)
    # The watch must be open before the pod exists, or its first event is a later state.
    changes.until(lambda: k8s_sim.open_watches > watches, message="the watch to open")
    try:
        kube.core.create_namespaced_pod("life", pod_body("p"))
        created = c.next()["raw_object"]
        assert created["status"]["phase"] == "Pending" and "nodeName" not in created["spec"]
        scheduled = c.next()["raw_object"]
        assert scheduled["spec"]["nodeName"] == "sim-node-1"
        assert scheduled["status"]["phase"] == "Pending"
        assert {"type": "PodScheduled", "status": "True"}.items() <= \
            scheduled["status"]["conditions"][0].items()
        running = c.next()["object"]
        assert running.status.phase == "Running"
        assert running.status.pod_ip.startswith("10.244.")
        assert running.status.host_ip == "10.0.0.1" and running.status.start_time
        (status,) = running.status.container_statuses
        assert status.ready and status.state.running.started_at and status.image_id
        ready = {cond.type: cond.status for cond in running.status.conditions}
        assert ready["Ready"] == "True" and ready["ContainersReady"] == "True"
    finally:
        c.stop()


def test_delays_are_observable(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(schedule_delay=0.3, start_delay=0.3)
    kube.core.create_namespace({"metadata": {"name": "slow"}})
    kube.core.create_namespaced_pod("slow", pod_body("p"))
    assert kube.core.read_namespaced_pod("p", "slow").spec.node_name is None
    changes.until(lambda: kube.core.read_namespaced_pod("p", "slow").spec.node_name)
    assert kube.core.read_namespaced_pod("p", "slow").status.phase == "Pending"
    changes.until(lambda: kube.core.read_namespaced_pod("p", "slow").status.phase == "Running")


def test_node_selector_and_configured_nodes(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(node_labels={"n1": {"disk": "hdd"}, "n2": {"disk": "ssd"}})
    assert [n.metadata.name for n in kube.core.list_node().items] == ["n1", "n2"]
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    kube.core.create_namespaced_pod("ns", pod_body("fast", nodeSelector={"disk": "ssd"}))
    kube.core.create_namespaced_pod("ns", pod_body("gpu", nodeSelector={"gpu": "yes"}))
    changes.until(lambda: kube.core.read_namespaced_pod("fast", "ns").status.phase == "Running")
    assert kube.core.read_namespaced_pod("fast", "ns").spec.node_name == "n2"

    def unschedulable() -> Any:
        pod = kube.core.read_namespaced_pod("gpu", "ns")
        return [c for c in pod.status.conditions or [] if c.reason == "Unschedulable"]
    (condition,) = changes.until(unschedulable)
    assert condition.type == "PodScheduled" and condition.status == "False"
    assert "didn't match Pod's node affinity/selector" in condition.message
    # A node that matches appears: the pending pod gets scheduled.
    kube.core.patch_node("n1", {"metadata": {"labels": {"gpu": "yes"}}})
    changes.until(lambda: kube.core.read_namespaced_pod("gpu", "ns").status.phase == "Running")
    assert kube.core.read_namespaced_pod("gpu", "ns").spec.node_name == "n1"


def test_token_controller_fills_secret_and_token_authenticates(
        kube: Kube, k8s_sim: Simulator, tmp_path: Path, changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "tok"}})
    kube.core.create_namespaced_service_account("tok", {"metadata": {"name": "zuul-worker"}})
    kube.core.create_namespaced_secret("tok", token_secret_body("zuul-worker", "zuul-worker"))

    def filled() -> Any:
        secret = kube.core.read_namespaced_secret("zuul-worker", "tok")
        return secret if (secret.data or {}).get("token") else None
    secret = changes.until(filled)
    assert base64.b64decode(secret.data["ca.crt"]).decode() == k8s_sim.ca_pem
    assert base64.b64decode(secret.data["namespace"]) == b"tok"
    sa_uid = kube.core.read_namespaced_service_account("zuul-worker", "tok").metadata.uid
    assert secret.metadata.annotations["kubernetes.io/service-account.uid"] == sa_uid
    token = base64.b64decode(secret.data["token"]).decode()
    worker = as_token(k8s_sim, token, tmp_path)
    assert [p.metadata.name for p in worker.list_namespaced_pod("tok").items] == []
    # Deleting the secret revokes the token.
    kube.core.delete_namespaced_secret("zuul-worker", "tok")
    with pytest.raises(ApiException) as info:
        worker.list_namespaced_pod("tok")
    assert info.value.status == 401
    worker.api_client.close()


def test_secret_created_before_its_service_account_is_filled_later(kube: Kube,
                                                                   changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "order"}})
    kube.core.create_namespaced_secret("order", token_secret_body("s", "late"))
    assert not kube.core.read_namespaced_secret("s", "order").data
    kube.core.create_namespaced_service_account("order", {"metadata": {"name": "late"}})
    changes.until(lambda: (kube.core.read_namespaced_secret("s", "order").data or {}).get("token"))


def test_token_delay(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(token_delay=0.3)
    kube.core.create_namespace({"metadata": {"name": "td"}})
    kube.core.create_namespaced_service_account("td", {"metadata": {"name": "w"}})
    kube.core.create_namespaced_secret("td", token_secret_body("w", "w"))
    assert not kube.core.read_namespaced_secret("w", "td").data
    changes.until(lambda: (kube.core.read_namespaced_secret("w", "td").data or {}).get("token"))


def test_namespace_deletion_terminates_then_removes_contents(make_sim: Any,
                                                             changes: Signal) -> None:
    sim, kube = make_sim(namespace_delete_delay=0.3)
    kube.core.create_namespace({"metadata": {"name": "doomed"}})
    kube.core.create_namespaced_service_account("doomed", {"metadata": {"name": "sa"}})
    kube.core.create_namespaced_pod("doomed", pod_body("p"))
    c = Collector(kube.core.list_pod_for_all_namespaces, timeout_seconds=10)
    try:
        assert c.next()["type"] == "ADDED"
        kube.core.delete_namespace("doomed", propagation_policy="Background")
        terminating = kube.core.read_namespace("doomed")
        assert terminating.status.phase == "Terminating"
        assert terminating.metadata.deletion_timestamp is not None
        with pytest.raises(ApiException) as info:
            kube.core.create_namespaced_config_map("doomed", {"metadata": {"name": "late"}})
        assert info.value.status == 403 and "being terminated" in info.value.body
        assert '"reason":"Forbidden"' in info.value.body
        # deleting again is fine and still returns the terminating namespace
        kube.core.delete_namespace("doomed")

        def gone() -> bool:
            try:
                kube.core.read_namespace("doomed")
            except ApiException as exc:
                return exc.status == 404
            return False
        changes.until(gone)
        assert sim.list("pods", "doomed") == [] and sim.list("serviceaccounts", "doomed") == []
        while True:
            event = c.next()
            if event["type"] == "DELETED":
                assert event["raw_object"]["metadata"]["name"] == "p"
                break
    finally:
        c.stop()


def test_pod_delete_delay(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(pod_delete_delay=0.3)
    kube.core.create_namespace({"metadata": {"name": "pd"}})
    kube.core.create_namespaced_pod("pd", pod_body("p"))
    kube.core.delete_namespaced_pod("p", "pd")
    pod = kube.core.read_namespaced_pod("p", "pd")
    assert pod.metadata.deletion_timestamp is not None
    changes.until(lambda: sim.get("pods", "p", "pd") is None)
    kube.core.create_namespaced_pod("pd", pod_body("q"))
    kube.core.delete_namespaced_pod("q", "pd", grace_period_seconds=0)  # immediate
    assert sim.get("pods", "q", "pd") is None


def test_namespace_defaults_option(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(namespace_defaults=True)
    kube.core.create_namespace({"metadata": {"name": "nd"}})
    changes.until(lambda: sim.get("serviceaccounts", "default", "nd"))
    cm = changes.until(lambda: sim.get("configmaps", "kube-root-ca.crt", "nd"))
    assert cm["data"]["ca.crt"] == sim.ca_pem


def test_rbac_enforcement_option(make_sim: Any, tmp_path: Path) -> None:
    sim, kube = make_sim(enforce_rbac=True)
    kube.core.create_namespace({"metadata": {"name": "rb"}})
    kube.core.create_namespaced_service_account("rb", {"metadata": {"name": "w"}})
    token = kube.core.create_namespaced_service_account_token(
        "w", "rb", {"spec": {}}).status.token
    worker = as_token(sim, token, tmp_path)
    with pytest.raises(ApiException) as info:
        worker.list_namespaced_pod("rb")
    assert info.value.status == 403
    message = json.loads(info.value.body)["message"]
    assert 'User "system:serviceaccount:rb:w" cannot list resource "pods"' in message
    kube.rbac.create_namespaced_role("rb", {"metadata": {"name": "r"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]})
    kube.rbac.create_namespaced_role_binding("rb", {
        "metadata": {"name": "b"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
        "subjects": [{"kind": "ServiceAccount", "name": "w", "namespace": "rb"}]})
    assert worker.list_namespaced_pod("rb").items == []
    with pytest.raises(ApiException):
        worker.list_namespaced_config_map("rb")
    with pytest.raises(ApiException):
        worker.list_namespace()  # cluster scope: never granted to service accounts
    worker.api_client.close()
