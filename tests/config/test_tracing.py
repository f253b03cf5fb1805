"""The `tracing` section: defaults (off), every key's valid and invalid values, the rules
between keys (an endpoint when enabled, clear text only with `insecure`), and the one-line
error when tracing is enabled without its packages."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from nodepool_k8s.config.model import TracingConfig
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.runtime import tracing
from tests.config.common import assert_problem, base, load, problems

HTTPS = "https://collector.example.com:4318/v1/traces"


def with_tracing(**section: Any) -> dict[str, Any]:
    data = base()
    data["tracing"] = section
    return data


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if no opentelemetry distribution were installed (a None entry in sys.modules
    makes the import fail, as a missing one does)."""
    for name in ["opentelemetry", tracing.SDK[0], *(m for m, _ in tracing.EXPORTERS.values())]:
        monkeypatch.setitem(sys.modules, name, None)


def test_off_by_default() -> None:
    config = load(base())
    assert config.tracing == TracingConfig()
    assert config.tracing.enabled is False
    assert (config.tracing.protocol, config.tracing.service_name, config.tracing.insecure,
            config.tracing.timeout) == ("http/protobuf", "nodepool-launcher", False, 10.0)


def test_every_key_loads(without_opentelemetry: None) -> None:
    # Disabled: the packages are not needed, the keys are still checked.
    config = load(with_tracing(enabled=False, endpoint="collector:4317", protocol="grpc",
                               **{"service-name": "np-east"}, insecure=True, timeout=2.5))
    assert config.tracing == TracingConfig(enabled=False, endpoint="collector:4317",
                                           protocol="grpc", service_name="np-east",
                                           insecure=True, timeout=2.5)


@pytest.mark.parametrize("key,value,fragment", [
    ("enabled", "yes", "expected bool (true or false), got 'yes'"),
    ("endpoint", 4318, "expected str, got 4318"),
    ("endpoint", " ", "must not be empty"),
    ("protocol", "http/json", "expected one of http/protobuf, grpc"),
    ("service-name", "", "must not be empty"),
    ("insecure", 1, "expected bool"),
    ("timeout", 0, "must be greater than 0"),
    ("timeout", "10s", "expected number"),
])
def test_invalid_values_name_the_key(key: str, value: Any, fragment: str) -> None:
    assert_problem(with_tracing(**{key: value}), f"tracing.{key}", fragment)


def test_unknown_key_suggests_the_known_one() -> None:
    assert_problem(with_tracing(service_name="x"), "tracing.service_name", "service-name")


def test_enabled_needs_an_endpoint(without_opentelemetry: None) -> None:
    assert_problem(with_tracing(enabled=True), "tracing.endpoint",
                   "required when tracing is enabled")


@pytest.mark.parametrize("section", [
    {"endpoint": "http://collector:4318/v1/traces"},
    {"endpoint": "http://collector:4317", "protocol": "grpc"},
])
def test_clear_text_only_with_insecure(section: dict[str, Any]) -> None:
    assert_problem(with_tracing(**section), "tracing.endpoint",
                   "sends spans in clear text: use https://, or set insecure: true")
    load(with_tracing(**section, insecure=True))


@pytest.mark.parametrize("section,fragment", [
    ({"endpoint": "collector:4318"}, "must be a URL starting with https://"),
    ({"endpoint": "ftp://collector", "protocol": "grpc"}, "must be host:port or a URL"),
])
def test_endpoint_form_follows_the_protocol(section: dict[str, Any], fragment: str) -> None:
    assert_problem(with_tracing(**section), "tracing.endpoint", fragment)


@pytest.mark.parametrize("protocol,exporter", [
    ("http/protobuf", "opentelemetry-exporter-otlp-proto-http"),
    ("grpc", "opentelemetry-exporter-otlp-proto-grpc"),
])
def test_enabled_without_the_packages_is_one_line(without_opentelemetry: None, protocol: str,
                                                  exporter: str) -> None:
    found = problems(with_tracing(enabled=True, endpoint=HTTPS, protocol=protocol))
    assert found == [f"tracing.enabled: tracing is enabled but opentelemetry-sdk, {exporter}"
                     " are not installed (pip install 'nodepool_k8s[tracing]'; grpc needs"
                     " opentelemetry-exporter-otlp-proto-grpc)"]


def test_missing_packages_reads_what_is_importable(without_opentelemetry: None) -> None:
    assert tracing.missing_packages("http/protobuf") == [
        "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"]


def test_start_is_the_noop_tracer_when_disabled() -> None:
    assert tracing.start(TracingConfig()) is tracing.NOOP_TRACER


def test_start_refuses_in_one_line_without_the_packages(without_opentelemetry: None) -> None:
    with pytest.raises(ConfigError) as info:
        tracing.start(TracingConfig(enabled=True, endpoint=HTTPS))
    assert "\n" not in str(info.value)
    assert "opentelemetry-sdk" in str(info.value)
