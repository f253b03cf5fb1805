"""Pure manifest builders: every label key of both types and both pod forms.

Aspects: naming (namespace per attempt, parse-back, pod/container names), labels
(static, dynamic with errors skipped, ownership, sanitising), access objects (service
account, token secret, RBAC rules per type incl. apps/batch groups and pods/log, binding),
pod form A per key (resources formatting, gpu, env, node-selector, scheduler-name,
privileged, volumes, mounts, restartPolicy inside spec), form B verbatim and not mutated.
"""

from __future__ import annotations

import json
import logging
from types import MappingProxyType

import pytest

from nodepool_k8s.driver.base import RequestInfo
from nodepool_k8s.driver.kubernetes import manifests as m
from tests.kubernetes.factories import make_label, make_provider, make_spec


def _rules_by_group(rules: list[dict]) -> dict[str, dict[str, set[str]]]:
    out: dict[str, dict[str, set[str]]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault(group, {}).setdefault(resource, set()).update(rule["verbs"])
    return out


# -- naming ------------------------------------------------------------------------------------

def test_namespace_name_first_attempt_is_pool_and_node_id() -> None:
    assert m.namespace_name("main", "0000000000") == "main-0000000000"


def test_namespace_name_is_fresh_per_attempt_and_suffix() -> None:
    names = {m.namespace_name("main", "0000000042", attempt) for attempt in (1, 2, 3)}
    names.add(m.namespace_name("main", "0000000042", 2, suffix="ra1b2c3"))
    assert len(names) == 4
    assert m.namespace_name("main", "0000000042", 2) == "main-0000000042-2"


@pytest.mark.parametrize("attempt,suffix", [(1, ""), (2, ""), (5, "rbeef01"), (1, "r123456")])
def test_namespace_name_parses_back(attempt: int, suffix: str) -> None:
    name = m.namespace_name("main", "0000000042", attempt, suffix)
    assert m.parse_namespace_name(name) == ("main", "0000000042", attempt)


def test_namespace_name_sanitises_and_keeps_node_id_when_truncating() -> None:
    name = m.namespace_name("My_Pool." + "x" * 80, "0000000042", 3)
    assert len(name) <= 63
    assert name.endswith("-0000000042-3")
    assert name.startswith("my-pool-")
    assert m.parse_namespace_name(name)[1:] == ("0000000042", 3)


def test_parse_namespace_name_with_digits_in_pool() -> None:
    assert m.parse_namespace_name("pool-1-0000000042-2") == ("pool-1", "0000000042", 2)
    assert m.parse_namespace_name("pool-1-0000000042") == ("pool-1", "0000000042", 1)


def test_parse_namespace_name_rejects_foreign_names() -> None:
    assert m.parse_namespace_name("kube-system") is None
    assert m.parse_namespace_name("default") is None


def test_pod_name_is_label_name_or_sanitised() -> None:
    assert m.pod_name(make_label("pod-fedora")) == "pod-fedora"
    assert m.pod_name(make_label("Pod_Fedora")) == "pod-fedora"


def test_label_value_sanitising() -> None:
    assert m.label_value("tenant-1") == "tenant-1"
    assert m.label_value("a b/c") == "a_b_c"
    assert m.label_value("-x-") == "x"
    assert len(m.label_value("v" * 100)) == 63
    assert m.label_value("") == ""


# -- labels ------------------------------------------------------------------------------------

def test_object_labels_merge_static_dynamic_and_ownership() -> None:
    label = make_label("k8s-ns", "namespace", labels={"team": "ci", "nodepool_node_id": "x"},
                       dynamic_labels={"tenant": "{request.tenant_name}",
                                       "req": "{request[id]}"})
    provider = make_provider(label)
    labels = m.object_labels(make_spec(provider, "k8s-ns", node_id="0000000009"))
    assert labels == {
        "team": "ci", "tenant": "tenant-1", "req": "200-0000000007",
        "nodepool_node_id": "0000000009", "nodepool_provider_name": "kubespray",
        "nodepool_pool_name": "main", "nodepool_node_label": "k8s-ns",
        "nodepool_installation_id": "default",
    }


def test_dynamic_label_errors_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    templates = {"ok": "{request.event_id}", "bad": "{request.nope}", "worse": "{oops",
                 "missing": "{other}"}
    with caplog.at_level(logging.WARNING):
        out = m.format_dynamic_labels(templates, RequestInfo(id="1", event_id="ev"))
    assert out == {"ok": "ev"}
    assert caplog.text.count("Skipping dynamic label") == 3


def test_dynamic_label_values_are_sanitised() -> None:
    label = make_label("k8s-ns", "namespace",
                       dynamic_labels={"who": "{request.requestor}"})
    spec = make_spec(make_provider(label), "k8s-ns",
                     request=RequestInfo(id="1", requestor="zuul system/abc"))
    assert m.object_labels(spec)["who"] == "zuul_system_abc"


# -- access objects ----------------------------------------------------------------------------

def test_service_account_and_token_request() -> None:
    labels = {"nodepool_provider_name": "p"}
    sa = m.service_account_body("main-0", labels)
    assert sa["metadata"] == {"name": "zuul-worker", "namespace": "main-0", "labels": labels}
    request = m.token_request_body(3600)
    assert request["kind"] == "TokenRequest"
    assert request["spec"] == {"audiences": ["https://kubernetes.default.svc.cluster.local"],
                               "expirationSeconds": 3600}


def test_namespace_role_grants_core_apps_and_batch() -> None:
    role = m.role_body("ns", make_label("n", "namespace"), {})
    assert role["metadata"]["name"] == "zuul"
    rules = _rules_by_group(role["rules"])
    full = {"create", "delete", "get", "list", "patch", "update", "watch"}
    for resource in ("pods", "pods/exec", "pods/portforward", "services", "configmaps",
                     "persistentvolumeclaims"):
        assert rules[""][resource] == full, resource
    for resource in ("pods/log", "endpoints", "events"):
        assert rules[""][resource] == {"get", "list", "watch"}, resource
    for resource in ("deployments", "replicasets", "statefulsets", "daemonsets"):
        assert rules["apps"][resource] == full
    for resource in ("jobs", "cronjobs"):
        assert rules["batch"][resource] == full
    # Non-core kinds are never listed under the core group (Nodepool's mistake).
    assert not {"jobs", "deployments", "replicasets", "crontabs"} & set(rules[""])
    # A job cannot widen its own rights.
    assert "rbac.authorization.k8s.io" not in rules


# Kubernetes' built-in `edit` ClusterRole (1.22 and later, aggregated rules, namespaced
# resources only) less what mints credentials: serviceaccounts (create one, then a token
# Secret for it), serviceaccounts/token and impersonate. Secrets stay: a job may get them
# with `allow-job-secrets`, and etc/kubernetes/job-policy.yaml refuses token Secrets.
_WRITE = {"create", "delete", "deletecollection", "patch", "update", "get", "list", "watch"}
_READ = {"get", "list", "watch"}
EDIT_WITHOUT_MINTING: dict[tuple[str, str], set[str]] = {
    **{("", r): _WRITE for r in (
        "pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "configmaps",
        "events", "persistentvolumeclaims", "replicationcontrollers",
        "replicationcontrollers/scale", "secrets", "services", "services/proxy")},
    ("", "pods/eviction"): {"create"},
    **{("", r): _READ for r in (
        "endpoints", "pods/log", "pods/status", "limitranges", "resourcequotas", "bindings",
        "namespaces", "persistentvolumeclaims/status", "services/status")},
    ("discovery.k8s.io", "endpointslices"): _READ,
    **{("apps", r): _WRITE for r in (
        "daemonsets", "deployments", "deployments/rollback", "deployments/scale",
        "replicasets", "replicasets/scale", "statefulsets", "statefulsets/scale")},
    **{("batch", r): _WRITE for r in ("jobs", "cronjobs")},
}


@pytest.mark.parametrize("type_,secrets", [("namespace", False), ("namespace", True),
                                           ("pod", False)])
def test_job_role_is_within_edit_without_token_minting(type_: str, secrets: bool) -> None:
    rules = m.role_rules(make_label("l", type_, allow_job_secrets=secrets))
    wider = sorted(f"{verb} {group}/{resource}" for group, by_resource
                   in _rules_by_group(rules).items() for resource, verbs in by_resource.items()
                   for verb in verbs - EDIT_WITHOUT_MINTING.get((group, resource), set()))
    assert wider == []


def test_no_endpoint_writes_and_secrets_only_when_allowed() -> None:
    for secrets in (False, True):
        rules = _rules_by_group(m.role_rules(make_label("n", "namespace",
                                                        allow_job_secrets=secrets)))
        assert rules[""]["endpoints"] == _READ
        assert rules["discovery.k8s.io"]["endpointslices"] == _READ
        assert not {"serviceaccounts", "serviceaccounts/token"} & set(rules[""])
        assert ("secrets" in rules[""]) is secrets
    assert m.role_rules(make_label("n", "namespace")) == m.NAMESPACE_RULES
    assert m.role_rules(make_label("n", "namespace", allow_job_secrets=True)) \
        == m.NAMESPACE_RULES_WITH_SECRETS
    # Only namespace labels: a pod label's job never gets secrets.
    assert "secrets" not in _rules_by_group(
        m.role_rules(make_label("p", "pod", allow_job_secrets=True)))[""]


def test_pod_role_is_restricted_and_names_pods_log() -> None:
    role = m.role_body("ns", make_label(), {})
    assert role["metadata"]["name"] == "zuul-restricted"
    rules = _rules_by_group(role["rules"])
    assert set(rules) == {""}
    assert rules[""]["pods"] == {"get", "list", "watch"}
    assert rules[""]["pods/exec"] == {"create", "get"}
    assert rules[""]["pods/portforward"] == {"create", "get"}
    assert "get" in rules[""]["pods/log"]
    assert "pods/logs" not in rules[""]


def test_role_rules_are_copies() -> None:
    rules = m.role_rules(make_label())
    rules[0]["verbs"].append("delete")
    rules[0]["resources"].append("nodes")
    assert "delete" not in m.POD_RULES[0]["verbs"]
    assert "nodes" not in m.POD_RULES[0]["resources"]


@pytest.mark.parametrize("type_,rules", [("namespace", m.NAMESPACE_RULES),
                                         ("pod", m.POD_RULES)])
def test_role_rules_equal_the_constants_and_are_flat(type_: str, rules: list) -> None:
    assert m.role_rules(make_label("l", type_)) == rules
    # The copy is one level deep: a nested mapping in a rule would be shared.
    assert all(isinstance(v, (str, list)) and all(isinstance(x, str) for x in
               (v if isinstance(v, list) else [v])) for rule in rules for v in rule.values())


@pytest.mark.parametrize("type_,role", [("namespace", "zuul"), ("pod", "zuul-restricted")])
def test_role_binding(type_: str, role: str) -> None:
    binding = m.role_binding_body("main-1", make_label("l", type_), {})
    assert binding["metadata"]["name"] == "zuul-role"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "zuul-worker",
                                    "namespace": "main-1"}]


