"""A configuration that validates must give objects the Kubernetes API server accepts.

Aspects: names, label keys and values, and the other pod fields a label sets are checked at
validation with the API server's rules (an error naming the key path), instead of every
launch failing with 422 Invalid; including the Python-only pitfalls (a trailing newline that
`$` lets through); numbers are finite and durations fit a wait. Property: a mutated valid
config either is refused with one line per problem, or every object built from it (for the
smallest and largest node id, a retry and the random suffix) passes the simulator's
validation (Kubernetes' rules) and, for the label's own pod, Pod Security, LimitRange and
the namespace's quota.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodepool_k8s.config.model import Config
from nodepool_k8s.driver.kubernetes import guards, manifests
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.dev.simulator import admission, validation
from nodepool_k8s.dev.simulator.resources import by_plural
from tests.kubernetes.factories import make_spec
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


def test_a_session_timeout_kazoo_cannot_send_is_refused() -> None:
    # kazoo packs it in ms into 32 bits: 3e6 s raised struct.error at every connection
    # attempt, retried for ever.
    data = base()
    data["zookeeper-timeout"] = 3e6
    assert_problem(data, "zookeeper-timeout", "must be at most 86400")
    data["zookeeper-timeout"] = 86400
    assert load(data)


def test_token_lifetime_above_2_32_seconds_is_refused() -> None:
    data = base()
    at(data, "provider")["token-lifetime"] = 2 ** 32 + 1
    assert_problem(data, "providers[0].token-lifetime", "must be at most 4294967296 seconds")
    at(data, "provider")["token-lifetime"] = 2 ** 32
    assert load(data)


# -- property: validated means the API server accepts what is built -----------------------------

_CHARS = st.sampled_from("abz09-._/ A\n\u00e9=:")
_TEXT = st.one_of(st.text(_CHARS, max_size=12),
                  st.builds(lambda c, n: c * n, st.sampled_from("a-.1"),
                            st.integers(55, 260)))
_NUMBER = st.one_of(st.integers(-2, 2 ** 40), st.booleans(), st.just("2"),
                    st.floats(allow_nan=True, allow_infinity=True, width=64))
_SMALL_DICT = st.dictionaries(_TEXT, _TEXT, max_size=2)
_POD_KEYS: dict[str, Any] = {
    "name": _TEXT, "image": _TEXT, "scheduler-name": _TEXT, "gpu-resource": _TEXT,
    "image-pull": st.sampled_from(["Always", "Never", "always"]),
    **{key: _NUMBER for key in ("cpu", "memory", "storage", "cpu-limit", "memory-limit",
                                "storage-limit", "gpu")},
    "labels": _SMALL_DICT, "annotations": _SMALL_DICT, "node-selector": _SMALL_DICT,
    "dynamic-labels": st.dictionaries(_TEXT, st.sampled_from(
        ["{request.tenant_name}", "{request.id}x", "{request.labels}"]), max_size=2),
    "env": st.lists(st.fixed_dictionaries({"name": _TEXT, "value": _TEXT}), max_size=2),
    "volumes": st.lists(st.fixed_dictionaries({"name": _TEXT, "emptyDir": st.just({})}),
                        max_size=2),
    "tolerations": st.lists(st.fixed_dictionaries(
        {"key": _TEXT, "operator": st.sampled_from(["Equal", "Exists"])},
        optional={"value": _TEXT, "effect": st.sampled_from(["NoSchedule", "NoExecute"]),
                  "tolerationSeconds": _NUMBER}), max_size=2),
    "node-requirements": st.lists(st.fixed_dictionaries(
        {"key": _TEXT, "operator": st.sampled_from(["In", "Gt", "Exists"]),
         "values": st.lists(st.one_of(_TEXT, st.integers()), max_size=2)}), max_size=2),
    **{key: st.booleans() for key in ("resource-quota", "allow-external-services",
                                      "network-policy", "privileged")},
    "pod-security": st.sampled_from(["privileged", "baseline", "restricted"]),
}
_POOL_KEYS: dict[str, Any] = {
    "name": _TEXT, "default-label-cpu": _NUMBER, "default-label-memory": _NUMBER,
    "default-label-cpu-limit": _NUMBER, "allow-privileged": st.booleans(),
    "allow-host-path": st.booleans(), "default-label-pod-security": st.sampled_from(
        ["privileged", "baseline", "restricted"]),
}
_NS_KEYS: dict[str, Any] = {"name": _TEXT, "labels": _SMALL_DICT, "annotations": _SMALL_DICT,
                            "cpu": _NUMBER, "memory": _NUMBER}


def _changes(keys: dict[str, Any]) -> Any:
    return st.dictionaries(st.sampled_from(sorted(keys)), st.nothing(), max_size=0) | \
        st.lists(st.sampled_from(sorted(keys)), min_size=1, max_size=4, unique=True).flatmap(
            lambda chosen: st.fixed_dictionaries({k: keys[k] for k in chosen}))


def _accepted(rt: str, body: dict[str, Any]) -> dict[str, Any]:
    """What the simulator (Kubernetes' own rules) makes of `body`; raises ApiError if refused."""
    resource = by_plural(rt)
    body = copy.deepcopy(body)
    validation.apply_defaults(resource, body)
    validation.validate(resource, body)
    return body


def _assert_cluster_accepts(config: Config) -> None:
    provider = config.providers["k8s"]
    pool = next(iter(provider.pools.values()))
    for label in pool.labels.values():
        for node_id, attempt in (("0000000000", 1), ("9999999999", 12)):
            spec = make_spec(provider, label.name, node_id=node_id, attempt=attempt)
            labels = manifests.object_labels(spec)
            for suffix in ("", "r" + "f" * 6):
                name = manifests.namespace_name(pool.name, node_id, attempt, suffix)
                assert manifests.parse_namespace_name(name) == (pool.name, node_id, attempt)
                namespace = _accepted("namespaces", manifests.namespace_body(
                    name, {**labels, **guards.namespace_labels(label)},
                    {**(label.annotations if label.type == "namespace" else {}),
                     manifests.CONFIG_HASH_ANNOTATION: "0" * 16}))
            bodies = {
                "resourcequotas": guards.resource_quota_body(name, label, labels),
                "limitranges": guards.limit_range_body(name, label, labels),
                "networkpolicies": guards.network_policy_body(name, label, labels),
                "serviceaccounts": manifests.service_account_body(name, labels),
                "roles": manifests.role_body(name, label, labels),
                "rolebindings": manifests.role_binding_body(name, label, labels),
            }
            for rt, body in bodies.items():
                if body is not None:
                    _accepted(rt, body)
            if label.type != "pod":
                continue
            pod = _accepted("pods", manifests.pod_body(name, label, labels))
            # Admission as the API server runs it for our own pod: Pod Security of its
            # namespace, the LimitRange's defaults, then the namespace's own quota.
            admission.check_pod_security(pod, namespace)
            limit_range = bodies["limitranges"]
            admission.apply_limit_ranges(pod, [limit_range] if limit_range else [])
            quota = bodies["resourcequotas"]
            admission.check_quota("pods", pod, [quota] if quota else [], [])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=_changes(_POD_KEYS), pool=_changes(_POOL_KEYS), ns=_changes(_NS_KEYS))
