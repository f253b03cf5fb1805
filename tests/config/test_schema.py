"""Every key of every section: one valid and one invalid value each, and the error text."""

from __future__ import annotations

from typing import Any

import pytest

from nodepool_k8s.config.schema import format_path
from tests.config.common import assert_problem, at, base, load, problems, where

SPEC = {"containers": [{"name": "c", "image": "busybox"}]}
VOLUMES = [{"name": "v", "emptyDir": {}}]

# (place, key, valid value, invalid value, expected fragment of the message, other keys to set)
CASES: list[tuple[str, str, Any, Any, str, dict[str, Any]]] = [
    ("top", "zookeeper-timeout", 5, "x", "expected number, got 'x'", {}),
    ("top", "zookeeper-timeout", 2.5, 0, "must be greater than 0", {}),
    ("top", "max-hold-age", 3600, -1, "must be at least 0", {}),
    ("top", "labels", [{"name": "ns"}, {"name": "pod"}, {"name": "custom"}, {"name": "fake"}],
     "ns", "expected list", {}),
    ("top", "providers", [], {"name": "x"}, "expected list", {}),
    ("top", "tenant-resource-limits", [], "t1", "expected list", {}),
    ("top", "webapp", {}, [8005], "expected mapping", {}),
    ("zk", "host", "zk.example.com", 5, "expected str, got 5", {}),
    ("zk", "port", 2281, 70000, "must be at most 65535", {}),
    ("zk", "port", 1, "abc", "expected int, got 'abc'", {}),
    ("zk", "chroot", "/nodepool", 5, "expected str", {}),
    ("label", "name", "ns", 5, "expected str", {}),
    ("label", "min-ready", -1, -2, "must be at least -1", {}),
    ("label", "min-ready", 0, "one", "expected int", {}),
    ("label", "max-ready-age", 60, "1h", "expected number", {}),
    ("webapp", "port", 9000, "http", "expected int", {}),
    ("webapp", "listen_address", "127.0.0.1", 1, "expected str", {}),
    ("webapp", "send-timeout", 120, 0, "must be at least 1", {}),
    ("tenant", "tenant-name", "t2", None, "expected str, got None", {}),
    ("tenant", "max-servers", 5, -1, "must be at least 0", {}),
    ("tenant", "max-cores", 5, "x", "expected int", {}),
    ("tenant", "max-ram", 1024, 1.5, "expected int", {}),
    ("tenant", "max-volumes", 2, True, "expected int, got True", {}),
    ("tenant", "max-volume-gb", 20, "20G", "expected int", {}),
    ("tenant", "nvidia.com/gpu", 1, "one", "expected int", {}),
    ("provider", "name", "other", 3, "expected str", {}),
    ("provider", "driver", "kubernetes", "openstack", "expected one of fake, kubernetes", {}),
    ("provider", "max-concurrency", -1, 1.5, "expected int", {}),
    ("provider", "priority", 10, "high", "expected int", {}),
    ("provider", "context", "kind", 1, "expected str", {}),
    ("provider", "launch-retries", 5, 0, "must be at least 1", {}),
    ("provider", "max-servers", 10, "ten", "expected int", {}),
    ("provider", "max-cores", 10, -1, "must be at least 0", {}),
    ("provider", "max-ram", 1024, "lots", "expected int", {}),
    ("provider", "max-resources", {"gpu": 1}, ["gpu"], "expected mapping", {}),
    ("provider", "pools", [], "main", "expected list", {}),
    ("provider", "boot-timeout", 60, 0, "must be greater than 0", {}),
    ("provider", "leak-grace", 0, -5, "must be at least 0", {}),
    ("provider", "api-retries", 0, -1, "must be at least 0", {}),
    ("provider", "api-backoff", [1, 2.5], [], "must have at least 1 item", {}),
    ("provider", "api-timeout", 10, "slow", "expected number", {}),
    ("provider", "unschedulable-grace", 0, -1, "must be at least 0", {}),
    ("provider", "unschedulable-grace", 2.5, "30s", "expected number", {}),
    ("provider", "delete-timeout", 600, 0, "must be greater than 0", {}),
    ("provider", "delete-timeout", 0.5, "5m", "expected number", {}),
    ("pool", "name", "other", 5, "expected str", {}),
    ("pool", "labels", [], "ns", "expected list", {}),
    ("pool", "max-servers", 5, "x", "expected int", {}),
    ("pool", "max-cores", 8, -2, "must be at least 0", {}),
    ("pool", "max-ram", 8192, "8G", "expected int", {}),
    ("pool", "max-resources", {"gpu": 1}, {"gpu": -1}, "must be at least 0", {}),
    ("pool", "node-attributes", {"zone": "a", "n": [1]}, [1], "expected mapping", {}),
    ("pool", "priority", 1, 1.5, "expected int", {}),
    ("pool", "default-label-cpu", 0.5, "one", "expected number", {}),
    ("pool", "default-label-memory", 512, 1.5, "expected int", {}),
    ("pool", "default-label-storage", 100, -1, "must be at least 0", {}),
    ("pool", "default-label-cpu-limit", 4, "x", "expected number", {}),
    ("pool", "default-label-memory-limit", 4096, "x", "expected int", {}),
    ("pool", "default-label-storage-limit", 100, "x", "expected int", {}),
    ("pool", "default-label-extra-resources", {"a": 1}, "a", "expected mapping", {}),
    ("pool", "boot-timeout", 10, "x", "expected number", {}),
    ("nslabel", "type", "namespace", "vm", "expected one of namespace, pod; got 'vm'", {}),
    ("nslabel", "python-path", "/usr/bin/python3", 3, "expected str", {}),
    ("nslabel", "shell-type", "sh", True, "expected str", {}),
    ("podlabel", "image", "alpine", 5, "expected str", {}),
    ("podlabel", "image-pull", "Always", "Sometimes", "expected one of Always, IfNotPresent,"
     " Never", {}),
    ("podlabel", "python-path", "/usr/bin/python3", 3, "expected str", {}),
    ("podlabel", "shell-type", "sh", True, "expected str", {}),
    ("podlabel", "cpu", 0.5, "two", "expected number, got 'two'", {}),
    ("podlabel", "memory", 512, "1Gi", "expected int", {}),
    ("podlabel", "storage", 100, 1.5, "expected int", {}),
    ("podlabel", "cpu-limit", 4, "x", "expected number", {}),
    ("podlabel", "memory-limit", 1024, "x", "expected int", {}),
    ("podlabel", "storage-limit", 1000, "x", "expected int", {}),
    ("podlabel", "gpu", 2.0, "one", "expected number", {"gpu-resource": "nvidia.com/gpu"}),
    ("podlabel", "gpu", 1, 0, "must be greater than 0", {"gpu-resource": "nvidia.com/gpu"}),
    ("podlabel", "gpu-resource", "nvidia.com/gpu", 1, "expected str", {"gpu": 1}),
    ("podlabel", "env", [{"name": "A", "value": "b"}], {"A": "b"}, "expected list", {}),
    ("podlabel", "node-selector", {"disk": "ssd"}, ["disk"], "expected mapping", {}),
    ("podlabel", "privileged", False, "yes", "expected bool", {}),
    ("nslabel", "pod-security", "restricted", "strict", "expected one of privileged", {}),
    ("nslabel", "resource-quota", False, "no", "expected bool", {}),
    ("nslabel", "network-policy", True, 1, "expected bool", {}),
    ("nslabel", "egress-allow", ["10.0.0.0/8"], "10.0.0.0/8", "expected list", {}),
    ("nslabel", "allow-external-services", True, "yes", "expected bool", {}),
    ("speclabel", "pod-security", "privileged", 3, "expected one of", {}),
    ("pool", "default-label-pod-security", "privileged", "x", "expected one of", {}),
    ("pool", "default-label-resource-quota", False, 0, "expected bool", {}),
    ("pool", "default-label-egress-allow", [], {}, "expected list", {}),
    ("pool", "allow-privileged", True, "true", "expected bool", {}),
    ("pool", "allow-host-path", True, 1, "expected bool", {}),
    ("provider", "allow-host-namespaces", True, "x", "expected bool", {}),
    ("provider", "allow-verbatim-spec", True, None, "expected bool", {}),
    ("provider", "default-label-network-policy", True, "on", "expected bool", {}),
    ("provider", "job-role", "cluster-role", "clusterrole", "expected one of role", {}),
    ("podlabel", "scheduler-name", "custom", 1, "expected str", {}),
    ("podlabel", "volumes", VOLUMES, {"v": {}}, "expected list", {}),
    ("podlabel", "volume-mounts", [{"name": "v", "mountPath": "/v"}], "v", "expected list",
     {"volumes": VOLUMES}),
    ("podlabel", "labels", {"a": "b"}, ["a"], "expected mapping", {}),
    ("podlabel", "dynamic-labels", {"t": "{request.tenant_name}"}, "t", "expected mapping", {}),
    ("podlabel", "annotations", {"example.com/a": "b"}, "a", "expected mapping", {}),
    ("podlabel", "extra-resources", {"x": 1}, {"x": "1"}, "expected int", {}),
    ("podlabel", "boot-timeout", 30, -1, "must be greater than 0", {}),
    ("speclabel", "spec", SPEC, "pod.yaml", "expected mapping", {}),
    ("speclabel", "labels", {"a": "b"}, {"a": 1}, "expected str", {}),
    ("speclabel", "dynamic-labels", {"a": "{request.id}"}, {"a": None}, "expected str", {}),
    ("speclabel", "annotations", {"a": "b"}, {"a": False}, "expected str", {}),
    ("speclabel", "boot-timeout", 30, "1m", "expected number", {}),
    ("fakeprovider", "context", "ignored", 1, "expected str", {}),
    ("fakeprovider", "max-servers", 3, "x", "expected int", {}),
    ("fakeprovider", "leak-grace", 1, "x", "expected number", {}),
    ("fakeprovider", "delete-timeout", 1, -1, "must be greater than 0", {}),
    ("fakepool", "default-label-cpu", 1, "x", "expected number", {}),
    ("fakelabel", "type", "pod", "vm", "expected one of namespace, pod", {}),
    ("fakelabel", "cpu", 1, "x", "expected number", {}),
    ("fakelabel", "memory", 1, "x", "expected int", {}),
    ("fakelabel", "storage", 1, "x", "expected int", {}),
    ("fakelabel", "extra-resources", {"a": 1}, {"a": 1.5}, "expected int", {}),
    ("fakelabel", "launch-delay", 1.5, -1, "must be at least 0", {}),
    ("fakelabel", "fail", True, "no", "expected bool", {}),
    ("fakelabel", "boot-timeout", 10, 0, "must be greater than 0", {}),
]


