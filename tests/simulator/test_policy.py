"""ValidatingAdmissionPolicy and the object-count quotas, through the official client.

Aspects: a bound policy refuses writes it does not admit (CREATE and UPDATE), in the
namespaces its selectors match only, with the real server's message and status (403 with
reason Forbidden, else 422); a binding without Deny or to a missing policy refuses
nothing; an evaluation error refuses under failurePolicy Fail and not under Ignore; a
policy whose CEL the simulator does not model is refused at creation (never silently
unenforced). Quotas count secrets, configmaps, persistent volume claims and their storage;
a quota's status follows the objects it counts and its spec.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import policy
from tests.helpers import Signal
from tests.simulator.conftest import Kube


def _admission(kube: Kube) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(kube.api)


def _policy(expression: str, name: str = "p", reason: str | None = "Forbidden",
            failure: str = "Fail", **validation: Any) -> dict[str, Any]:
    check: dict[str, Any] = {"expression": expression, **validation}
    if reason:
        check["reason"] = reason
    return {"metadata": {"name": name}, "spec": {
        "failurePolicy": failure,
        "matchConstraints": {"resourceRules": [{
            "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["configmaps"]}]},
        "validations": [check]}}


def _binding(policy_name: str = "p", actions: tuple[str, ...] = ("Deny",),
             selector: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy_name, "validationActions": list(actions)}
    if selector is not None:
        spec["matchResources"] = {"namespaceSelector": selector}
    return {"metadata": {"name": f"{policy_name}-binding"}, "spec": spec}


def _refusal(call: Any) -> tuple[int, str]:
    with pytest.raises(ApiException) as refused:
        call()
    return refused.value.status, json.loads(refused.value.body)["message"]


def _cm(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": data}


def test_a_bound_policy_refuses_what_it_does_not_admit(kube: Kube) -> None:
    for ns, labels in (("guarded", {"fenced": "yes"}), ("open", {})):
        kube.core.create_namespace({"metadata": {"name": ns, "labels": labels}})
    admission = _admission(kube)
    admission.create_validating_admission_policy(_policy(
        '!has(object.data) || !("forbidden" in object.data)', message="no forbidden key"))
    admission.create_validating_admission_policy_binding(_binding(selector={
        "matchExpressions": [{"key": "fenced", "operator": "Exists"}]}))
    kube.core.create_namespaced_config_map("guarded", _cm("fine", allowed="1"))
    status, message = _refusal(lambda: kube.core.create_namespaced_config_map(
        "guarded", _cm("bad", forbidden="1")))
    assert status == 403
    assert message == ('configmaps "bad" is forbidden: ValidatingAdmissionPolicy \'p\' with'
                       " binding 'p-binding' denied request: no forbidden key")
    # UPDATE is admitted too; other namespaces are not the binding's.
    status, _ = _refusal(lambda: kube.core.patch_namespaced_config_map(
        "fine", "guarded", {"data": {"forbidden": "1"}}))
    assert status == 403
    kube.core.create_namespaced_config_map("open", _cm("bad", forbidden="1"))
    # Other kinds are not the policy's.
    kube.core.create_namespaced_secret("guarded", {"metadata": {"name": "s"},
                                                   "stringData": {"forbidden": "1"}})


def test_default_reason_is_invalid_and_message_names_the_expression(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    admission = _admission(kube)
    admission.create_validating_admission_policy(_policy("size(object.data) < 2",
                                                         reason=None))
    admission.create_validating_admission_policy_binding(_binding())
    status, message = _refusal(lambda: kube.core.create_namespaced_config_map(
        "ns", _cm("two", a="1", b="2")))
    assert status == 422
    assert message.endswith("denied request: failed expression: size(object.data) < 2")


def test_warn_only_bindings_and_missing_policies_refuse_nothing(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    admission = _admission(kube)
    admission.create_validating_admission_policy(_policy("false"))
    admission.create_validating_admission_policy_binding(_binding(actions=("Warn",)))
    admission.create_validating_admission_policy_binding(_binding("missing"))
    kube.core.create_namespaced_config_map("ns", _cm("anything"))


@pytest.mark.parametrize("failure,refused", [("Fail", True), ("Ignore", False)])
def test_evaluation_errors_follow_the_failure_policy(kube: Kube, failure: str,
                                                     refused: bool) -> None:
    kube.core.create_namespace({"metadata": {"name": "ns"}})
    admission = _admission(kube)
    admission.create_validating_admission_policy(_policy('object.data.key == "x"',
                                                         failure=failure))
    admission.create_validating_admission_policy_binding(_binding())
    if refused:
        status, message = _refusal(lambda: kube.core.create_namespaced_config_map(
            "ns", _cm("none")))
        assert status == 422 and "resulted in error: no such key:" in message
    else:
        kube.core.create_namespaced_config_map("ns", _cm("none"))


@pytest.mark.parametrize("expression", [
    "object.metadata.name.matches('x')",     # a CEL function the simulator lacks
    "object.data.all(k, k != 'x')",           # macros
    "params.limit > 1",                       # parameters
    "object.data.size() > 1 ? true : false",  # the conditional operator
])
def test_cel_the_simulator_does_not_model_is_refused_at_creation(kube: Kube,
                                                                 expression: str) -> None:
    status, message = _refusal(lambda: _admission(kube).create_validating_admission_policy(
        _policy(expression)))
    assert status == 422 and "spec.validations[0].expression" in message


def test_the_cel_subset() -> None:
    variables = {"object": {"type": "Opaque", "n": 3, "items": ["a", "b"],
                            "meta": {"name": "job-1"}}}
    for text, expected in (
            ('object.type != "kubernetes.io/service-account-token"', True),
            ("object.n >= 3 && object.n < 4", True),
            ("!(object.n == 3) || object.items[1] == 'b'", True),
            ("'a' in object.items && !('c' in object.items)", True),
            ('object.meta.name.startsWith("job-") && size(object.items) == 2', True),
            ("has(object.meta.name) && !has(object.meta.namespace)", True),
            ("object.items.size() == 2 && object.meta.name.contains('b-')", True),
            ("[1, 2] == [1, 2] && null == null", True)):
        assert policy.evaluate(policy.compile_expression(text), variables) is expected, text


def test_quota_counts_secrets_configmaps_and_claims(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "q"}})
    kube.core.create_namespaced_resource_quota("q", {"metadata": {"name": "counts"}, "spec": {
        "hard": {"secrets": "1", "persistentvolumeclaims": "2", "requests.storage": "1Gi"}}})
    kube.core.create_namespaced_secret("q", {"metadata": {"name": "one"}})
    status, message = _refusal(lambda: kube.core.create_namespaced_secret(
        "q", {"metadata": {"name": "two"}}))
    assert status == 403 and message.startswith(
        'secrets "two" is forbidden: exceeded quota: counts, requested: secrets=1, used:'
        " secrets=1, limited: secrets=1")

    def claim(name: str, size: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}
    kube.core.create_namespaced_persistent_volume_claim("q", claim("a", "600Mi"))
    status, message = _refusal(lambda: kube.core.create_namespaced_persistent_volume_claim(
        "q", claim("b", "600Mi")))
    assert status == 403 and "requests.storage" in message
    kube.core.create_namespaced_persistent_volume_claim("q", claim("b", "400Mi"))
    status, message = _refusal(lambda: kube.core.create_namespaced_persistent_volume_claim(
        "q", claim("c", "1Mi")))
    assert status == 403 and "persistentvolumeclaims=2" in message
    # A pod's requests are not claims' storage: no "must specify requests.storage".
    kube.core.create_namespaced_pod("q", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "busybox"}]}})


def test_quota_status_follows_the_objects_and_the_spec(kube: Kube, changes: Signal) -> None:
    """`status.used` was computed once, when the quota was written: a watch on it (capacity
    awareness' `resource-quota`) never saw pods come or go, nor `hard` change."""
    kube.core.create_namespace({"metadata": {"name": "q"}})
    kube.core.create_namespaced_resource_quota("q", {"metadata": {"name": "share"}, "spec": {
        "hard": {"requests.cpu": "2", "pods": "5"}}})

    def status() -> dict[str, Any]:
        found = kube.core.read_namespaced_resource_quota("share", "q").status
        return {"hard": dict(found.hard or {}), "used": dict(found.used or {})}
    kube.core.create_namespaced_pod("q", {"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "1500m"}}}]}})
    changes.until(lambda: status()["used"] == {"requests.cpu": "1.5", "pods": "1"},
                  message="used to count the pod")
    kube.core.patch_namespaced_resource_quota("share", "q", {"spec": {"hard": {
        "requests.cpu": "4", "pods": "5"}}})
    changes.until(lambda: status()["hard"] == {"requests.cpu": "4", "pods": "5"},
                  message="hard to follow the spec")
    kube.core.delete_namespaced_pod("p", "q", grace_period_seconds=0)
    changes.until(lambda: status()["used"] == {"requests.cpu": "0", "pods": "0"},
                  message="used to drop with the pod")
