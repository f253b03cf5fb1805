"""What the launcher reads off a Terminating namespace and what it may clear in it: the
namespace controller's conditions, the job's kinds (from the one rule list), the rights
and binding of the launcher's clear-up, and (on the simulator) that it reads a page at a
time."""

from __future__ import annotations

from typing import Any

import pytest

from nodepool_k8s.driver.kubernetes import clearing, manifests
from nodepool_k8s.dev.simulator import Simulator
from tests.e2e.util import admin_api
from tests.kubernetes.conftest import ProviderFactory


def terminating(content: str | None, finalizers: str | None) -> dict[str, Any]:
    """A namespace with the conditions a real namespace controller writes."""
    conditions = []
    if content is not None:
        conditions.append({"type": "NamespaceContentRemaining", "status": "True",
                           "reason": "SomeResourcesRemain",
                           "message": f"Some resources are remaining: {content}"})
    if finalizers is not None:
        conditions.append({"type": "NamespaceFinalizersRemaining", "status": "True",
                           "reason": "SomeFinalizersRemain",
                           "message": "Some content in the namespace has finalizers "
                                      f"remaining: {finalizers}"})
    return {"metadata": {"name": "main-0000000001", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Terminating", "conditions": conditions}}


def test_remaining_reads_the_controller_conditions() -> None:
    ns = terminating("configmaps. has 2 resource instances, pods. has 1 resource instances",
                     "example.com/a in 1 resource instances, example.com/b in 1 resource "
                     "instances")
    assert clearing.remaining(ns) == (["configmaps.", "pods."],
                                      ["example.com/a", "example.com/b"])
    assert "example.com/a" in clearing.describe(ns)
    assert clearing.remaining(terminating(None, None)) is None
    assert "nothing remaining yet" in clearing.describe(terminating(None, None))


def test_only_our_hold_left() -> None:
    hold = f"{manifests.HOLD_FINALIZER} in 1 resource instances"
    alone = terminating("rolebindings.rbac.authorization.k8s.io has 1 resource instances", hold)
    assert clearing.only_own_hold(alone)
    with_pod = terminating("pods. has 1 resource instances, rolebindings.rbac.authorization"
                           ".k8s.io has 1 resource instances", hold)
    assert not clearing.only_own_hold(with_pod)  # a pod in its grace period: not yet
    with_job = terminating("configmaps. has 1 resource instances, rolebindings.rbac."
                           "authorization.k8s.io has 1 resource instances",
                           f"example.com/x in 1 resource instances, {hold}")
    assert not clearing.only_own_hold(with_job)
    assert not clearing.only_own_hold(terminating(None, None))


def test_job_kinds_come_from_the_job_rules() -> None:
    kinds = manifests.job_resource_types()
    assert ("", "configmaps") in kinds and ("", "secrets") in kinds
    assert ("", "endpoints") not in kinds  # read-only for jobs
    assert ("apps", "deployments") in kinds and ("batch", "jobs") in kinds
    assert not any("/" in resource for _, resource in kinds)  # no subresources
    assert ("", "events") not in kinds  # the job may only read those
    assert not any(group == manifests.RBAC_GROUP for group, _ in kinds)
    created = {(g, r) for rule in manifests.NAMESPACE_RULES_WITH_SECRETS + manifests.POD_RULES
               if "create" in rule["verbs"] for g in rule["apiGroups"]
               for r in rule["resources"] if "/" not in r}
    assert set(kinds) == created


def test_cleanup_rights_are_the_job_kinds_and_one_binding() -> None:
    rules = manifests.cleanup_rules()
    patched = {(g, r) for rule in rules if "patch" in rule["verbs"] and
               not rule.get("resourceNames") for g in rule["apiGroups"]
               for r in rule["resources"]}
    assert patched == set(manifests.job_resource_types())
    (own,) = [rule for rule in rules if rule.get("resourceNames")]
    assert own == {"apiGroups": [manifests.RBAC_GROUP], "resources": ["rolebindings"],
                   "verbs": ["patch"], "resourceNames": [manifests.CLEANUP_BINDING]}
    # It creates nothing but the copies of image pull Secrets.
    assert [rule for rule in rules if "create" in rule["verbs"]] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    assert not any(verb in rule["verbs"] for rule in rules
                   for verb in ("update", "escalate", "bind", "*"))


def test_cleanup_binding_names_the_launcher_and_holds() -> None:
    subject = manifests.subject_of("system:serviceaccount:nodepool:nodepool-launcher")
    assert subject == {"kind": "ServiceAccount", "name": "nodepool-launcher",
                       "namespace": "nodepool"}
    assert manifests.subject_of("kubernetes-admin") == {
        "kind": "User", "apiGroup": manifests.RBAC_GROUP, "name": "kubernetes-admin"}
    body = manifests.cleanup_binding_body("main-0000000001", {"a": "b"}, subject)
    assert body["metadata"]["finalizers"] == [manifests.HOLD_FINALIZER]
    assert body["metadata"]["namespace"] == "main-0000000001"
    assert body["roleRef"]["name"] == manifests.CLEANUP_CLUSTER_ROLE
    assert body["subjects"] == [subject]


def test_the_pods_of_a_namespace_are_read_a_page_at_a_time(
        sim: Simulator, make_k8s_provider: ProviderFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A job may fill its namespace with big pods: the clear-up holds one page of them at a
    # time, as it does for every other kind, and still deletes them all.
    monkeypatch.setattr(clearing, "LIST_PAGE_SIZE", 2)
    client, _ = make_k8s_provider(sim)._connected()
    admin = admin_api(sim)
    admin.create_namespace({"metadata": {"name": "main-0000000001"}})
    for i in range(5):
        admin.create_namespaced_pod("main-0000000001", {
            "metadata": {"name": f"p{i}", "finalizers": ["example.com/kept"]},
            "spec": {"terminationGracePeriodSeconds": 3600,
                     "containers": [{"name": "c", "image": "busybox"}]}})
    sim.reset_counters()
    cleared = clearing.clear(client, "main-0000000001", 1, holds=False)
    assert sorted(name for name, _ in cleared.pods) == [f"p{i}" for i in range(5)]
    assert sorted(name for _, name, _ in cleared.finalizers) == [f"p{i}" for i in range(5)]
    # Pages of 2 + 2 + 1 pods twice: once to delete them, once to remove their finalizers.
    assert sim.counters.get("list pods") == 6
