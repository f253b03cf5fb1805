"""Tolerations and node requirements: validated as Kubernetes accepts them, errors naming the
place, defaults cascading label -> pool -> provider, rendered into the pod spec."""

from __future__ import annotations

from typing import Any

import pytest

from nodepool_k8s.driver.kubernetes.manifests import pod_spec
from tests.config.common import assert_problem, at, base, load, prefix

POD = prefix("podlabel")
POOL = prefix("pool")
PROVIDER = prefix("provider")
GPU_TOLERATION = {"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def _pod_label(data: dict[str, Any]) -> dict[str, Any]:
    return at(data, "podlabel")


def test_rendered_into_the_pod_spec() -> None:
    data = base()
    _pod_label(data).update({
        "tolerations": [GPU_TOLERATION, {"operator": "Exists", "effect": "NoExecute",
                                         "tolerationSeconds": 30}],
        "node-requirements": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]},
                              {"key": "cores", "operator": "Gt", "values": [8]}],
        "preferred-node-requirements": [{"key": "zone", "operator": "In", "values": ["a"],
                                         "weight": 10}],
    })
    label = load(data).providers["k8s"].pools["main"].labels["pod"]
    spec = pod_spec(label)
    assert spec["tolerations"][0] == GPU_TOLERATION
    assert spec["tolerations"][1]["tolerationSeconds"] == 30
    affinity = spec["affinity"]["nodeAffinity"]
    (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "gpu", "operator": "In", "values": ["a100", "h100"]},
        {"key": "cores", "operator": "Gt", "values": ["8"]}]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 10, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]


def test_defaults_cascade_label_pool_provider() -> None:
    data = base()
    at(data, "provider")["default-label-tolerations"] = [GPU_TOLERATION]
    at(data, "pool")["default-label-node-requirements"] = [
        {"key": "pool", "operator": "Exists"}]
    labels = load(data).providers["k8s"].pools["main"].labels
    assert labels["pod"].tolerations == (GPU_TOLERATION,)
    assert labels["pod"].node_requirements == ({"key": "pool", "operator": "Exists"},)
    # Namespaces and verbatim specs are not touched by the defaults.
    assert labels["ns"].tolerations == () and labels["custom"].node_requirements == ()
    # The label's own list replaces the default (no merging).
    _pod_label(data)["tolerations"] = [{"key": "other", "operator": "Exists"}]
    assert load(data).providers["k8s"].pools["main"].labels["pod"].tolerations == (
        {"key": "other", "operator": "Exists"},)


@pytest.mark.parametrize("requirement,place,fragment", [
    ({"key": "a", "operator": "In"}, "values", "needs at least one value"),
    ({"key": "a", "operator": "NotIn", "values": []}, "values", "needs at least one value"),
    ({"key": "a", "operator": "Exists", "values": ["x"]}, "values", "takes no values"),
    ({"key": "a", "operator": "DoesNotExist", "values": ["x"]}, "values", "takes no values"),
    ({"key": "a", "operator": "Gt", "values": ["1", "2"]}, "values", "exactly one value"),
    ({"key": "a", "operator": "Lt"}, "values", "exactly one value"),
    ({"key": "a", "operator": "Gt", "values": ["big"]}, "values[0]", "compares integers"),
    ({"key": "a", "operator": "Near", "values": ["x"]}, "operator", "expected one of In"),
    ({"key": "bad key!", "operator": "Exists"}, "key", "not a valid node label key"),
])
def test_invalid_requirements(requirement: dict[str, Any], place: str, fragment: str) -> None:
    data = base()
    _pod_label(data)["node-requirements"] = [{"key": "ok", "operator": "Exists"}, requirement]
    assert_problem(data, f"{POD}.node-requirements[1].{place}", fragment)


@pytest.mark.parametrize("toleration,place,fragment", [
    ({"key": "a", "operator": "Exists", "value": "x"}, "value", "must be empty"),
    ({"value": "x"}, "operator", "must be Exists when no key"),
    ({"key": "a", "value": "x", "effect": "NoSchedule", "tolerationSeconds": 5},
     "tolerationSeconds", "only applies to effect: NoExecute"),
    ({"key": "a", "effect": "Sometimes"}, "effect", "expected one of NoSchedule"),
    ({"key": "a", "operator": "Like"}, "operator", "expected one of Equal, Exists"),
    ({"key": "a", "value": "not valid!"}, "value", "not a valid taint value"),
])
def test_invalid_tolerations(toleration: dict[str, Any], place: str, fragment: str) -> None:
    data = base()
    _pod_label(data)["tolerations"] = [toleration]
    assert_problem(data, f"{POD}.tolerations[0].{place}", fragment)


def test_invalid_defaults_name_the_pool_and_provider() -> None:
    data = base()
    at(data, "pool")["default-label-node-requirements"] = [{"key": "a", "operator": "In"}]
    at(data, "provider")["default-label-tolerations"] = [{"key": "a", "operator": "Exists",
                                                          "value": "v"}]
    assert_problem(data, f"{POOL}.default-label-node-requirements[0].values")
    assert_problem(data, f"{PROVIDER}.default-label-tolerations[0].value")


def test_preferred_weight_range_and_pod_only() -> None:
    data = base()
    _pod_label(data)["preferred-node-requirements"] = [
        {"key": "a", "operator": "Exists", "weight": 0}]
    assert_problem(data, f"{POD}.preferred-node-requirements[0].weight", "at least 1")
    data = base()
    at(data, "nslabel")["tolerations"] = [GPU_TOLERATION]
    assert_problem(data, f"{prefix('nslabel')}.tolerations", "only applies to type: pod")
    data = base()
    at(data, "speclabel")["node-requirements"] = [{"key": "a", "operator": "Exists"}]
    assert_problem(data, f"{prefix('speclabel')}.node-requirements", "cannot be combined")
