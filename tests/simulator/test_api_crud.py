"""CRUD for every served resource, error bodies and validation, through the official client."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.simulator.conftest import Kube, existing, pod_body, token_secret_body


def status_of(exc: ApiException) -> dict:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure" and body["code"] == exc.status
    return body


def test_namespace_crud_and_metadata(kube: Kube) -> None:
    ns = kube.core.create_namespace({"metadata": {"name": "alpha", "labels": {"team": "a"}}})
    assert ns.kind == "Namespace" and ns.api_version == "v1"
    assert ns.status.phase == "Active"
    assert ns.metadata.uid and int(ns.metadata.resource_version) > 0
    assert ns.metadata.creation_timestamp is not None
    assert ns.metadata.labels == {"team": "a", "kubernetes.io/metadata.name": "alpha"}
    got = kube.core.read_namespace("alpha")
    assert got.metadata.uid == ns.metadata.uid
    listed = kube.core.list_namespace()
    assert listed.kind == "NamespaceList"
    assert int(listed.metadata.resource_version) >= int(ns.metadata.resource_version)
    assert {"alpha", "default", "kube-system"} <= {n.metadata.name for n in listed.items}
    patched = kube.core.patch_namespace("alpha", {"metadata": {"labels": {"team": "b"}}})
    assert patched.metadata.labels["team"] == "b"
    assert int(patched.metadata.resource_version) > int(ns.metadata.resource_version)
    current = kube.core.read_namespace("alpha")
    current.metadata.annotations = {"note": "x"}
    replaced = kube.core.replace_namespace("alpha", current)
    assert replaced.metadata.annotations == {"note": "x"}


def test_resource_versions_are_one_global_counter(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "rv"}})
    a = kube.core.create_namespaced_config_map("rv", {"metadata": {"name": "a"}})
    b = kube.core.create_namespaced_service_account("rv", {"metadata": {"name": "b"}})
    assert int(b.metadata.resource_version) == int(a.metadata.resource_version) + 1
    assert k8s_sim.resource_version == int(b.metadata.resource_version)


def test_pod_crud_defaults_and_generation(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "p"}})
    pod = kube.core.create_namespaced_pod("p", pod_body("web"))
    assert pod.kind == "Pod" and pod.metadata.generation == 1
    assert pod.spec.restart_policy == "Always"
    assert pod.spec.containers[0].image_pull_policy == "IfNotPresent"
    assert pod.status.phase == "Pending"
    body = pod_body("latest", image="busybox")
    body["restartPolicy"] = "Never"  # top-level: an unknown field, not the spec's policy
    pod2 = kube.core.create_namespaced_pod("p", body)
    assert pod2.spec.restart_policy == "Always"
    assert pod2.spec.containers[0].image_pull_policy == "Always"
    patched = kube.core.patch_namespaced_pod(
        "web", "p", {"spec": {"activeDeadlineSeconds": 60}})
    assert patched.metadata.generation == 2
    labelled = kube.core.patch_namespaced_pod("web", "p", {"metadata": {"labels": {"x": "y"}}})
    assert labelled.metadata.generation == 2
    assert [p.metadata.name for p in kube.core.list_namespaced_pod("p").items] == [
        "latest", "web"]
    kube.core.delete_namespaced_pod("web", "p")
    with pytest.raises(ApiException) as info:
        kube.core.read_namespaced_pod("web", "p")
    assert info.value.status == 404


def test_pod_status_is_kept_on_update_but_written_via_status(kube: Kube, changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "st"}})
    kube.core.create_namespaced_pod("st", pod_body("p"))
    changes.until(lambda: kube.core.read_namespaced_pod("p", "st").status.phase == "Running")
    kube.core.patch_namespaced_pod("p", "st", {"status": {"phase": "Failed"}})
    assert kube.core.read_namespaced_pod("p", "st").status.phase == "Running"
    kube.core.patch_namespaced_pod_status("p", "st", {"status": {"phase": "Failed"}})
    assert kube.core.read_namespaced_pod_status("p", "st").status.phase == "Failed"


def test_serviceaccount_secret_configmap_crud(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "c"}})
    sa = kube.core.create_namespaced_service_account("c", {"metadata": {"name": "worker"}})
    assert sa.kind == "ServiceAccount"
    # No token secret is created for a service account (Kubernetes >= 1.24).
    assert kube.core.list_namespaced_secret("c").items == []
    secret = kube.core.create_namespaced_secret(
        "c", {"metadata": {"name": "s"}, "stringData": {"user": "bob"}})
    assert secret.type == "Opaque" and secret.string_data is None
    assert base64.b64decode(secret.data["user"]) == b"bob"
    cm = kube.core.create_namespaced_config_map("c", {"metadata": {"name": "cm"},
                                                      "data": {"a": "1"}})
    cm.data["b"] = "2"
    cm = kube.core.replace_namespaced_config_map("cm", "c", cm)
    assert cm.data == {"a": "1", "b": "2"}
    sa = kube.core.patch_namespaced_service_account(
        "worker", "c", {"automountServiceAccountToken": False})
    assert sa.automount_service_account_token is False
    status = kube.core.delete_namespaced_config_map("cm", "c")
    assert status.status == "Success" and status.details.name == "cm"
    kube.core.delete_namespaced_secret("s", "c")
    kube.core.delete_namespaced_service_account("worker", "c")
    assert kube.core.list_namespaced_service_account("c").items == []
    assert kube.core.list_namespaced_config_map("c").items == []


def test_rbac_role_and_binding_crud(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "r"}})
    role = kube.rbac.create_namespaced_role("r", {
        "metadata": {"name": "zuul"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"],
                   "verbs": ["get", "list"]}]})
    assert role.kind == "Role" and role.api_version == "rbac.authorization.k8s.io/v1"
    binding = kube.rbac.create_namespaced_role_binding("r", {
        "metadata": {"name": "zuul-role"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "zuul"},
        "subjects": [{"kind": "ServiceAccount", "name": "w", "namespace": "r"}],
        "userNames": ["system:serviceaccount:r:w"]})  # OpenShift-only field: kept
    assert binding.role_ref.name == "zuul"
    role.rules[0].verbs.append("watch")
    assert kube.rbac.replace_namespaced_role("zuul", "r", role).rules[0].verbs == [
        "get", "list", "watch"]
    assert [b.metadata.name for b in kube.rbac.list_namespaced_role_binding("r").items] == [
        "zuul-role"]
    with pytest.raises(ApiException) as info:
        kube.rbac.patch_namespaced_role_binding("zuul-role", "r",
                                                {"roleRef": {"name": "other"}})
    assert info.value.status == 422
    kube.rbac.delete_namespaced_role_binding("zuul-role", "r")
    kube.rbac.delete_namespaced_role("zuul", "r")
    assert kube.rbac.list_namespaced_role("r").items == []


def test_token_request_subresource(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "tr"}})
    kube.core.create_namespaced_service_account("tr", {"metadata": {"name": "w"}})
    response = kube.core.create_namespaced_service_account_token(
        "w", "tr", {"spec": {"audiences": ["zuul"], "expirationSeconds": 600}})
    assert response.kind == "TokenRequest"
    assert response.status.token.count(".") == 2
    assert response.spec.audiences == ["zuul"]
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_service_account_token("missing", "tr", {"spec": {}})
    assert info.value.status == 404


def test_not_found_and_already_exists_bodies(kube: Kube) -> None:
    with pytest.raises(ApiException) as info:
        kube.core.read_namespace("nope")
    body = status_of(info.value)
    assert info.value.status == 404 and info.value.reason == "Not Found"
    assert body["reason"] == "NotFound"
    assert body["message"] == 'namespaces "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "namespaces"}
    kube.core.create_namespace({"metadata": {"name": "dup"}})
    with pytest.raises(ApiException) as info:
        kube.core.create_namespace({"metadata": {"name": "dup"}})
    body = status_of(info.value)
    assert info.value.status == 409 and body["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as info:
        kube.rbac.read_namespaced_role("x", "dup")
    assert status_of(info.value)["message"] == \
        'roles.rbac.authorization.k8s.io "x" not found'


def test_create_in_missing_namespace_is_404(kube: Kube) -> None:
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_config_map("ghost", {"metadata": {"name": "x"}})
    body = status_of(info.value)
    assert info.value.status == 404
    assert body["details"] == {"name": "ghost", "kind": "namespaces"}


def test_conflict_on_stale_resource_version(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "cf"}})
    cm = kube.core.create_namespaced_config_map("cf", {"metadata": {"name": "c"}})
    kube.core.patch_namespaced_config_map("c", "cf", {"data": {"a": "1"}})
    cm.data = {"b": "2"}
    with pytest.raises(ApiException) as info:
        kube.core.replace_namespaced_config_map("c", "cf", cm)
    body = status_of(info.value)
    assert info.value.status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


@pytest.mark.parametrize("body,field", [
    ({"metadata": {"name": "Bad_Name"}}, "metadata.name"),
    ({"metadata": {"name": "x" * 64}}, "metadata.name"),
    ({"metadata": {"name": "ok", "labels": {"k": "bad value!"}}}, "metadata.labels"),
    # Go's regexp `$` ends the text; Python's would let a trailing newline through.
    ({"metadata": {"name": "nl\n"}}, "metadata.name"),
    ({"metadata": {"name": "ok", "labels": {"k": "v\n"}}}, "metadata.labels"),
    ({"metadata": {"name": "ok", "labels": {"k\n": "v"}}}, "metadata.labels"),
    ({"metadata": {"name": "ok", "annotations": {"k": "v" * 256 * 1024}}},
     "metadata.annotations"),
])
def test_invalid_namespace(kube: Kube, body: dict, field: str) -> None:
    with pytest.raises(ApiException) as info:
        kube.core.create_namespace(body)
    status = status_of(info.value)
    assert info.value.status == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == field


def _with_resources(name: str, resources: dict) -> dict:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}}


TWICE = [{"name": "v", "mountPath": "/x"}, {"name": "v", "mountPath": "/x"}]


def test_invalid_pods(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "v"}})
    cases = [
        ({"metadata": {"name": "a"}, "spec": {"containers": []}}, "spec.containers"),
        ({"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c"}]}},
         "spec.containers[0].image"),
        ({"metadata": {"name": "c"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"cpu": "2"},
                                                      "limits": {"cpu": "1"}}}]}},
         "spec.containers[0].resources.requests"),
        ({"metadata": {"name": "d"}, "spec": {"containers": [
            {"name": "c", "image": "i", "resources": {"requests": {"memory": "lots"}}}]}},
         "spec.containers[0].resources.requests[memory]"),
        ({"metadata": {"name": "x.y"},
          "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Sometimes"}},
         "spec.restartPolicy"),
        ({"metadata": {"name": "e\n"}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
         "metadata.name"),
        ({"metadata": {"name": "f"}, "spec": {"containers": [{"name": "c", "image": "i "}]}},
         "spec.containers[0].image"),
        ({"metadata": {"name": "g"}, "spec": {"schedulerName": "My Scheduler",
                                              "containers": [{"name": "c", "image": "i"}]}},
         "spec.schedulerName"),
        ({"metadata": {"name": "h"}, "spec": {"containers": [
            {"name": "c", "image": "i", "env": [{"name": "A=B", "value": "x"}]}]}},
         "spec.containers[0].env[0].name"),
        ({"metadata": {"name": "i"}, "spec": {"volumes": [{"name": "Bad_Name", "emptyDir": {}}],
                                              "containers": [{"name": "c", "image": "i"}]}},
         "spec.volumes[0].name"),
        ({"metadata": {"name": "j"}, "spec": {
            "volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}],
            "containers": [{"name": "c", "image": "i"}]}}, "spec.volumes[1].name"),
        ({"metadata": {"name": "k"}, "spec": {"volumes": [{"name": "v"}],
                                              "containers": [{"name": "c", "image": "i"}]}},
         "spec.volumes[0]"),
        ({"metadata": {"name": "l"}, "spec": {"containers": [
            {"name": "c", "image": "i", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}]}},
         "spec.containers[0].volumeMounts[0].name"),
        (_with_resources("n", {"requests": {"example.com/gpu": "0.5"},
                               "limits": {"example.com/gpu": "0.5"}}),
         "spec.containers[0].resources.requests[example.com/gpu]"),
        (_with_resources("o", {"requests": {"example.com/gpu": "1"}}),
         "spec.containers[0].resources.requests[example.com/gpu]"),
        (_with_resources("p", {"limits": {"gpu": "1"}}),
         "spec.containers[0].resources.limits[gpu]"),
        ({"metadata": {"name": "m"}, "spec": {"volumes": [{"name": "v", "emptyDir": {}}],
                                              "containers": [{"name": "c", "image": "i",
                                                              "volumeMounts": TWICE}]}},
         "spec.containers[0].volumeMounts[1].mountPath"),
    ]
    for body, field in cases:
        with pytest.raises(ApiException) as info:
            kube.core.create_namespaced_pod("v", body)
        status = status_of(info.value)
        assert info.value.status == 422, body
        assert status["details"]["kind"] == "Pod"
        assert field in [c["field"] for c in status["details"]["causes"]], status
    ok = pod_body("ok")
    ok["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": 1, "memory": "512Mi", "ephemeral-storage": "10M"},
        "limits": {"cpu": "1500m", "memory": "1Gi"}}
    assert kube.core.create_namespaced_pod("v", ok).status.qos_class == "Burstable"


def test_token_secret_requires_service_account_annotation(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "ts"}})
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_secret(
            "ts", {"metadata": {"name": "s"}, "type": "kubernetes.io/service-account-token"})
    assert info.value.status == 422
    kube.core.create_namespaced_secret("ts", token_secret_body("ok", "w"))


def test_secret_data_may_be_wrapped_base64(kube: Kube) -> None:
    """Line breaks inside base64 (kustomize's secretGenerator wraps at 70 columns) are
    skipped, as Go's decoder does; the value reads back unwrapped. Other junk is a 400."""
    kube.core.create_namespace({"metadata": {"name": "wb"}})
    encoded = base64.b64encode(b"x" * 120).decode()
    wrapped = "\n".join(encoded[i:i + 70] for i in range(0, len(encoded), 70)) + "\n"
    secret = kube.core.create_namespaced_secret(
        "wb", {"metadata": {"name": "s"}, "data": {"config": wrapped}})
    assert secret.data["config"] == encoded
    assert kube.core.read_namespaced_secret("s", "wb").data["config"] == encoded
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_secret(
            "wb", {"metadata": {"name": "t"}, "data": {"config": encoded[:20] + " " + encoded}})
    assert info.value.status == 400 and "illegal base64 data" in status_of(info.value)["message"]


def test_system_namespaces_cannot_be_deleted(kube: Kube) -> None:
    with pytest.raises(ApiException) as info:
        kube.core.delete_namespace("default")
    assert info.value.status == 403 and status_of(info.value)["reason"] == "Forbidden"


def test_generate_name_and_dry_run(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "g"}})
    cm = kube.core.create_namespaced_config_map("g", {"metadata": {"generateName": "cfg-"}})
    assert cm.metadata.name.startswith("cfg-") and len(cm.metadata.name) == 9
    kube.core.create_namespaced_config_map("g", {"metadata": {"name": "dry"}}, dry_run="All")
    assert k8s_sim.get("configmaps", "dry", "g") is None


