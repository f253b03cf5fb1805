"""Tracing with the Kubernetes driver against the simulated cluster: the phase spans follow
the driver's node conditions (namespace created, access granted, pod running), and a pod
whose image cannot be pulled ends its `Initialized` phase, its launch and its request with
status ERROR and the pull failure's reason code."""

from __future__ import annotations

from typing import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.runtime import tracing
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: ns
  - name: pod
  - name: broken-image
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 1
    boot-timeout: 600
    api-retries: 3
    api-backoff: [0.01, 0.05]
    api-timeout: 10
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: ns
            type: namespace
          - name: pod
            type: pod
            image: docker.io/fedora:40
          - name: broken-image
            type: pod
            image: registry.invalid/ci/missing:1
"""


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def tracer_for(exporter: InMemorySpanExporter) -> tracing.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracing.with_provider(provider)


def trace_of(exporter: InMemorySpanExporter, request_id: str) -> list[ReadableSpan]:
    """The finished spans of the request's trace, once its root span has ended."""
    def root() -> ReadableSpan | None:
        return next((s for s in exporter.get_finished_spans() if s.name == "request"
                     and (s.attributes or {}).get("nodepool.request.id") == request_id), None)
    found = wait_for(root, timeout=30.0, message=f"the request span of {request_id}")
    trace_id = found.context.trace_id  # type: ignore[union-attr]
    return [s for s in exporter.get_finished_spans()
            if s.context is not None and s.context.trace_id == trace_id]


def phases(spans: list[ReadableSpan], label: str) -> list[tuple[str, str, StatusCode]]:
    """(phase, reason, status) under the launch of the node of `label`, in order."""
    [launch] = [s for s in spans if s.name == "launch"
                and (s.attributes or {}).get("nodepool.node.label") == label]
    launch_id = launch.context.span_id  # type: ignore[union-attr]
    found = sorted((s for s in spans if s.parent and s.parent.span_id == launch_id),
                   key=lambda s: s.start_time or 0)
    return [(s.name, str((s.attributes or {}).get("nodepool.phase.reason")
                         or (s.attributes or {}).get("nodepool.reason")),
             s.status.status_code) for s in found]


def test_phase_spans_follow_the_drivers_conditions(launchers: LauncherFactory,
                                                   zuul: ZuulClient,
                                                   exporter: InMemorySpanExporter) -> None:
    launchers(CONFIG, tracer=tracer_for(exporter))
    request_id, _ = zuul.run_build(["ns", "pod"], timeout=60.0)
    spans = trace_of(exporter, request_id)

    ok = StatusCode.UNSET
    assert phases(spans, "ns") == [("Launched", "NamespaceCreated", ok),
                                   ("Registered", "AccessGranted", ok),
                                   ("Initialized", "NoWorkload", ok)]
    assert phases(spans, "pod") == [("Launched", "NamespaceCreated", ok),
                                    ("Registered", "AccessGranted", ok),
                                    ("Initialized", "PodRunning", ok)]
    assert [s.name for s in spans if s.name in ("accept", "fulfil")] == ["accept", "fulfil"]


def test_an_image_pull_failure_is_an_error_of_the_initialized_phase(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        exporter: InMemorySpanExporter) -> None:
    k8s_sim.set_faults(image_pull_fail=("registry.invalid/*",))
    launchers(CONFIG, tracer=tracer_for(exporter))
    request_id = zuul.submit(["broken-image"])
    body = zuul.wait(request_id, 60.0)
    assert body is not None and body["state"] == "failed", body
    spans = trace_of(exporter, request_id)

    [(launched, _, launched_status), (registered, _, _), (initialized, reason, status)] \
        = phases(spans, "broken-image")
    assert (launched, registered, initialized) == ("Launched", "Registered", "Initialized")
    assert launched_status is StatusCode.UNSET
    assert status is StatusCode.ERROR and reason in ("ErrImagePull", "ImagePullBackOff")
    for name in ("launch", "request"):
        [span] = [s for s in spans if s.name == name]
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["nodepool.reason"] == reason
    zuul.cancel(request_id)