def _ids() -> list[str]:
    return [f"{place}.{key}={invalid!r}" for place, key, _, invalid, _, _ in CASES]


@pytest.mark.parametrize("place,key,valid,invalid,fragment,also", CASES, ids=_ids())
def test_valid_value_loads(place: str, key: str, valid: Any, invalid: Any, fragment: str,
                           also: dict[str, Any]) -> None:
    data = base()
    at(data, place).update(also, **{key: valid})
    load(data)


@pytest.mark.parametrize("place,key,valid,invalid,fragment,also", CASES, ids=_ids())
def test_invalid_value_names_the_place(place: str, key: str, valid: Any, invalid: Any,
                                       fragment: str, also: dict[str, Any]) -> None:
    data = base()
    at(data, place).update(also, **{key: invalid})
    found = problems(data)
    assert any(p.startswith(where(place, key)) and fragment in p for p in found), found


# Keys whose absence is an error, by section.
REQUIRED = [("zk", "host"), ("label", "name"), ("tenant", "tenant-name"), ("provider", "name"),
            ("provider", "driver"), ("provider", "pools"), ("pool", "name"), ("pool", "labels"),
            ("nslabel", "type"), ("podlabel", "name"), ("fakelabel", "name")]


@pytest.mark.parametrize("place,key", REQUIRED, ids=[f"{p}.{k}" for p, k in REQUIRED])
def test_required_keys(place: str, key: str) -> None:
    data = base()
    del at(data, place)[key]
    assert_problem(data, where(place, key), "required key is missing")