def test_list_pagination(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "pg"}})
    for i in range(5):
        kube.core.create_namespaced_config_map("pg", {"metadata": {"name": f"c{i}"}})
    first = kube.core.list_namespaced_config_map("pg", limit=2)
    assert [c.metadata.name for c in first.items] == ["c0", "c1"]
    assert first.metadata.remaining_item_count == 3
    second = kube.core.list_namespaced_config_map("pg", limit=2, _continue=first.metadata._continue)
    third = kube.core.list_namespaced_config_map("pg", limit=2,
                                                 _continue=second.metadata._continue)
    assert [c.metadata.name for c in second.items + third.items] == ["c2", "c3", "c4"]
    assert third.metadata._continue is None


def test_continued_pages_keep_the_first_pages_version(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "pv"}})
    for i in range(4):
        kube.core.create_namespaced_config_map("pv", {"metadata": {"name": f"c{i}"}})
    first = kube.core.list_namespaced_config_map("pv", limit=2)
    kube.core.create_namespaced_config_map("pv", {"metadata": {"name": "c9"}})
    second = kube.core.list_namespaced_config_map("pv", limit=2,
                                                  _continue=first.metadata._continue)
    # One list, one version (the real server's snapshot): a watch from it misses nothing.
    assert second.metadata.resource_version == first.metadata.resource_version
    rest = kube.core.list_namespaced_config_map("pv", _continue=second.metadata._continue)
    assert rest.metadata.resource_version == first.metadata.resource_version