def test_what_validates_is_what_the_api_server_accepts(
        pod: dict[str, Any], pool: dict[str, Any], ns: dict[str, Any]) -> None:
    data = base()
    data["providers"][0]["pools"][0]["labels"].pop(2)  # the verbatim spec: sent as written
    for place, changes in (("podlabel", pod), ("pool", pool), ("nslabel", ns)):
        at(data, place).update(changes)
        if place != "pool" and isinstance(changes.get("name"), str):
            data["labels"].append({"name": changes["name"]})
    try:
        config = load(data)
    except ConfigError as exc:
        # Refused: one clear line per problem, never a traceback.
        assert exc.problems
        for line in exc.problems:
            assert isinstance(line, str) and "\n" not in line and ": " in line, line
        return
    _assert_cluster_accepts(config)


@pytest.mark.parametrize("spec,place,fragment", [
    ({"containers": [{"name": "c"}]}, "containers[0].image", "needs an image"),
    ({"containers": [{"name": "c", "image": " i"}]}, "containers[0].image", "whitespace"),
    ({"containers": [{"name": "Main", "image": "i"}]}, "containers[0].name", "DNS-1123 label"),
    ({"containers": [{"name": "c", "image": "i"}], "initContainers": [
        {"name": "c", "image": "i"}]}, "initContainers[0].name", "duplicate container name"),
    ({"containers": [{"name": "c", "image": "i"}], "initContainers": [{"name": "c2"}]},
     "initContainers[0].image", "needs an image"),
])
def test_verbatim_spec_containers_the_api_server_refuses(spec: dict[str, Any], place: str,
                                                         fragment: str) -> None:
    data = base()
    at(data, "speclabel")["spec"] = spec
    assert_problem(data, f"{prefix('speclabel')}.spec.{place}", fragment)