def test_zookeeper_servers_required_and_non_empty() -> None:
    data = base()
    del data["zookeeper-servers"]
    assert_problem(data, "zookeeper-servers", "required key is missing")
    data["zookeeper-servers"] = []
    assert_problem(data, "zookeeper-servers", "at least 1 item")


@pytest.mark.parametrize("place,key,suggestion", [
    ("top", "provider", "providers"),
    ("top", "zookeeper-server", "zookeeper-servers"),
    ("zk", "prot", "port"),
    ("label", "min_ready", "min-ready"),
    ("webapp", "listen-address", "listen_address"),
    ("provider", "max-server", "max-servers"),
    ("pool", "default-label-extra_resources", "default-label-extra-resources"),
    ("podlabel", "imagee", "image"),
    ("podlabel", "cpu_limit", "cpu-limit"),
    ("fakelabel", "launch_delay", "launch-delay"),
])
def test_unknown_keys_suggest_the_known_one(place: str, key: str, suggestion: str) -> None:
    data = base()
    at(data, place)[key] = 1
    assert_problem(data, where(place, key), f"unknown key (did you mean {suggestion!r}?)")


def test_unknown_key_without_a_near_miss() -> None:
    data = base()
    data["frobnicate"] = True
    assert problems(data) == ["frobnicate: unknown key"]