# -- pod form A --------------------------------------------------------------------------------

def test_minimal_pod_form_a() -> None:
    pod = m.pod_body("main-0", make_label("pod-fedora", image="fedora:40"), {"a": "b"})
    assert pod["metadata"] == {"name": "pod-fedora", "namespace": "main-0", "labels": {"a": "b"}}
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"  # inside the spec, not beside it
    assert "restartPolicy" not in pod
    assert spec["containers"] == [{
        "name": "pod-fedora", "image": "fedora:40", "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c"], "args": ["while true; do sleep 30; done;"],
    }]
    for key in ("nodeSelector", "schedulerName", "volumes"):
        assert key not in spec


def test_pod_form_a_every_key() -> None:
    label = make_label(
        "pod-gpu", image="cuda:12", image_pull="Always", cpu=2, memory=1024, storage=10,
        cpu_limit=4, memory_limit=2048, storage_limit=20, gpu=1.0, gpu_resource="nvidia.com/gpu",
        env=({"name": "FOO", "value": "bar"},), node_selector={"disk": "ssd"},
        scheduler_name="custom-scheduler", privileged=True,
        volumes=({"name": "cache", "emptyDir": {}},),
        volume_mounts=({"name": "cache", "mountPath": "/cache"},),
        annotations={"owner": "ci"}, labels={"team": "ci"})
    pod = m.pod_body("main-0", label, {"team": "ci"})
    assert pod["metadata"]["annotations"] == {"owner": "ci"}
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "1024Mi", "ephemeral-storage": "10M",
                     "nvidia.com/gpu": "1"},
        "limits": {"cpu": "4", "memory": "2048Mi", "ephemeral-storage": "20M",
                   "nvidia.com/gpu": "1"},
    }
    assert container["env"] == [{"name": "FOO", "value": "bar"}]
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": "/cache"}]
    assert container["securityContext"] == {"privileged": True}
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["schedulerName"] == "custom-scheduler"
    assert spec["volumes"] == [{"name": "cache", "emptyDir": {}}]
    assert spec["restartPolicy"] == "Never"
    json.dumps(pod)  # JSON-ready


