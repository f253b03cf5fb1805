"""A configuration that validates must give objects the Kubernetes API server accepts.

Aspects: names, label keys and values, and the other pod fields a label sets are checked at
validation with the API server's rules (an error naming the key path), instead of every
launch failing with 422 Invalid; including the Python-only pitfalls (a trailing newline that
`$` lets through).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.config.common import assert_problem, at, base, load, prefix, warnings

POD = prefix("podlabel")  # "providers[0].pools[0].labels[1]"
POOL = prefix("pool")


def _pod_label(data: dict[str, Any], **keys: Any) -> dict[str, Any]:
    label: dict[str, Any] = at(data, "podlabel")
    label.update(keys)
    return label


# -- names and metadata ------------------------------------------------------------------------


def test_pod_label_name_with_a_trailing_newline_is_refused() -> None:
    # `name: |` in YAML gives "pod\n"; the pod would be named that, and refused (422).
    data = base()
    data["labels"].append({"name": "pod\n"})
    _pod_label(data, name="pod\n")
    assert_problem(data, f"{POD}.name", "lowercase DNS-1123 subdomain")


def test_pool_name_with_a_trailing_newline_is_refused() -> None:
    data = base()
    at(data, "pool")["name"] = "main\n"
    assert_problem(data, f"{POOL}.name", "lowercase DNS-1123 label")


@pytest.mark.parametrize("section,key,value", [
    ("node-selector", "disk", "ssd\n"),
    ("node-selector", "disk\n", "ssd"),
    ("labels", "team\n", "a"),
    ("annotations", "note\n", "a"),
])
def test_metadata_with_a_trailing_newline_is_refused(section: str, key: str,
                                                     value: str) -> None:
    data = base()
    _pod_label(data, **{section: {key: value}})
    # A key with a newline is printed JSON-quoted: the problem stays on one line.
    place = f'{POD}.{section}["{key[:-1]}\\n"]' if "\n" in key else f"{POD}.{section}.{key}"
    assert_problem(data, place)


@pytest.mark.parametrize("section", ["labels", "annotations", "node-selector"])
def test_metadata_key_with_an_empty_prefix_is_refused(section: str) -> None:
    data = base()
    _pod_label(data, **{section: {"/team": "a"}})
    assert_problem(data, f'{POD}.{section}["/team"]', "not a valid Kubernetes key")


@pytest.mark.parametrize("key", ["tolerations", "node-requirements"])
def test_scheduling_key_with_an_empty_prefix_is_refused(key: str) -> None:
    data = base()
    entry = {"key": "/gpu", "operator": "Exists"}
    _pod_label(data, **{key: [entry]})
    assert_problem(data, f"{POD}.{key}[0].key", "'/gpu' is not a valid")


# -- pod fields of a form A label --------------------------------------------------------------

EMPTY = {"emptyDir": {}}


@pytest.mark.parametrize("keys,place,fragment", [
    ({"image": "busybox "}, "image", "must not have leading or trailing whitespace"),
    ({"scheduler-name": "Fast Scheduler"}, "scheduler-name", "lowercase DNS-1123 subdomain"),
    ({"env": [{"name": "A=B", "value": "x"}]}, "env[0].name", "not a valid environment"),
    ({"env": [{"name": "CAF\u00c9", "value": "x"}]}, "env[0].name", "printable ASCII"),
    ({"volumes": [{"name": "Cache_1", **EMPTY}]}, "volumes[0].name", "DNS-1123 label"),
    ({"volumes": [{"name": "c" * 64, **EMPTY}]}, "volumes[0].name", "at most 63"),
    ({"volumes": [{"name": "c", **EMPTY}, {"name": "c", **EMPTY}]}, "volumes[1].name",
     "duplicate volume name 'c' (also at providers[0].pools[0].labels[1].volumes[0])"),
    ({"volumes": [{"name": "c"}]}, "volumes[0]", "exactly one volume source"),
    ({"volumes": [{"name": "c", **EMPTY, "configMap": {"name": "x"}}]}, "volumes[0]",
     "got 2: emptyDir, configMap"),
    ({"volumes": [{"name": "c", **EMPTY}], "volume-mounts": [
        {"name": "c", "mountPath": "/c"}, {"name": "c", "mountPath": "/c"}]},
     "volume-mounts[1].mountPath", "duplicate mountPath '/c'"),
])
def test_pod_fields_the_api_server_refuses(keys: dict[str, Any], place: str,
                                           fragment: str) -> None:
    data = base()
    _pod_label(data, **keys)
    assert_problem(data, f"{POD}.{place}", fragment)


def test_env_name_refused_before_kubernetes_1_32_is_a_warning() -> None:
    data = base()
    _pod_label(data, env=[{"name": "1ST VAR", "value": "x"}])
    assert warnings(data) == [f"test.yaml: {POD}.env[0].name: warning: '1ST VAR': Kubernetes"
                              " before 1.32 refuses environment variable names other than"
                              " letters, digits, '-', '_' and '.' not starting with a digit"]


@pytest.mark.parametrize("place", ["podlabel", "nslabel"])
def test_annotations_beyond_the_api_servers_256_kib_are_refused(place: str) -> None:
    data = base()
    # Bytes count, not characters (as in Kubernetes); 64 bytes stay for nodepool_k8s' own.
    at(data, place)["annotations"] = {"a": "x" * 202_100, "b": "\u00e9" * 30_000}
    assert_problem(data, f"{prefix(place)}.annotations",
                   "262102 bytes of keys and values; Kubernetes allows 262144")
    at(data, place)["annotations"] = {"a": "x" * (256 * 1024 - 64 - 1)}
    assert load(data)


@pytest.mark.parametrize("gpu,resource,place,fragment", [
    (0.5, "nvidia.com/gpu", "gpu", "0.5 must be a whole number"),
    (1, "gpu", "gpu-resource", "not a valid extended resource name"),
    (1, "cpu", "gpu-resource", "not a valid extended resource name"),
    (1, "kubernetes.io/gpu", "gpu-resource", "not in kubernetes.io"),
    (1, "requests.example.com/gpu", "gpu-resource", "not a valid extended resource"),
])
def test_gpu_must_be_whole_units_of_an_extended_resource(gpu: float, resource: str,
                                                         place: str, fragment: str) -> None:
    data = base()
    _pod_label(data, gpu=gpu, **{"gpu-resource": resource})
    assert_problem(data, f"{POD}.{place}", fragment)
    _pod_label(data, gpu=2.0, **{"gpu-resource": "nvidia.com/gpu"})
    assert load(data)


# -- numbers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("place,key", [
    ("podlabel", "cpu"), ("podlabel", "cpu-limit"), ("pool", "default-label-cpu"),
    ("podlabel", "gpu"), ("podlabel", "boot-timeout"), ("provider", "api-timeout"),
    ("provider", "leak-grace"), ("top", "zookeeper-timeout"), ("top", "max-hold-age"),
])
@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinity_is_refused(place: str, key: str, value: float) -> None:
    # YAML `.inf`: the quantity "Infinity", or waits raising OverflowError on every use.
    data = base()
    if key == "gpu":
        _pod_label(data, **{"gpu-resource": "nvidia.com/gpu"})
    at(data, place)[key] = value
    where = f"{prefix(place)}.{key}" if prefix(place) else key
    assert_problem(data, where, f"must be a finite number, got {value}")


@pytest.mark.parametrize("place,key", [
    ("podlabel", "boot-timeout"), ("provider", "api-timeout"), ("provider", "delete-timeout"),
    ("provider", "unschedulable-grace"), ("pool", "breaker-backoff"), ("top", "max-hold-age"),
])
def test_durations_that_overflow_a_wait_are_refused(place: str, key: str) -> None:
    data = base()
    at(data, place)[key] = 1e300
    where = f"{prefix(place)}.{key}" if prefix(place) else key
    assert_problem(data, where, "must be at most 1e+09")
    data = base()
    at(data, "provider")["api-backoff"] = [0.1, 1e300]
    assert_problem(data, "providers[0].api-backoff[1]", "must be at most 1e+09")


def test_token_lifetime_above_2_32_seconds_is_refused() -> None:
    data = base()
    at(data, "provider")["token-lifetime"] = 2 ** 32 + 1
    assert_problem(data, "providers[0].token-lifetime", "must be at most 4294967296 seconds")
    at(data, "provider")["token-lifetime"] = 2 ** 32
    assert load(data)
