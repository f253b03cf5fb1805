"""The configuration model's dataclass defaults are the schema's: `config/schema.py` is the
one place a default is written down, and `config/model.py` takes each from there (objects
built without a file, by tests and tools, must behave as a loaded configuration would)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from nodepool_k8s.config import model
from nodepool_k8s.config import schema as S
from nodepool_k8s.core.model import Resources

# (model class, field) -> the schema constant that is its default.
FROM_SCHEMA: dict[tuple[type, str], str] = {
    (model.ZkServer, "port"): "ZK_PORT",
    (model.ZkGrant, "permissions"): "ZK_GRANT_PERMISSIONS",
    (model.ZkAcl, "enabled"): "ZK_ACL_ENABLED",
    (model.LabelConfig, "min_ready"): "MIN_READY",
    (model.LabelConfig, "max_ready_age"): "MAX_READY_AGE",
    (model.WebappConfig, "port"): "WEBAPP_PORT",
    (model.WebappConfig, "listen_address"): "WEBAPP_LISTEN_ADDRESS",
    (model.WebappConfig, "threads"): "WEBAPP_THREADS",
    (model.WebappConfig, "timeout"): "WEBAPP_TIMEOUT",
    (model.WebappConfig, "send_timeout"): "WEBAPP_SEND_TIMEOUT",
    (model.WebappConfig, "max_header_size"): "WEBAPP_MAX_HEADER_SIZE",
    (model.WebappConfig, "max_connections"): "WEBAPP_MAX_CONNECTIONS",
    (model.TracingConfig, "enabled"): "TRACING_ENABLED",
    (model.TracingConfig, "protocol"): "TRACING_PROTOCOL",
    (model.TracingConfig, "service_name"): "TRACING_SERVICE_NAME",
    (model.TracingConfig, "insecure"): "TRACING_INSECURE",
    (model.TracingConfig, "timeout"): "TRACING_TIMEOUT",
    (model.PoolLabel, "image_pull"): "IMAGE_PULL",
    (model.PoolLabel, "python_path"): "PYTHON_PATH",
    (model.PoolLabel, "pod_security"): "POD_SECURITY",
    (model.PoolLabel, "resource_quota"): "RESOURCE_QUOTA",
    (model.PoolLabel, "network_policy"): "NETWORK_POLICY",
    (model.PoolLabel, "allow_external_services"): "ALLOW_EXTERNAL_SERVICES",
    (model.PoolLabel, "allow_job_secrets"): "ALLOW_JOB_SECRETS",
    (model.PoolLabel, "object_quota"): "OBJECT_QUOTA",
    (model.PoolLabel, "boot_timeout"): "BOOT_TIMEOUT",
    (model.PoolLabel, "fake_launch_delay"): "FAKE_LAUNCH_DELAY",
    (model.PoolLabel, "fake_fail"): "FAKE_FAIL",
    (model.PoolLabel, "min_ready"): "MIN_READY",
    (model.MaintenanceWindow, "action"): "MAINTENANCE_ACTION",
    (model.MaintenanceWindow, "timezone"): "TIMEZONE",
    (model.DriftBudget, "max_nodes"): "DRIFT_MAX_NODES",
    (model.DriftBudget, "timezone"): "TIMEZONE",
    (model.DisruptionBudget, "reasons"): "DISRUPTION_REASONS",
    (model.DisruptionBudget, "timezone"): "TIMEZONE",
    (model.PoolConfig, "surplus_delay"): "SURPLUS_DELAY",
    (model.LabelConfig, "max_age"): "MAX_AGE",
    (model.PoolConfig, "priority"): "PRIORITY",
    (model.PoolConfig, "breaker_threshold"): "BREAKER_THRESHOLD",
    (model.PoolConfig, "breaker_backoff"): "BREAKER_BACKOFF",
    (model.PoolConfig, "breaker_backoff_max"): "BREAKER_BACKOFF_MAX",
    (model.ProviderConfig, "launch_retries"): "LAUNCH_RETRIES",
    (model.ProviderConfig, "max_concurrency"): "MAX_CONCURRENCY",
    (model.ProviderConfig, "priority"): "PRIORITY",
    (model.ProviderConfig, "leak_grace"): "LEAK_GRACE",
    (model.ProviderConfig, "api_retries"): "API_RETRIES",
    (model.ProviderConfig, "api_backoff"): "API_BACKOFF",
    (model.ProviderConfig, "api_timeout"): "API_TIMEOUT",
    (model.ProviderConfig, "api_connect_timeout"): "API_CONNECT_TIMEOUT",
    (model.ProviderConfig, "api_read_timeout"): "API_READ_TIMEOUT",
    (model.ProviderConfig, "hand_back_after"): "HAND_BACK_AFTER",
    (model.ProviderConfig, "recently_failed_ttl"): "RECENTLY_FAILED_TTL",
    (model.ProviderConfig, "credentials_backoff"): "CREDENTIALS_BACKOFF",
    (model.ProviderConfig, "credentials_exec_timeout"): "CREDENTIALS_EXEC_TIMEOUT",
    (model.ProviderConfig, "api_probe_interval"): "API_PROBE_INTERVAL",
    (model.ProviderConfig, "api_probe_connect_timeout"): "API_PROBE_CONNECT_TIMEOUT",
    (model.ProviderConfig, "api_probe_read_timeout"): "API_PROBE_READ_TIMEOUT",
    (model.ProviderConfig, "unschedulable_grace"): "UNSCHEDULABLE_GRACE",
    (model.ProviderConfig, "delete_timeout"): "DELETE_TIMEOUT",
    (model.ProviderConfig, "terminating_grace"): "TERMINATING_GRACE",
    (model.ProviderConfig, "max_pod_grace"): "MAX_POD_GRACE",
    (model.ProviderConfig, "token_lifetime"): "TOKEN_LIFETIME",
    (model.ProviderConfig, "installation_id"): "DEFAULT_INSTALLATION_ID",
    (model.ProviderConfig, "job_role"): "JOB_ROLE",
    (model.ProviderConfig, "capacity_nodes"): "CAPACITY_NODES",
    (model.Config, "zookeeper_timeout"): "ZK_TIMEOUT",
    (model.Config, "installation_id"): "DEFAULT_INSTALLATION_ID",
    (model.Config, "installation_id_file"): "INSTALLATION_ID_FILE",
}

# Limits whose absence means "unlimited": resolved to infinity, which the schema has no
# constant for (`max-hold-age: 0`, its default, is stored as infinity too).
UNLIMITED: dict[tuple[type, str], Any] = {
    **{(cls, name): math.inf for cls in (model.PoolConfig, model.ProviderConfig)
       for name in ("max_servers", "max_cores", "max_ram")},
    (model.Config, "max_hold_age"): math.inf,
    (model.TenantLimit, "limits"): Resources.limits(),
}

MODELS = [value for value in vars(model).values()
          if isinstance(value, type) and dataclasses.is_dataclass(value)
          and value.__module__ == model.__name__]


def _default(cls: type, name: str) -> Any:
    found = {f.name: f for f in dataclasses.fields(cls)}[name]
    if found.default_factory is not dataclasses.MISSING:
        return found.default_factory()
    return found.default


def _empty(value: Any) -> bool:
    """No value at all: nothing for the schema to hold."""
    if dataclasses.is_dataclass(value):
        return False
    return value is None or value == () or value == {} or value == ""


@pytest.mark.parametrize("key", sorted(FROM_SCHEMA, key=lambda k: (k[0].__name__, k[1])),
                         ids=lambda k: f"{k[0].__name__}.{k[1]}")
def test_the_dataclass_default_is_the_schemas(key: tuple[type, str]) -> None:
    cls, name = key
    assert _default(cls, name) == getattr(S, FROM_SCHEMA[key])


def test_every_default_with_a_value_comes_from_the_schema() -> None:
    # A new field with a default must be listed above (and so take it from the schema).
    unlisted = []
    for cls in MODELS:
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                continue
            value = _default(cls, f.name)
            if _empty(value) or dataclasses.is_dataclass(value) \
                    or (cls, f.name) in FROM_SCHEMA:
                continue
            if (cls, f.name) in UNLIMITED:
                assert value == UNLIMITED[cls, f.name]
                continue
            if f.name == "installation_id_explicit":  # a flag the loader sets, not a key
                continue
            unlisted.append(f"{cls.__name__}.{f.name} = {value!r}")
    assert unlisted == []


def test_nested_defaults_are_the_nested_models_defaults() -> None:
    config = model.Config(zookeeper_servers=())
    assert config.webapp == model.WebappConfig()
    assert config.tracing == model.TracingConfig()
    assert model.PoolConfig(name="p", provider="q", labels={}).drift_budget \
        == model.DriftBudget()
