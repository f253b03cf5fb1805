"""Defaults and cascades are resolved once, in the loader, into the frozen model."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.loader import load_config
from nodepool_k8s.config.model import (
    Config, LabelConfig, PoolConfig, PoolLabel, ProviderConfig, WebappConfig, ZkServer,
)
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.core.model import Resources
from tests.config.common import SAMPLE, at, base, load


def _pod(data: dict[str, Any]) -> PoolLabel:
    return load(data).providers["k8s"].pools["main"].labels["pod"]


def test_top_level_defaults() -> None:
    config = load({"zookeeper-servers": [{"host": "zk"}]})
    assert config.zookeeper_servers == (ZkServer(host="zk", port=2181, chroot=None),)
    assert config.zookeeper_tls is None
    assert config.zookeeper_timeout == 10.0
    assert config.labels == {} and config.providers == {}
    assert config.max_hold_age == math.inf
    assert config.webapp == WebappConfig(port=8005, listen_address="127.0.0.1", threads=8,
                                         timeout=10, send_timeout=60,
                                         max_header_size=16384,
                                         allow_origin=None)
    assert config.tenant_resource_limits == {}
    assert config.zk_hosts() == "zk:2181"


@pytest.mark.parametrize("value,expected", [(0, math.inf), (3600, 3600.0), (0.5, 0.5)])
def test_max_hold_age(value: float, expected: float) -> None:
    data = base()
    data["max-hold-age"] = value
    assert load(data).max_hold_age == expected


@pytest.mark.parametrize("value,expected", [(-1, 0), (0, 0), (3, 3)])
def test_min_ready_minus_one_means_none(value: int, expected: int) -> None:
    data = base()
    data["labels"][0]["min-ready"] = value
    assert load(data).labels["ns"] == LabelConfig(name="ns", min_ready=expected,
                                                  max_ready_age=0)


def test_provider_and_pool_defaults() -> None:
    provider = load(base()).providers["k8s"]
    assert (provider.launch_retries, provider.max_concurrency, provider.priority) == (3, 0, 100)
    assert (provider.max_servers, provider.max_cores, provider.max_ram) == (math.inf,) * 3
    assert provider.max_resources == {} and provider.context is None
    assert (provider.leak_grace, provider.api_retries, provider.api_timeout) == (60.0, 5, 30.0)
    assert provider.api_backoff == (0.2, 0.5, 1.0, 2.0, 4.0)
    assert (provider.unschedulable_grace, provider.delete_timeout) == (30.0, 300.0)
    assert (provider.terminating_grace, provider.max_pod_grace) == (120.0, 30)
    pool = provider.pools["main"]
    assert (pool.max_servers, pool.max_cores, pool.max_ram) == (math.inf,) * 3
    assert pool.priority == 100 and pool.node_attributes is None and not pool.disabled
    assert pool.limits() == Resources.limits()


def test_label_defaults() -> None:
    pod = _pod(base())
    assert (pod.image, pod.image_pull, pod.python_path, pod.shell_type) == (
        "busybox", "IfNotPresent", "auto", None)
    assert (pod.cpu, pod.memory, pod.storage) == (None, None, None)
    assert (pod.cpu_limit, pod.memory_limit, pod.storage_limit) == (None, None, None)
    assert pod.boot_timeout == 300.0 and pod.extra_resources == {} and pod.spec is None
    assert pod.quota() == Resources({"instances": 1, "cores": 0, "ram": 0})


def test_model_defaults_agree_with_the_schema_constants() -> None:
    """The dataclass defaults are documentation only; keep them in step with schema.py."""
    assert ZkServer("h").port == S.ZK_PORT
    assert WebappConfig() == WebappConfig(S.WEBAPP_PORT, S.WEBAPP_LISTEN_ADDRESS)
    assert Config(()).zookeeper_timeout == S.ZK_TIMEOUT
    label = PoolLabel(name="x", type="pod")
    assert (label.image_pull, label.python_path, label.boot_timeout) == (
        S.IMAGE_PULL, S.PYTHON_PATH, S.BOOT_TIMEOUT)
    provider = ProviderConfig(name="p", driver="fake", pools={})
    assert (provider.launch_retries, provider.max_concurrency, provider.priority,
            provider.leak_grace, provider.api_retries, provider.api_backoff,
            provider.api_timeout) == (S.LAUNCH_RETRIES, S.MAX_CONCURRENCY, S.PRIORITY,
                                      S.LEAK_GRACE, S.API_RETRIES, S.API_BACKOFF,
                                      S.API_TIMEOUT)
    assert (provider.unschedulable_grace, provider.delete_timeout) == (
        S.UNSCHEDULABLE_GRACE, S.DELETE_TIMEOUT)
    assert (provider.terminating_grace, provider.max_pod_grace) == (
        S.TERMINATING_GRACE, S.MAX_POD_GRACE)
    assert PoolConfig(name="p", provider="p", labels={}).priority == S.PRIORITY


# -- limits: label limit -> pool default limit -> label request -> pool default request ----------


@pytest.mark.parametrize("label,pool,expected", [
    ({"cpu": 1, "cpu-limit": 3}, {"default-label-cpu-limit": 2, "default-label-cpu": 1}, 3),
    ({"cpu": 1}, {"default-label-cpu-limit": 2, "default-label-cpu": 1}, 2),
    ({"cpu": 1.5}, {"default-label-cpu": 1}, 1.5),
    ({}, {"default-label-cpu": 0.5}, 0.5),
    ({}, {}, None),
])
def test_cpu_limit_resolution_order(label: dict[str, Any], pool: dict[str, Any],
                                    expected: float | None) -> None:
    data = base()
    at(data, "podlabel").update(label)
    at(data, "pool").update(pool)
    assert _pod(data).cpu_limit == expected


def test_memory_and_storage_follow_the_same_order() -> None:
    data = base()
    at(data, "pool").update({"default-label-memory": 512, "default-label-storage": 100,
                             "default-label-storage-limit": 300})
    at(data, "podlabel").update({"memory-limit": 2048, "storage": 200})
    pod = _pod(data)
    assert (pod.memory, pod.memory_limit, pod.storage, pod.storage_limit) == (512, 2048, 200, 300)


def test_namespace_and_spec_labels_count_pool_defaults_but_get_no_limits() -> None:
    data = base()
    at(data, "pool").update({"default-label-cpu": 2, "default-label-memory": 1024,
                             "default-label-storage": 10, "default-label-cpu-limit": 4})
    labels = load(data).providers["k8s"].pools["main"].labels
    for name in ("ns", "custom"):
        label = labels[name]
        assert (label.cpu, label.memory, label.storage) == (2, 1024, 10)
        assert (label.cpu_limit, label.memory_limit, label.storage_limit) == (None,) * 3
        assert label.quota() == Resources({"instances": 1, "cores": 2, "ram": 1024,
                                           "ephemeral-storage": 10})
    assert labels["custom"].spec == {"containers": [{"name": "c", "image": "busybox"}]}


def test_default_label_extra_resources_merge_under_the_label() -> None:
    data = base()
    at(data, "pool")["default-label-extra-resources"] = {"slots": 1, "licences": 2}
    at(data, "podlabel")["extra-resources"] = {"slots": 3}
    labels = load(data).providers["k8s"].pools["main"].labels
    assert labels["pod"].extra_resources == {"slots": 3, "licences": 2}
    assert labels["ns"].extra_resources == {"slots": 1, "licences": 2}
    assert labels["pod"].quota()["slots"] == 3


# -- pool and provider cascades ------------------------------------------------------------------


@pytest.mark.parametrize("provider,pool,expected", [
    ({"priority": 5}, {"priority": 1}, 1),
    ({"priority": 5}, {}, 5),
    ({}, {}, 100),
])
def test_priority_pool_then_provider_then_100(provider: dict[str, Any], pool: dict[str, Any],
                                              expected: int) -> None:
    data = base()
    at(data, "provider").update(provider)
    at(data, "pool").update(pool)
    assert load(data).providers["k8s"].pools["main"].priority == expected


def test_provider_totals_are_also_pool_defaults() -> None:
    data = base()
    at(data, "provider").update({"max-servers": 10, "max-cores": 20, "max-ram": 4096,
                                 "max-resources": {"gpu": 2, "slots": 5}})
    data["providers"][0]["pools"].append({"name": "own", "max-servers": 3, "max-cores": 4,
                                          "max-ram": 1024, "max-resources": {"slots": 1},
                                          "labels": [{"name": "ns", "type": "namespace"}]})
    provider = load(data).providers["k8s"]
    assert provider.limits() == Resources.limits({"instances": 10, "cores": 20, "ram": 4096,
                                                  "gpu": 2, "slots": 5})
    main, own = provider.pools["main"], provider.pools["own"]
    assert (main.max_servers, main.max_cores, main.max_ram) == (10, 20, 4096)
    assert main.max_resources == {"gpu": 2, "slots": 5}
    assert (own.max_servers, own.max_cores, own.max_ram) == (3, 4, 1024)
    assert own.max_resources == {"gpu": 2, "slots": 1}


def test_pool_max_servers_zero_disables_the_pool() -> None:
    data = base()
    at(data, "pool")["max-servers"] = 0
    assert load(data).providers["k8s"].pools["main"].disabled


@pytest.mark.parametrize("provider,pool,label,expected", [
    ({"boot-timeout": 100}, {"boot-timeout": 50}, {"boot-timeout": 10}, 10.0),
    ({"boot-timeout": 100}, {"boot-timeout": 50}, {}, 50.0),
    ({"boot-timeout": 100}, {}, {}, 100.0),
    ({}, {}, {}, 300.0),
])
def test_boot_timeout_label_then_pool_then_provider(provider: dict[str, Any],
                                                    pool: dict[str, Any],
                                                    label: dict[str, Any],
                                                    expected: float) -> None:
    data = base()
    at(data, "provider").update(provider)
    at(data, "pool").update(pool)
    at(data, "podlabel").update(label)
    assert _pod(data).boot_timeout == expected


def test_fake_provider() -> None:
    data = base()
    at(data, "fakeprovider").update({"context": "ignored", "max-servers": 2})
    at(data, "fakepool")["default-label-cpu"] = 1
    at(data, "fakelabel").update({"launch-delay": 0.25, "fail": True, "memory": 64})
    provider = load(data).providers["fake"]
    assert provider.driver == "fake" and provider.context is None
    label = provider.pools["fake"].labels["fake"]
    assert (label.type, label.cpu, label.memory) == ("namespace", 1, 64)
    assert (label.fake_launch_delay, label.fake_fail, label.image) == (0.25, True, None)
    defaults = load(base()).providers["fake"].pools["fake"].labels["fake"]
    assert (defaults.fake_launch_delay, defaults.fake_fail) == (0.0, False)


def test_tenant_limits_map_to_resource_names() -> None:
    data = base()
    data["tenant-resource-limits"] = [{"tenant-name": "t", "max-servers": 1, "max-cores": 2,
                                       "max-ram": 3, "max-volumes": 4, "max-volume-gb": 5,
                                       "nvidia.com/gpu": 6}, {"tenant-name": "open"}]
    limits = load(data).tenant_resource_limits
    assert limits["t"].limits == Resources.limits({"instances": 1, "cores": 2, "ram": 3,
                                                   "volumes": 4, "volume-gb": 5,
                                                   "nvidia.com/gpu": 6})
    assert limits["open"].limits == Resources.limits()
    assert limits["open"].limits["cores"] == math.inf


def test_kubernetes_label_values_are_copied_through() -> None:
    data = base()
    env = [{"name": "A", "value": "1"}]
    at(data, "podlabel").update({
        "image-pull": "Always", "python-path": "/usr/bin/python3", "shell-type": "sh",
        "gpu": 2, "gpu-resource": "nvidia.com/gpu", "env": env,
        "node-selector": {"disk": "ssd"}, "privileged": True, "scheduler-name": "s",
        "volumes": [{"name": "v", "emptyDir": {}}],
        "volume-mounts": [{"name": "v", "mountPath": "/v"}], "labels": {"a": "b"},
        "dynamic-labels": {"t": "{request.tenant_name}"}, "annotations": {"c": "d"}})
    at(data, "pool")["allow-privileged"] = True
    pod = _pod(data)
    assert (pod.image_pull, pod.shell_type) == ("Always", "sh")
    assert pod.python_path == "/usr/bin/python3"
    assert (pod.gpu, pod.gpu_resource) == (2, "nvidia.com/gpu")
    assert pod.env == ({"name": "A", "value": "1"},)
    assert pod.node_selector == {"disk": "ssd"}
    assert (pod.privileged, pod.scheduler_name) == (True, "s")
    assert pod.volumes == ({"name": "v", "emptyDir": {}},)
    assert pod.volume_mounts == ({"name": "v", "mountPath": "/v"},)
    assert (pod.labels, pod.dynamic_labels, pod.annotations) == (
        {"a": "b"}, {"t": "{request.tenant_name}"}, {"c": "d"})
    assert pod.quota()["nvidia.com/gpu"] == 2


def test_config_is_frozen() -> None:
    config = load(base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.zookeeper_timeout = 1  # type: ignore[misc]


def test_sample_file_resolves_as_documented() -> None:
    config = load_config(str(SAMPLE), env={})
    (warning,) = config.warnings  # kubernetes providers, open ZooKeeper ACL
    assert warning.startswith(f"{SAMPLE}: zookeeper-acl: warning: off: ")
    assert config.zk_hosts() == "localhost:2181/nodepool"
    assert config.max_hold_age == 86400
    provider = config.providers["k8s-main"]
    assert (provider.max_servers, provider.max_concurrency) == (50, 10)
    main = provider.pools["main"]
    assert (main.priority, main.max_resources) == (50, {"nvidia.com/gpu": 2})
    fedora = main.labels["pod-fedora"]
    assert (fedora.cpu, fedora.cpu_limit, fedora.boot_timeout) == (1, 2, 600)
    assert fedora.extra_resources == {"example.com/slots": 2}
    gpu = main.labels["pod-gpu"]
    assert (gpu.cpu, gpu.cpu_limit, gpu.memory_limit, gpu.boot_timeout) == (1, 2, 2048, 240)
    assert main.labels["namespace"].quota()["example.com/slots"] == 1
    assert config.providers["fake"].pools["fake"].labels["fake-pod"].type == "pod"


def test_driver_timing_keys_reach_the_provider() -> None:
    data = base()
    data["providers"][0].update({"unschedulable-grace": 0, "delete-timeout": 12.5})
    provider = load(data).providers["k8s"]
    assert (provider.unschedulable_grace, provider.delete_timeout) == (0.0, 12.5)


def test_stuck_namespace_keys_reach_the_provider() -> None:
    data = base()
    data["providers"][0].update({"terminating-grace": 5, "max-pod-grace": 0})
    provider = load(data).providers["k8s"]
    assert (provider.terminating_grace, provider.max_pod_grace) == (5, 0)
    for key, bad in (("terminating-grace", -1), ("max-pod-grace", 1.5)):
        data = base()
        data["providers"][0][key] = bad
        with pytest.raises(ConfigError):
            load(data)
