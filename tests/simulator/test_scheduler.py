"""The simulated scheduler: taints and tolerations, node affinity operators, the real
scheduler's FitError text, and scheduling anywhere when the cluster has no Node objects."""

from __future__ import annotations

from typing import Any

from nodepool_k8s.dev.simulator import scheduler
from tests.helpers import Signal


def pod_body(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def _condition(kube: Any, name: str) -> Any:
    pod = kube.core.read_namespaced_pod(name, "ns")
    found = [c for c in pod.status.conditions or [] if c.reason == "Unschedulable"]
    return found[0] if found else None


def test_fit_error_counts_reasons_like_the_real_scheduler(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(node_labels={"gpu": {"gpu": "yes"}, "a": {}, "b": {}},
                         node_taints={"gpu": [{"key": "gpu", "value": "true",
                                               "effect": "NoSchedule"}]})
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpu", "operator": "In", "values": ["yes"]}]}]}}}
    kube.core.create_namespaced_pod("ns", pod_body("p", affinity=affinity))
    condition = changes.until(lambda: _condition(kube, "p"))
    assert condition.message == (
        "0/3 nodes are available: 1 node(s) had untolerated taint {gpu: true}, 2 node(s)"
        " didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available:"
        " 3 Preemption is not helpful for scheduling.")
    # Tolerating the taint lets it run on the GPU node.
    kube.core.create_namespaced_pod("ns", pod_body(
        "q", affinity=affinity, tolerations=[{"key": "gpu", "operator": "Exists"}]))
    changes.until(lambda: kube.core.read_namespaced_pod("q", "ns").status.phase == "Running")
    assert kube.core.read_namespaced_pod("q", "ns").spec.node_name == "gpu"
    # Removing the taint from the node (a Node change) lets the first pod run too.
    kube.core.patch_node("gpu", {"spec": {"taints": []}})
    changes.until(lambda: kube.core.read_namespaced_pod("p", "ns").status.phase == "Running")


def test_taints_added_through_the_api_and_cordoned_nodes(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(node_labels={})
    kube.core.create_node({"metadata": {"name": "n1", "labels": {"cores": "4"}},
                           "spec": {"unschedulable": True}})
    kube.core.create_node({"metadata": {"name": "n2"}, "spec": {"taints": [
        {"key": "dedicated", "value": "ci", "effect": "NoExecute"}]}})
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    kube.core.create_namespaced_pod("ns", pod_body("p"))
    condition = changes.until(lambda: _condition(kube, "p"))
    assert condition.message.startswith(
        "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: ci},"
        " 1 node(s) were unschedulable.")


def test_without_node_objects_pods_schedule_anywhere(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(node_labels={})
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    kube.core.create_namespaced_pod("ns", pod_body("p", nodeSelector={"any": "thing"}))
    changes.until(lambda: kube.core.read_namespaced_pod("p", "ns").status.phase == "Running")


def test_operators_and_tolerations_unit() -> None:
    labels = {"cores": "16", "zone": "a"}
    match = scheduler.requirement_matches
    assert match({"key": "cores", "operator": "Gt", "values": ["8"]}, labels)
    assert not match({"key": "cores", "operator": "Lt", "values": ["8"]}, labels)
    assert not match({"key": "zone", "operator": "Gt", "values": ["1"]}, labels)
    assert not match({"key": "none", "operator": "Lt", "values": ["1"]}, labels)
    assert match({"key": "zone", "operator": "NotIn", "values": ["b"]}, labels)
    assert match({"key": "none", "operator": "DoesNotExist"}, labels)
    taint = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    assert scheduler.tolerates({"operator": "Exists"}, taint)
    assert scheduler.tolerates({"key": "gpu", "value": "true"}, taint)
    assert not scheduler.tolerates({"key": "gpu", "value": "false"}, taint)
    assert not scheduler.tolerates({"key": "gpu", "operator": "Exists",
                                    "effect": "NoExecute"}, taint)
    # PreferNoSchedule taints do not filter.
    assert scheduler.untolerated_taint([], [{"key": "x", "effect": "PreferNoSchedule"}]) is None