def test_fake_labels_do_not_take_pod_keys() -> None:
    data = base()
    at(data, "fakelabel")["image"] = "busybox"
    assert_problem(data, where("fakelabel", "image"), "unknown key")


def test_builder_keys_are_accepted_and_ignored() -> None:
    data = base()
    data.update({"diskimages": [{"name": "x", "elements": ["y"]}], "elements-dir": "/e",
                 "images-dir": "/i", "build-log-dir": "/l", "build-log-retention": 3})
    config = load(data)
    assert config == load(base())


def test_empty_top_level_lists_read_as_empty() -> None:
    config = load({"zookeeper-servers": [{"host": "zk"}], "labels": None, "providers": None,
                   "tenant-resource-limits": None})
    assert config.labels == {} and config.providers == {} and config.tenant_resource_limits == {}


def test_all_problems_are_collected_across_list_items() -> None:
    data = base()
    at(data, "podlabel")["cpu"] = "two"
    at(data, "nslabel")["memory"] = "lots"
    at(data, "fakelabel")["fail"] = "no"
    data["zookeeper-servers"][0]["port"] = "x"
    found = problems(data)
    assert found == [
        "zookeeper-servers[0].port: expected int, got 'x'",
        "providers[0].pools[0].labels[0].memory: expected int, got 'lots'",
        "providers[0].pools[0].labels[1].cpu: expected number, got 'two'",
        "providers[1].pools[0].labels[0].fail: expected bool (true or false), got 'no'",
    ]


def test_strings_get_a_quoting_hint() -> None:
    data = base()
    at(data, "podlabel")["labels"] = {"enabled": True}
    assert_problem(data, where("podlabel", "labels") + ".enabled",
                   "expected str, got True (quote numbers and booleans in YAML")


def test_provider_without_driver_or_name() -> None:
    data = base()
    data["providers"][0] = {"pools": []}
    found = problems(data)
    assert "providers[0].name: required key is missing" in found
    assert "providers[0].driver: required key is missing" in found


def test_long_values_are_shortened_in_messages() -> None:
    data = base()
    at(data, "podlabel")["cpu"] = "x" * 200
    (problem,) = problems(data)
    assert problem.endswith("...") and len(problem) < 120


@pytest.mark.parametrize("path,text", [
    ([], ""),
    (["providers", 0, "pools", 1, "labels", 2, "cpu"], "providers[0].pools[1].labels[2].cpu"),
    (["labels", 0, "labels", "app.kubernetes.io/name"],
     'labels[0].labels["app.kubernetes.io/name"]'),
    ([3, "a"], "[3].a"),
])
def test_format_path(path: list[Any], text: str) -> None:
    assert format_path(path) == text
