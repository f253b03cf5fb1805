"""Every semantic check produces an error (or warning) naming the place."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.config.checks import RESERVED_LABELS, template_problem
from nodepool_k8s.config.schema import format_path
from nodepool_k8s.driver.kubernetes import manifests
from tests.config.common import (
    PLACES, assert_problem, at, base, load, prefix, problems, warnings, where,
)
from tests.kubernetes.factories import make_label, make_provider, make_spec

POD = prefix("podlabel")  # "providers[0].pools[0].labels[1]"
NS = prefix("nslabel")
SPEC = prefix("speclabel")
POOL = prefix("pool")


def test_base_config_is_clean() -> None:
    assert warnings(base()) == []


# -- names and references ------------------------------------------------------------------------


def test_pool_label_must_exist_at_top_level() -> None:
    data = base()
    data["labels"] = [lb for lb in data["labels"] if lb["name"] != "pod"]
    assert_problem(data, f"{POD}.name", "label 'pod' is not defined in the top-level labels")


@pytest.mark.parametrize("place,items,key,what", [
    ("providers", lambda d: d["providers"], "name", "provider"),
    ("providers[0].pools", lambda d: d["providers"][0]["pools"], "name", "pool"),
    ("providers[0].pools[0].labels", lambda d: d["providers"][0]["pools"][0]["labels"], "name",
     "label"),
    ("labels", lambda d: d["labels"], "name", "label"),
    ("tenant-resource-limits", lambda d: d["tenant-resource-limits"], "tenant-name", "tenant"),
])
def test_duplicate_names(place: str, items: Any, key: str, what: str) -> None:
    data = base()
    entries = items(data)
    entries.append(dict(entries[0]))
    index = len(entries) - 1
    assert_problem(data, f"{place}[{index}].{key}",
                   f"duplicate {what} name {entries[0][key]!r} (also at {place}[0])")


def test_same_label_in_two_pools_is_fine() -> None:
    data = base()
    data["providers"][0]["pools"].append(
        {"name": "second", "labels": [{"name": "ns", "type": "namespace"}]})
    assert set(load(data).providers["k8s"].pools) == {"main", "second"}


@pytest.mark.parametrize("name,ok", [
    ("main", True), ("a", True), ("pool-2", True), ("x" * 40, True), ("x" * 41, False),
    ("Main", False), ("my_pool", False), ("-pool", False), ("pool-", False), ("a.b", False),
])
def test_pool_name_must_prefix_a_namespace_name(name: str, ok: bool) -> None:
    data = base()
    at(data, "pool")["name"] = name
    if ok:
        load(data)
    else:
        assert_problem(data, f"{POOL}.name", "lowercase DNS-1123 label of at most 40")


def test_pool_name_rule_applies_to_fake_pools_too() -> None:
    data = base()
    at(data, "fakepool")["name"] = "Fake_Pool"
    assert_problem(data, where("fakepool", "name"), "DNS-1123")


@pytest.mark.parametrize("place,name", [
    ("podlabel", "Pod"), ("podlabel", "pod_1"), ("podlabel", "-pod"), ("podlabel", "p" * 254),
    ("speclabel", "Custom"), ("speclabel", "custom pod"),
])
def test_pod_label_names_must_be_dns_subdomains(place: str, name: str) -> None:
    data = base()
    data["labels"].append({"name": name})
    at(data, place)["name"] = name
    assert_problem(data, where(place, "name"),
                   "names the pod, so it must be a lowercase DNS-1123 subdomain")


@pytest.mark.parametrize("place,name", [
    ("podlabel", "pod.v1"), ("speclabel", "custom.v1"), ("nslabel", "Ubuntu_Jammy"),
    ("fakelabel", "Any Name/at all"),
])
def test_label_names_that_are_fine(place: str, name: str) -> None:
    data = base()
    data["labels"].append({"name": name})
    at(data, place)["name"] = name
    assert warnings(data) == []


@pytest.mark.parametrize("name", ["ns label", "n" * 64])
def test_namespace_label_name_that_is_no_label_value_is_a_warning(name: str) -> None:
    data = base()
    data["labels"].append({"name": name})
    at(data, "nslabel")["name"] = name
    (warning,) = warnings(data)
    assert warning.startswith(f"test.yaml: {NS}.name: warning: {name!r} is not a valid"
                              " Kubernetes label value")


def test_kubernetes_provider_name_that_is_no_label_value_is_a_warning() -> None:
    data = base()
    at(data, "provider")["name"] = "k8s cluster"
    (warning,) = warnings(data)
    assert warning.startswith("test.yaml: providers[0].name: warning: 'k8s cluster' is not a"
                              " valid Kubernetes label value")
    data = base()
    at(data, "fakeprovider")["name"] = "fake provider"
    assert warnings(data) == []


# -- label forms ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [
    ("image", "busybox"), ("image-pull", "Always"), ("python-path", "/usr/bin/python3"),
    ("cpu", 1), ("memory", 512), ("storage", 10), ("cpu-limit", 1), ("env", []),
    ("node-selector", {}), ("privileged", True), ("scheduler-name", "s"), ("volumes", []),
    ("volume-mounts", []), ("extra-resources", {}), ("gpu", 1), ("shell-type", "sh"),
])
def test_spec_excludes_form_a_keys(key: str, value: Any) -> None:
    data = base()
    at(data, "speclabel")[key] = value
    assert_problem(data, f"{SPEC}.{key}", "cannot be combined with spec")


def test_spec_requires_type_pod() -> None:
    data = base()
    at(data, "speclabel")["type"] = "namespace"
    assert_problem(data, f"{SPEC}.type", "must be pod when spec is given")


@pytest.mark.parametrize("spec,place", [
    ({}, "spec.containers"),
    ({"containers": []}, "spec.containers"),
    ({"containers": [{"image": "x"}]}, "spec.containers[0]"),
])
def test_spec_needs_named_containers(spec: dict[str, Any], place: str) -> None:
    data = base()
    at(data, "speclabel")["spec"] = spec
    assert_problem(data, f"{SPEC}.{place}", "container")


def test_pod_label_needs_image() -> None:
    data = base()
    del at(data, "podlabel")["image"]
    assert_problem(data, f"{POD}.image", "required for type: pod labels without spec")


@pytest.mark.parametrize("key,value", [
    ("image", "busybox"), ("image-pull", "Always"), ("cpu-limit", 1), ("memory-limit", 1),
    ("storage-limit", 1), ("gpu", 1), ("gpu-resource", "nvidia.com/gpu"),
    ("env", [{"name": "A", "value": "b"}]), ("node-selector", {"a": "b"}),
    ("privileged", True), ("scheduler-name", "s"), ("volumes", [{"name": "v"}]),
    ("volume-mounts", [{"name": "v", "mountPath": "/v"}]),
])
def test_namespace_labels_reject_pod_only_keys(key: str, value: Any) -> None:
    data = base()
    at(data, "nslabel")[key] = value
    assert_problem(data, f"{NS}.{key}", "only applies to type: pod labels")


def test_namespace_labels_take_quota_and_metadata_keys() -> None:
    data = base()
    at(data, "nslabel").update({"cpu": 1, "memory": 512, "storage": 10, "extra-resources":
                                {"x": 1}, "labels": {"a": "b"}, "annotations": {"c": "d"},
                                "python-path": "auto", "shell-type": "sh", "boot-timeout": 5})
    label = load(data).providers["k8s"].pools["main"].labels["ns"]
    assert (label.cpu, label.memory, label.shell_type) == (1, 512, "sh")
    assert dict(label.labels) == {"a": "b"} and dict(label.annotations) == {"c": "d"}


@pytest.mark.parametrize("given,missing", [("gpu", "gpu-resource"), ("gpu-resource", "gpu")])
def test_gpu_and_gpu_resource_go_together(given: str, missing: str) -> None:
    data = base()
    at(data, "podlabel")[given] = {"gpu": 1, "gpu-resource": "nvidia.com/gpu"}[given]
    assert_problem(data, f"{POD}.{missing}", "gpu and gpu-resource must be given together")


def test_gpu_resource_must_be_a_resource_name() -> None:
    data = base()
    at(data, "podlabel").update({"gpu": 1, "gpu-resource": "nvidia gpu"})
    assert_problem(data, f"{POD}.gpu-resource", "not a valid extended resource name")


# -- limits versus requests ----------------------------------------------------------------------


@pytest.mark.parametrize("label,pool,place,fragment", [
    ({"cpu": 2, "cpu-limit": 1}, {}, "cpu-limit",
     "1 (from cpu-limit) is below the cpu request 2 (from cpu)"),
    ({"memory": 1024, "memory-limit": 512}, {}, "memory-limit", "below the memory request"),
    ({"storage": 10, "storage-limit": 5}, {}, "storage-limit", "below the storage request"),
    ({"cpu": 4}, {"default-label-cpu-limit": 2}, "cpu-limit",
     "2 (from pool default-label-cpu-limit) is below the cpu request 4 (from cpu)"),
    ({"cpu-limit": 1}, {"default-label-cpu": 2}, "cpu-limit",
     "1 (from cpu-limit) is below the cpu request 2 (from pool default-label-cpu)"),
])
def test_limit_below_request(label: dict[str, Any], pool: dict[str, Any], place: str,
                             fragment: str) -> None:
    data = base()
    at(data, "podlabel").update(label)
    at(data, "pool").update(pool)
    assert_problem(data, f"{POD}.{place}", fragment)


def test_pool_default_limit_below_default_request() -> None:
    data = base()
    at(data, "pool").update({"default-label-cpu": 2, "default-label-cpu-limit": 1})
    found = problems(data)
    # Reported once, at the pool, not again for every label inheriting both.
    assert found == [f"{POOL}.default-label-cpu-limit: 1 is below default-label-cpu 2"]


def test_limits_equal_to_requests_are_fine() -> None:
    data = base()
    at(data, "podlabel").update({"cpu": 2, "cpu-limit": 2, "memory": 1, "memory-limit": 1})
    label = load(data).providers["k8s"].pools["main"].labels["pod"]
    assert (label.cpu, label.cpu_limit, label.memory, label.memory_limit) == (2, 2, 1, 1)


# -- pod details ---------------------------------------------------------------------------------


def test_env_entries_need_a_name_and_a_string_value() -> None:
    data = base()
    at(data, "podlabel")["env"] = [{"value": "x"}, {"name": "N", "value": 1},
                                   {"name": "M", "value": "a", "valueFrom": {}}]
    assert_problem(data, f"{POD}.env[0].name", "required key is missing")
    data["providers"][0]["pools"][0]["labels"][1]["env"].pop(0)
    found = problems(data)
    assert f"{POD}.env[0].value: expected str, got 1 (quote it in YAML)" in found
    assert f"{POD}.env[1]: set value or valueFrom, not both" in found


def test_volume_mounts_must_name_a_volume() -> None:
    data = base()
    at(data, "podlabel").update({"volumes": [{"name": "cache", "emptyDir": {}}],
                                 "volume-mounts": [{"name": "cahce", "mountPath": "/c"}]})
    assert_problem(data, f"{POD}.volume-mounts[0].name", "no volume named 'cahce'")


@pytest.mark.parametrize("section,key,value,fragment", [
    ("labels", "bad key!", "v", "not a valid Kubernetes key"),
    ("labels", "nodepool_node_id", "x", "reserved"),
    ("dynamic-labels", "nodepool_pool_name", "{request.id}", "reserved"),
    ("labels", "nodepool_installation_id", "x", "reserved"),
    ("dynamic-labels", "nodepool_installation_id", "{request.tenant_name}", "reserved"),
    ("annotations", "Bad_Prefix/x", "anything at all!", "not a valid Kubernetes key"),
    ("node-selector", "kubernetes.io/os", "linux os", "not a valid label value"),
])
def test_metadata_keys_and_values(section: str, key: str, value: str, fragment: str) -> None:
    data = base()
    at(data, "podlabel")[section] = {key: value}
    assert_problem(data, format_path(PLACES["podlabel"][0] + (section, key)), fragment)


def test_every_ownership_label_is_reserved() -> None:
    """A label config may set none of the labels the driver marks its objects with (the
    driver's win anyway; `nodepool_installation_id` was once accepted without a word)."""
    spec = make_spec(make_provider(make_label("ns", type="namespace")), "ns")
    assert set(manifests.ownership_labels(spec)) == set(RESERVED_LABELS)


def test_node_attributes_must_be_json() -> None:
    data = base()
    # What YAML makes of an unquoted `since: 2024-01-01`; it cannot be stored in ZooKeeper.
    at(data, "pool")["node-attributes"] = {"since": datetime.date(2024, 1, 1)}
    assert_problem(data, f"{POOL}.node-attributes", "must be plain JSON data")


# -- dynamic-labels ------------------------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "{request.id}", "{request.tenant_name}", "static", "{request.labels[0]}",
    "{request.requestor!s}-{request.relative_priority:03d}", "{{literal}}",
    "{request.event_id}", "{request.created_time}", "{request.requestor_data}",
    "{request[id]}", "{request[labels][0]}",
])
def test_dynamic_label_templates_that_work(template: str) -> None:
    assert template_problem(template) is None


