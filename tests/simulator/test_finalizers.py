"""Finalizers, the namespace controller's wait for them, pod grace periods and
SelfSubjectReview, through the official client as a real cluster answers them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.simulator.conftest import Kube, pod_body

FINALIZER = "example.com/hold"


def _held_config_map(kube: Kube, namespace: str, name: str = "held") -> None:
    body = {"metadata": {"name": name, "finalizers": [FINALIZER]}}
    kube.core.create_namespaced_config_map(namespace, body)


def _conditions(sim: Simulator, namespace: str) -> dict[str, dict[str, Any]]:
    ns = sim.get("namespaces", namespace)
    assert ns is not None
    return {c["type"]: c for c in (ns.get("status") or {}).get("conditions") or []}


def test_delete_with_finalizers_only_marks(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "fin"}})
    _held_config_map(kube, "fin")
    kube.core.delete_namespaced_config_map("held", "fin")
    marked = kube.core.read_namespaced_config_map("held", "fin")
    assert marked.metadata.deletion_timestamp is not None
    assert marked.metadata.finalizers == [FINALIZER]
    # Still updatable, but no new finalizer on a deleting object.
    kube.core.patch_namespaced_config_map("held", "fin", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(ApiException) as refused:
        kube.core.patch_namespaced_config_map(
            "held", "fin", {"metadata": {"finalizers": [FINALIZER, "example.com/more"]}})
    assert refused.value.status == 422
    # Emptying the finalizers completes the deletion.
    kube.core.patch_namespaced_config_map("held", "fin", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        kube.core.read_namespaced_config_map("held", "fin")
    assert gone.value.status == 404


def test_terminating_namespace_waits_for_finalizers(kube: Kube, k8s_sim: Simulator,
                                                    changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "stuck"}})
    _held_config_map(kube, "stuck")
    kube.core.create_namespaced_config_map("stuck", {"metadata": {"name": "plain"}})
    kube.core.delete_namespace("stuck")
    changes.until(lambda: "NamespaceFinalizersRemaining" in _conditions(k8s_sim, "stuck"),
                  message="the namespace controller's conditions")
    conditions = _conditions(k8s_sim, "stuck")
    assert conditions["NamespaceContentRemaining"]["status"] == "True"
    assert conditions["NamespaceContentRemaining"]["message"] == \
        "Some resources are remaining: configmaps. has 1 resource instances"
    assert conditions["NamespaceFinalizersRemaining"]["message"] == \
        f"Some content in the namespace has finalizers remaining: {FINALIZER} in 1 " \
        "resource instances"
    assert k8s_sim.get("configmaps", "plain", "stuck") is None
    namespace = k8s_sim.get("namespaces", "stuck")
    assert namespace is not None and namespace["status"]["phase"] == "Terminating"
    kube.core.patch_namespaced_config_map("held", "stuck", {"metadata": {"finalizers": []}})
    changes.until(lambda: k8s_sim.get("namespaces", "stuck") is None,
                  message="the namespace to go once its content is gone")


def test_pod_grace_period_is_honoured_and_can_be_shortened(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim()
    sim.set_faults(ignore_sigterm=True)
    kube.core.create_namespace({"metadata": {"name": "slow"}})
    body = pod_body("p")
    body["spec"]["terminationGracePeriodSeconds"] = 10 ** 9
    kube.core.create_namespaced_pod("slow", body)
    kube.core.delete_namespace("slow")
    changes.until(lambda: (sim.get("pods", "p", "slow") or {}).get("metadata", {}).get(
        "deletionGracePeriodSeconds") == 10 ** 9, message="the pod's own grace period")
    assert sim.get("namespaces", "slow") is not None
    # A shorter grace period wins; 0 removes the pod, and then the namespace goes.
    kube.core.delete_namespaced_pod("p", "slow", grace_period_seconds=5)
    pod = sim.get("pods", "p", "slow")
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 5
    kube.core.delete_namespaced_pod("p", "slow", grace_period_seconds=0)
    changes.until(lambda: sim.get("namespaces", "slow") is None, message="the namespace to go")


def test_self_subject_review_names_the_caller(make_sim: Any, tmp_path: Path) -> None:
    sim, kube = make_sim(enforce_rbac=True)
    kube.core.create_namespace({"metadata": {"name": "who"}})
    kube.core.create_namespaced_service_account("who", {"metadata": {"name": "me"}})
    token = kube.core.create_namespaced_service_account_token(
        "me", "who", {"spec": {"expirationSeconds": 3600}}).status.token
    path = sim.write_kubeconfig(tmp_path / "kc", token=token)
    api = client.AuthenticationV1Api(config.new_client_from_config(config_file=path,
                                                                   context="sim"))
    review = api.create_self_subject_review({})
    assert review.status.user_info.username == "system:serviceaccount:who:me"