def test_fractional_cpu_and_privileged_false() -> None:
    label = make_label(cpu=0.5, cpu_limit=1.25, privileged=False)
    container = m.pod_spec(label)["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "0.5"}, "limits": {"cpu": "1.25"}}
    assert container["securityContext"] == {"privileged": False}


def test_gpu_needs_a_resource_name() -> None:
    container = m.pod_spec(make_label(gpu=1.0))["containers"][0]
    assert "resources" not in container


def test_pod_form_a_does_not_share_config_objects() -> None:
    env = ({"name": "A", "value": "1"},)
    label = make_label(env=env, volumes=({"name": "v", "emptyDir": {}},))
    spec = m.pod_spec(label)
    spec["containers"][0]["env"][0]["value"] = "changed"
    spec["volumes"][0]["emptyDir"]["medium"] = "Memory"
    assert env[0]["value"] == "1"
    assert label.volumes[0]["emptyDir"] == {}


# -- pod form B --------------------------------------------------------------------------------

def test_pod_form_b_is_verbatim_deep_copy() -> None:
    raw = {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "inf"],
                           "ports": ({"containerPort": 80},)}],
           "restartPolicy": "OnFailure", "hostNetwork": True}
    label = make_label("pod-raw", spec=MappingProxyType(raw), labels={"x": "y"},
                       annotations={"a": "b"})
    pod = m.pod_body("main-0", label, {"x": "y"})
    assert pod["spec"] == {"containers": [{"name": "main", "image": "busybox",
                                           "command": ["sleep", "inf"],
                                           "ports": [{"containerPort": 80}]}],
                           "restartPolicy": "OnFailure", "hostNetwork": True}
    assert pod["metadata"]["name"] == "pod-raw"
    assert pod["metadata"]["annotations"] == {"a": "b"}
    pod["spec"]["containers"][0]["command"].append("x")
    assert raw["containers"][0]["command"] == ["sleep", "inf"]