@pytest.mark.parametrize("template,fragment", [
    ("{request.tenant}", "the request has no field 'tenant'"),
    ("{node.id}", "only {request.<field>} can be used"),
    ("{}", "only {request.<field>} can be used"),
    ("{0}", "only {request.<field>} can be used"),
    ("{request}", "use request.<field>"),
    ("{request[tenant]}", "the request has no field 'tenant'"),
    ("{request.id", "invalid format template"),
    ("}", "invalid format template"),
    ("{request.id:{other}}", "only {request.<field>}"),
])
def test_dynamic_label_templates_that_do_not(template: str, fragment: str) -> None:
    problem = template_problem(template)
    assert problem is not None and fragment in problem


def test_dynamic_label_error_names_the_place() -> None:
    data = base()
    at(data, "speclabel")["dynamic-labels"] = {"tenant": "{request.tenant}"}
    assert_problem(data, f"{SPEC}.dynamic-labels.tenant", "no field 'tenant'")


# -- zookeeper -----------------------------------------------------------------------------------


def test_servers_must_share_one_chroot() -> None:
    data = base()
    data["zookeeper-servers"] = [{"host": "a", "chroot": "/x"}, {"host": "b", "chroot": "/y"},
                                 {"host": "c"}]
    assert_problem(data, "zookeeper-servers",
                   "all servers must name the same chroot (one chroot applies to the whole"
                   " ensemble); found none, '/x', '/y'")


