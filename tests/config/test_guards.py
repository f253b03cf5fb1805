"""Guarded namespaces and dangerous pod settings in the configuration.

Aspects: the guard keys resolve label -> pool default-label-* -> provider default-label-* ->
built-in default; privileged, hostPath volumes, host namespaces and verbatim specs fail
validation unless the pool or provider allows them, with an error naming the setting, its
place and the permission key (also through `nodepool config-validate`); allowed, such labels
get a privileged namespace unless they name a level that forbids them (an error); restricted
cannot be met by a pod nodepool_k8s builds; egress-allow entries must be CIDRs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.cmd.nodepoolcmd import main
from tests.config.common import at, base, dump, load, prefix, problems, warnings

NS = "providers[0].pools[0].labels[0]"
POD = "providers[0].pools[0].labels[1]"
SPEC = "providers[0].pools[0].labels[2]"


def _labels(data: dict[str, Any]) -> Any:
    return load(data).providers["k8s"].pools["main"].labels


def test_defaults() -> None:
    labels = _labels(base())
    for name in ("ns", "pod", "custom"):
        label = labels[name]
        assert (label.pod_security, label.resource_quota, label.network_policy,
                label.egress_allow, label.allow_external_services) == (
                    "baseline", True, False, (), False)
    assert load(base()).providers["k8s"].job_role == "role"


def test_label_then_pool_then_provider() -> None:
    data = base()
    at(data, "provider").update({"default-label-pod-security": "restricted",
                                 "default-label-network-policy": True,
                                 "default-label-egress-allow": ["10.0.0.0/8"]})
    at(data, "pool").update({"default-label-pod-security": "privileged",
                             "default-label-resource-quota": False})
    at(data, "nslabel").update({"pod-security": "baseline", "allow-external-services": True,
                                "egress-allow": ["192.0.2.0/24"]})
    labels = _labels(data)
    ns, pod = labels["ns"], labels["pod"]
    assert (ns.pod_security, ns.resource_quota, ns.network_policy) == ("baseline", False, True)
    assert ns.egress_allow == ("192.0.2.0/24",) and ns.allow_external_services
    assert (pod.pod_security, pod.egress_allow) == ("privileged", ("10.0.0.0/8",))


def test_job_secrets_and_object_quota_resolve_like_the_other_guards() -> None:
    labels = _labels(base())
    assert not labels["ns"].allow_job_secrets
    assert dict(labels["ns"].object_quota) == {
        "pods": 50, "services": 20, "secrets": 50, "configmaps": 50,
        "persistentvolumeclaims": 10, "storage": 10000}
    data = base()
    at(data, "provider").update({"default-label-allow-job-secrets": True,
                                 "default-label-object-quota": {"pods": 5, "secrets": 1}})
    at(data, "pool").update({"default-label-object-quota": {"pods": 7}})
    at(data, "nslabel").update({"allow-job-secrets": False,
                                "object-quota": {"storage": 0}})
    labels = _labels(data)
    ns, pod = labels["ns"], labels["pod"]
    assert not ns.allow_job_secrets and pod.allow_job_secrets
    # Per entry: the label's storage, the pool's pods, the provider's secrets, defaults.
    assert dict(ns.object_quota) == {"pods": 7, "services": 20, "secrets": 1,
                                     "configmaps": 50, "persistentvolumeclaims": 10,
                                     "storage": 0}
    assert (pod.object_quota["pods"], pod.object_quota["storage"]) == (7, 10000)


def test_object_quota_problems() -> None:
    data = base()
    at(data, "nslabel")["object-quota"] = {"pods": -1, "volumes": 2}
    found = problems(data)
    assert f"{NS}.object-quota.pods: must be at least 0, got -1" in found
    assert any(p.startswith(f"{NS}.object-quota.volumes: unknown key")
               for p in found), found
    # A pod label's own pod counts against `pods`.
    data = base()
    at(data, "podlabel")["object-quota"] = {"pods": 0}
    assert problems(data) == [f"{POD}.object-quota.pods: a pod label needs room for"
                              " its own pod: at least 1"]
    data = base()
    at(data, "pool")["default-label-object-quota"] = {"pods": 0}
    at(data, "nslabel")["object-quota"] = {"pods": 1}
    assert problems(data) == ["providers[0].pools[0].default-label-object-quota.pods: a pod"
                              " label needs room for its own pod: at least 1"]


@pytest.mark.parametrize("place,key,value,setting,permission", [
    ("podlabel", "privileged", True, "privileged", "allow-privileged"),
    ("podlabel", "volumes", [{"name": "h", "hostPath": {"path": "/"}}], "volumes[0].hostPath",
     "allow-host-path"),
    ("speclabel", "spec", {"hostNetwork": True, "containers": [{"name": "c", "image": "i"}]},
     "spec.hostNetwork", "allow-host-namespaces"),
    ("speclabel", "spec", {"containers": [{"name": "c", "image": "i", "securityContext": {
        "privileged": True}}]}, "spec.containers[0].securityContext.privileged",
     "allow-privileged"),
    ("speclabel", "spec", {"containers": [{"name": "c", "image": "i"}], "volumes": [
        {"name": "h", "hostPath": {"path": "/var/run"}}]}, "spec.volumes[0].hostPath",
     "allow-host-path"),
])
def test_dangerous_settings_need_permission(place: str, key: str, value: Any, setting: str,
                                            permission: str) -> None:
    data = base()
    at(data, "pool")["allow-verbatim-spec"] = True
    at(data, place)[key] = value
    label = {"podlabel": POD, "speclabel": SPEC}[place]
    found = problems(data)
    expected = [p for p in found if p.startswith(f"{label}.{setting}: ")]
    assert expected, found
    assert f"`{permission}: true`" in expected[0]
    assert "providers[0].pools[0]" in expected[0] and "providers[0])" in expected[0]
    for where in ("pool", "provider"):
        allowed = base()
        at(allowed, "pool")["allow-verbatim-spec"] = True
        at(allowed, place)[key] = value
        at(allowed, where)[permission] = True
        name = {"podlabel": "pod", "speclabel": "custom"}[place]
        assert _labels(allowed)[name].pod_security == "privileged"


def test_verbatim_spec_needs_permission() -> None:
    data = base()
    del at(data, "pool")["allow-verbatim-spec"]
    found = problems(data)
    assert any(p.startswith(f"{SPEC}.spec: a verbatim pod spec is not allowed here") and
               "`allow-verbatim-spec: true`" in p for p in found), found
    at(data, "provider")["allow-verbatim-spec"] = True
    assert _labels(data)["custom"].pod_security == "baseline"  # nothing privileged in it


def test_a_level_that_forbids_the_setting_is_an_error() -> None:
    data = base()
    at(data, "pool")["allow-privileged"] = True
    at(data, "podlabel").update({"privileged": True, "pod-security": "baseline"})
    assert any(p.startswith(f"{POD}.pod-security: baseline forbids privileged: true")
               for p in problems(data))


def test_privileged_false_needs_nothing() -> None:
    data = base()
    at(data, "podlabel")["privileged"] = False
    assert _labels(data)["pod"].pod_security == "baseline"


def test_restricted_cannot_be_met_by_a_built_pod() -> None:
    data = base()
    at(data, "podlabel")["pod-security"] = "restricted"
    assert any(p.startswith(f"{POD}.pod-security: restricted") for p in problems(data))
    data = base()
    at(data, "nslabel")["pod-security"] = "restricted"
    assert _labels(data)["ns"].pod_security == "restricted"


def test_egress_allow_must_be_cidrs_and_warns_without_policy() -> None:
    data = base()
    at(data, "nslabel").update({"network-policy": True, "egress-allow": ["10.0.0.0/8", "x"]})
    assert any(p.startswith(f"{NS}.egress-allow[1]: 'x' is not a CIDR") for p in problems(data))
    data = base()
    at(data, "nslabel")["egress-allow"] = ["10.0.0.0/8"]
    assert any("egress-allow: warning: has no effect without network-policy" in w
               for w in warnings(data))


def test_pod_security_labels_are_reserved() -> None:
    data = base()
    at(data, "nslabel")["labels"] = {"pod-security.kubernetes.io/enforce": "privileged"}
    assert any(p.startswith(f'{NS}.labels["pod-security.kubernetes.io/enforce"]: set by')
               for p in problems(data))


def test_config_validate_names_the_setting_and_the_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = base()
    at(data, "podlabel")["privileged"] = True
    path = tmp_path / "nodepool.yaml"
    path.write_text(dump(data))
    assert main(["-c", str(path), "config-validate"]) == 1
    err = capsys.readouterr().err
    assert f"{POD}.privileged: privileged: true is not allowed here" in err
    assert "`allow-privileged: true`" in err and prefix("pool") in err
    at(data, "pool")["allow-privileged"] = True
    path.write_text(dump(data))
    assert main(["-c", str(path), "config-validate"]) == 0