def test_namespace_body() -> None:
    body = m.namespace_body("main-0000000000", {"nodepool_node_id": "0000000000"})
    assert body == {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": "main-0000000000",
                                 "labels": {"nodepool_node_id": "0000000000"}}}


def test_provider_selector_names_the_installation() -> None:
    assert m.provider_selector("kube spray", "zk-abc") == (
        "nodepool_provider_name=kube_spray,nodepool_installation_id=zk-abc")


def test_ownership_problem() -> None:
    def ns(**labels: str) -> dict[str, object]:
        return {"metadata": {"name": "x", "labels": labels}}
    ours = ns(nodepool_provider_name="p", nodepool_installation_id="i",
              nodepool_node_id="0000000001")
    assert m.ownership_problem(ours, "p", "i") is None
    assert m.ownership_problem(ours, "p", "i", "0000000001") is None
    assert "nodepool_node_id" in str(m.ownership_problem(ours, "p", "i", "0000000002"))
    assert "nodepool_installation_id" in str(m.ownership_problem(ours, "p", "other"))
    assert "nodepool_provider_name" in str(m.ownership_problem(ours, "q", "i"))
    assert m.ownership_problem({"metadata": {"name": "kube-system"}}, "p", "i") is not None
    # The installation label alone is not enough: the provider must match too.
    assert m.ownership_problem(ns(nodepool_installation_id="i"), "p", "i") is not None


@pytest.mark.parametrize("obj", [
    {"metadata": {"labels": ["nodepool_provider_name", "x"]}},
    {"metadata": ["labels"]}, {"metadata": "x"}, ["not", "an", "object"], "text", None,
])
def test_ownership_of_a_misshapen_answer_is_a_refusal_not_an_error(obj: object) -> None:
    """An API answer with labels as a list raised AttributeError in every deletion attempt
    (a traceback each time) and would have stopped the provider's leak sweep."""
    problem = m.ownership_problem(obj, "p", "inst", "0000000001")  # type: ignore[arg-type]
    assert isinstance(problem, str) and problem