@pytest.mark.parametrize("chroot", ["nodepool", "/nodepool/", "/", "//x", "/a b"])
def test_chroot_must_be_an_absolute_path(chroot: str) -> None:
    data = base()
    data["zookeeper-servers"][0]["chroot"] = chroot
    assert_problem(data, "zookeeper-servers[0].chroot", "absolute znode path")


@pytest.mark.parametrize("host,ok", [
    ("zk1", True), ("10.0.0.1", True), ("::1", True), ("zk1:2181", False), ("[::1]", False),
    ("zk1/chroot", False)])
def test_server_host_is_bare(host: str, ok: bool) -> None:
    data = base()
    data["zookeeper-servers"][0]["host"] = host
    if ok:
        load(data)
    else:
        assert_problem(data, "zookeeper-servers[0].host", "bare host name or address")


@pytest.mark.parametrize("host", ["a" * 70, "zk." + "b" * 64 + ".example", "x." * 130])
def test_server_host_a_resolver_refuses_is_an_error(host: str) -> None:
    """A 70-character label passed validation, then every connection attempt failed with
    a UnicodeError traceback ("label empty or too long"), for ever."""
    data = base()
    data["zookeeper-servers"][0]["host"] = host
    assert_problem(data, "zookeeper-servers[0].host", "not a usable host name")