def test_continue_after_compaction_is_410_expired(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "px"}})
    for i in range(3):
        kube.core.create_namespaced_config_map("px", {"metadata": {"name": f"c{i}"}})
    first = kube.core.list_namespaced_config_map("px", limit=1)
    kube.core.create_namespaced_config_map("px", {"metadata": {"name": "c8"}})
    k8s_sim.compact()
    with pytest.raises(ApiException) as info:
        kube.core.list_namespaced_config_map("px", limit=1, _continue=first.metadata._continue)
    body = status_of(info.value)
    assert body["code"] == 410 and body["reason"] == "Expired"
    assert "continue parameter is too old" in body["message"]
    # A fresh list (no continue) works and starts again from the beginning.
    again = kube.core.list_namespaced_config_map("px", limit=1)
    assert [c.metadata.name for c in again.items] == ["c0"]


def test_delete_preconditions_and_collection(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "dc"}})
    for name, tier in (("a", "x"), ("b", "x"), ("c", "y")):
        kube.core.create_namespaced_config_map(
            "dc", {"metadata": {"name": name, "labels": {"tier": tier}}})
    with pytest.raises(ApiException) as info:
        kube.core.delete_namespaced_config_map(
            "a", "dc", body={"preconditions": {"uid": "not-the-uid"}})
    assert info.value.status == 409
    kube.core.delete_collection_namespaced_config_map("dc", label_selector="tier=x")
    assert [c.metadata.name for c in kube.core.list_namespaced_config_map("dc").items] == ["c"]


def test_inspection_api_returns_copies(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "i", "labels": {"a": "1"}}})
    kube.core.create_namespaced_config_map("i", {"metadata": {"name": "c", "labels": {"a": "1"}}})
    obj = k8s_sim.get("configmaps", "c", "i")
    assert obj is not None and obj["kind"] == "ConfigMap"
    obj["metadata"]["name"] = "changed"
    assert existing(k8s_sim, "configmaps", "c", "i")["metadata"]["name"] == "c"
    assert [o["metadata"]["name"] for o in k8s_sim.list("namespaces", label_selector="a=1")] \
        == ["i"]
    assert k8s_sim.list("configmaps", namespace="default") == []
    with pytest.raises(KeyError):
        k8s_sim.get("replicasets", "x")
    k8s_sim.patch("configmaps", "c", {"data": {"k": "v"}}, namespace="i")
    assert kube.core.read_namespaced_config_map("c", "i").data == {"k": "v"}
