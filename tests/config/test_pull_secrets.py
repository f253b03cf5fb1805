"""`image-pull-secrets`: pod labels (both forms) and pool/provider defaults name Secrets as
{name, namespace}; names are validated as Kubernetes names, unique, few; namespace labels
refuse the key (and say why); a label that would let its job read the copy is refused;
defaults cascade label -> pool -> provider; the pod spec names the copies."""

from __future__ import annotations

from typing import Any

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import PullSecret
from nodepool_k8s.driver.kubernetes.manifests import pod_spec
from tests.config.common import assert_problem, at, base, load, prefix, problems, warnings

POD = prefix("podlabel")
NS = prefix("nslabel")
SPEC = prefix("speclabel")
POOL = prefix("pool")
PROVIDER = prefix("provider")
REGISTRY = {"name": "registry-credentials", "namespace": "nodepool"}


def _labels(data: dict[str, Any]) -> Any:
    return load(data).providers["k8s"].pools["main"].labels


def test_form_a_pod_names_the_copies() -> None:
    data = base()
    at(data, "podlabel")["image-pull-secrets"] = [
        REGISTRY, {"name": "mirror.example.com", "namespace": "registries"}]
    assert warnings(data) == []
    label = _labels(data)["pod"]
    assert label.image_pull_secrets == (
        PullSecret("registry-credentials", "nodepool"),
        PullSecret("mirror.example.com", "registries"))
    assert pod_spec(label)["imagePullSecrets"] == [
        {"name": "registry-credentials"}, {"name": "mirror.example.com"}]


def test_verbatim_spec_keeps_its_own_entries_first() -> None:
    data = base()
    label = at(data, "speclabel")
    label["spec"]["imagePullSecrets"] = [{"name": "already-there"},
                                         {"name": "registry-credentials"}]
    label["image-pull-secrets"] = [REGISTRY, {"name": "other", "namespace": "nodepool"}]
    spec = pod_spec(_labels(data)["custom"])
    assert spec["imagePullSecrets"] == [{"name": "already-there"},
                                        {"name": "registry-credentials"}, {"name": "other"}]


def test_defaults_cascade_label_pool_provider() -> None:
    data = base()
    at(data, "provider")["default-label-image-pull-secrets"] = [
        {"name": "from-provider", "namespace": "nodepool"}]
    labels = _labels(data)
    assert labels["pod"].image_pull_secrets == (PullSecret("from-provider", "nodepool"),)
    assert labels["custom"].image_pull_secrets == (PullSecret("from-provider", "nodepool"),)
    # A namespace label never gets them, not even from a default.
    assert labels["ns"].image_pull_secrets == ()
    at(data, "pool")["default-label-image-pull-secrets"] = [REGISTRY]
    assert _labels(data)["pod"].image_pull_secrets == (
        PullSecret("registry-credentials", "nodepool"),)
    # The label's own list replaces the defaults (no merging); an empty one means none.
    at(data, "podlabel")["image-pull-secrets"] = [{"name": "own", "namespace": "ci"}]
    assert _labels(data)["pod"].image_pull_secrets == (PullSecret("own", "ci"),)
    at(data, "podlabel")["image-pull-secrets"] = []
    labels = _labels(data)
    assert labels["pod"].image_pull_secrets == ()
    assert "imagePullSecrets" not in pod_spec(labels["pod"])


def test_refused_on_a_namespace_label_saying_why() -> None:
    data = base()
    at(data, "nslabel")["image-pull-secrets"] = [REGISTRY]
    assert_problem(data, f"{NS}.image-pull-secrets", "not allowed on type: namespace labels")
    assert_problem(data, f"{NS}.image-pull-secrets", "a pod may mount any Secret of its"
                   " namespace")
    assert_problem(data, f"{NS}.image-pull-secrets", "so the copy would hand the registry"
                   " credential to the job")


def test_namespace_is_required() -> None:
    data = base()
    at(data, "podlabel")["image-pull-secrets"] = [{"name": "registry-credentials"}]
    assert_problem(data, f"{POD}.image-pull-secrets[0].namespace", "required key is missing")


def test_names_are_kubernetes_names() -> None:
    data = base()
    at(data, "podlabel")["image-pull-secrets"] = [
        {"name": "Registry_Creds", "namespace": "nodepool"},
        {"name": "ok", "namespace": "no.dots.here"},
        {"name": "x" * 254, "namespace": "nodepool"},
        {"name": "fine\n", "namespace": "n" * 64},
    ]
    found = problems(data)
    where = f"{POD}.image-pull-secrets"
    assert any(p.startswith(f"{where}[0].name: 'Registry_Creds' is not a Secret name")
               for p in found), found
    assert any(p.startswith(f"{where}[1].namespace: 'no.dots.here' is not a namespace name")
               for p in found), found
    assert any(p.startswith(f"{where}[2].name: ") for p in found), found
    assert any(p.startswith(f"{where}[3].name: ") for p in found), found
    assert any(p.startswith(f"{where}[3].namespace: ") for p in found), found


def test_each_secret_name_once() -> None:
    data = base()
    at(data, "podlabel")["image-pull-secrets"] = [
        REGISTRY, {"name": "registry-credentials", "namespace": "elsewhere"}]
    assert_problem(data, f"{POD}.image-pull-secrets[1].name",
                   "duplicate Secret name 'registry-credentials'")


def test_a_small_number() -> None:
    data = base()
    at(data, "pool")["default-label-image-pull-secrets"] = [
        {"name": f"s{i}", "namespace": "nodepool"} for i in range(S.MAX_IMAGE_PULL_SECRETS + 1)]
    assert_problem(data, f"{POOL}.default-label-image-pull-secrets",
                   f"at most {S.MAX_IMAGE_PULL_SECRETS}")


def test_defaults_are_validated_where_they_are() -> None:
    data = base()
    at(data, "provider")["default-label-image-pull-secrets"] = [
        {"name": "ok", "namespace": "Bad"}]
    assert_problem(data, f"{PROVIDER}.default-label-image-pull-secrets[0].namespace",
                   "'Bad' is not a namespace name")


def test_the_quota_must_leave_room_for_the_copies() -> None:
    data = base()
    at(data, "podlabel").update({"image-pull-secrets": [REGISTRY],
                                 "object-quota": {"secrets": 0}})
    assert_problem(data, POD, "its ResourceQuota allows 0 secrets")
    # Object counts hold without the compute quota too.
    at(data, "podlabel")["resource-quota"] = False
    assert_problem(data, POD, "its ResourceQuota allows 0 secrets")
    at(data, "podlabel")["object-quota"] = {"secrets": 1}
    load(data)


def test_the_pod_may_not_mount_or_read_the_copy() -> None:
    data = base()
    at(data, "podlabel").update({
        "image-pull-secrets": [REGISTRY],
        "volumes": [{"name": "creds", "secret": {"secretName": "registry-credentials"}}],
        "volume-mounts": [{"name": "creds", "mountPath": "/creds"}]})
    assert_problem(data, POD, "mounts or reads the image pull Secret 'registry-credentials'")
    data = base()
    spec_label = at(data, "speclabel")
    spec_label["image-pull-secrets"] = [REGISTRY]
    spec_label["spec"]["containers"][0]["env"] = [{"name": "AUTH", "valueFrom": {
        "secretKeyRef": {"name": "registry-credentials", "key": ".dockerconfigjson"}}}]
    assert_problem(data, SPEC, "mounts or reads the image pull Secret")
    # Another Secret of the namespace is the operator's business.
    spec_label["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] = "x"
    load(data)