def test_long_but_valid_host_names_are_fine() -> None:
    data = base()
    data["zookeeper-servers"][0]["host"] = ".".join(["a" * 63] * 3)
    load(data)


def test_duplicate_server_is_a_warning() -> None:
    data = base()
    data["zookeeper-servers"] = [{"host": "zk", "port": 2181}, {"host": "zk"}]
    assert warnings(data) == ["test.yaml: zookeeper-servers[1]: warning: same server as"
                              " zookeeper-servers[0]"]


def test_tls_files_must_be_readable(tmp_path: Path) -> None:
    for name in ("cert", "ca"):
        (tmp_path / name).write_text("pem")
    data = base()
    data["zookeeper-tls"] = {"cert": str(tmp_path / "cert"), "key": str(tmp_path / "key"),
                             "ca": str(tmp_path / "ca")}
    found = problems(data)
    assert found == [f"zookeeper-tls.key: cannot read {str(tmp_path / 'key')!r}: No such file"
                     " or directory"]
    (tmp_path / "key").write_text("pem")
    tls = load(data).zookeeper_tls
    assert tls is not None and tls.key == str(tmp_path / "key")


def test_tls_keys_are_all_required() -> None:
    data = base()
    data["zookeeper-tls"] = {"cert": "/c"}
    found = problems(data)
    assert "zookeeper-tls.key: required key is missing" in found
    assert "zookeeper-tls.ca: required key is missing" in found


# -- warnings ------------------------------------------------------------------------------------


def test_min_ready_label_no_pool_serves_is_a_warning() -> None:
    data = base()
    data["labels"].append({"name": "orphan", "min-ready": 2})
    assert warnings(data) == ["test.yaml: labels[4].min-ready: warning: 2 ready nodes wanted,"
                              " but no enabled pool serves label 'orphan'"]


def test_min_ready_label_only_served_by_a_disabled_pool_is_a_warning() -> None:
    data = base()
    data["labels"][0]["min-ready"] = 1
    at(data, "pool")["max-servers"] = 0
    assert warnings(data) == ["test.yaml: labels[0].min-ready: warning: 1 ready nodes wanted,"
                              " but no enabled pool serves label 'ns'"]


def test_label_that_can_never_fit_is_a_warning() -> None:
    data = base()
    at(data, "pool")["max-cores"] = 4
    at(data, "podlabel")["cpu"] = 8
    (warning,) = warnings(data)
    assert warning.startswith(f"test.yaml: {POD}: warning: one node needs more than the pool"
                              " allows (cores 8 > 4)")
    data = base()
    at(data, "provider")["max-resources"] = {"gpu": 1}
    at(data, "podlabel")["extra-resources"] = {"gpu": 2}
    (warning,) = warnings(data)
    assert "more than the pool allows (gpu 2 > 1)" in warning


def test_provider_max_servers_zero_is_a_warning() -> None:
    data = base()
    at(data, "provider")["max-servers"] = 0
    assert warnings(data) == ["test.yaml: providers[0].max-servers: warning: 0 or less disables"
                              " every pool that does not set its own max-servers"]


def test_empty_pools_and_labels_are_warnings() -> None:
    data = base()
    at(data, "fakepool")["labels"] = []
    data["providers"].append({"name": "idle", "driver": "fake", "pools": []})
    assert warnings(data) == [
        "test.yaml: providers[1].pools[0].labels: warning: the pool has no labels, so it serves"
        " nothing",
        "test.yaml: providers[2].pools: warning: the provider has no pools, so it serves"
        " nothing",
    ]


def test_tenant_limit_typo_is_a_warning() -> None:
    data = base()
    data["tenant-resource-limits"][0]["max-server"] = 3
    assert warnings(data) == [
        "test.yaml: tenant-resource-limits[0].max-server: warning: not a known limit, so it"
        " limits a custom resource named 'max-server'; did you mean 'max-servers'?"]


def test_label_value_that_is_not_valid_is_a_warning() -> None:
    data = base()
    at(data, "podlabel")["labels"] = {"example.com/team": "not ok!"}
    assert warnings(data) == [f'test.yaml: {POD}.labels["example.com/team"]: warning: \'not'
                              " ok!' is not a valid label value (at most 63 letters, digits,"
                              " '-', '_' or '.', starting and ending with a letter or digit),"
                              " so the stored value is altered"]


def test_dynamic_label_overriding_a_static_one_is_a_warning() -> None:
    data = base()
    at(data, "podlabel").update({"labels": {"team": "a"},
                                 "dynamic-labels": {"team": "{request.tenant_name}"}})
    assert warnings(data) == [f"test.yaml: {POD}.dynamic-labels.team: warning: also set in"
                              " labels; the dynamic value wins"]
