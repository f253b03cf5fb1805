"""The trace of a request, recorded with the SDK's in-memory exporter: a pool worker's pass on
a real ZooKeeper with the fake provider (launches run when the test says so).

Aspects: one trace per request whose root `request` span holds `accept`, one `launch` per
node (its phases `Launched`, `Registered`, `Initialized` under it) and `fulfil`, with the
request's attributes, and the accept line in the log names the trace; a failed launch is
an error (status ERROR, reason code) on the phase it stopped in, on its launch and on the
request, which is declined; with tracing off every handler and launch shares the one
no-op span.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from nodepool_k8s.core import model
from nodepool_k8s.launcher.pool_worker import PoolWorker
from nodepool_k8s.launcher.requests.handler import RequestHandler
from nodepool_k8s.runtime import tracing
from tests.launcher.requests.support import InlineLaunches, WorkerDeps

MakeWorkerDeps = Callable[..., WorkerDeps]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def traced(deps: WorkerDeps, exporter: InMemorySpanExporter) -> tuple[PoolWorker,
                                                                      InlineLaunches]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deps.tracer = tracing.with_provider(provider)
    launches = InlineLaunches()
    worker = PoolWorker(deps, "fake", "main", launches, fqdn="test-host")  # type: ignore[arg-type]
    worker.register()
    return worker, launches


def state(deps: WorkerDeps, request_id: str) -> str:
    request = deps.requests.get(request_id)
    assert request is not None
    return request.state


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    context = span.context
    assert context is not None
    return context.span_id


def test_one_trace_per_request_with_accept_each_phase_and_fulfil(
        make_worker_deps: MakeWorkerDeps, exporter: InMemorySpanExporter,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="nodepool_k8s")
    deps = make_worker_deps()
    worker, launches = traced(deps, exporter)
    request_id = deps.submit(["small", "other"])
    worker.run_once()
    launches.run_all()
    assert state(deps, request_id) == model.RequestState.FULFILLED

    spans = list(exporter.get_finished_spans())
    # root, accept, two launches of three phases each, fulfil: all of one trace
    assert len(spans) == 1 + 1 + 2 * 4 + 1
    assert len({s.context.trace_id for s in spans if s.context}) == 1
    [root] = by_name(spans, "request")
    assert root.parent is None
    attributes = dict(root.attributes or {})
    assert attributes["nodepool.request.id"] == request_id
    assert tuple(attributes["nodepool.request.labels"]) == ("small", "other")  # type: ignore
    assert attributes["nodepool.request.requestor"] == "zuul-test"
    assert attributes["nodepool.request.priority"] == "200"
    assert attributes["nodepool.pool"] == "main" and attributes["nodepool.provider"] == "fake"
    assert attributes["nodepool.outcome"] == "fulfilled"
    assert root.status.status_code is StatusCode.UNSET
    [accept] = by_name(spans, "accept")
    [fulfil] = by_name(spans, "fulfil")
    launches_ = by_name(spans, "launch")
    assert len(launches_) == 2
    for child in [accept, fulfil, *launches_]:
        assert parent_of(child) == span_id(root)
    assert accept.start_time == root.start_time
    # The accept line names the trace.
    trace_id = format(root.context.trace_id, "032x")  # type: ignore[union-attr]
    assert f"Accepted request for ['small', 'other'] (trace {trace_id})" in caplog.text
    assert sorted(str((s.attributes or {})["nodepool.node.label"]) for s in launches_) \
        == ["other", "small"]
    nodes = sorted(str((s.attributes or {})["nodepool.node.id"]) for s in launches_)
    assert sorted(root.attributes["nodepool.nodes"]) == nodes  # type: ignore[index, arg-type]
    for launch in launches_:
        phases = [s for s in spans if parent_of(s) == span_id(launch)]
        assert [s.name for s in sorted(phases, key=lambda s: s.start_time or 0)] \
            == ["Launched", "Registered", "Initialized"]
        assert all(s.status.status_code is StatusCode.UNSET for s in phases)
        assert (launch.attributes or {})["nodepool.outcome"] == "ready"
        assert str((launch.attributes or {})["nodepool.node.external_id"]).startswith("main-")
    assert [(s.attributes or {}).get("nodepool.phase.reason") for s in spans
            if s.name == "Initialized"] == ["NoWorkload", "NoWorkload"]


def test_each_request_has_its_own_trace(make_worker_deps: MakeWorkerDeps,
                                        exporter: InMemorySpanExporter) -> None:
    deps = make_worker_deps()
    worker, launches = traced(deps, exporter)
    first, second = deps.submit(["small"]), deps.submit(["small"])
    worker.run_once()
    launches.run_all()

    spans = list(exporter.get_finished_spans())
    roots = {str((s.attributes or {})["nodepool.request.id"]): s
             for s in by_name(spans, "request")}
    assert set(roots) == {first, second}
    trace_ids = {request: root.context.trace_id  # type: ignore[union-attr]
                 for request, root in roots.items()}
    assert trace_ids[first] != trace_ids[second]
    for trace_id in trace_ids.values():
        # root, accept, launch, three phases, fulfil
        assert len([s for s in spans if s.context and s.context.trace_id == trace_id]) == 7


def test_a_failed_launch_is_an_error_on_its_phase_launch_and_request(
        make_worker_deps: MakeWorkerDeps, exporter: InMemorySpanExporter) -> None:
    deps = make_worker_deps(fail=True, retries=2)
    worker, launches = traced(deps, exporter)
    request_id = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    worker.run_once()
    assert state(deps, request_id) == model.RequestState.FAILED

    spans = list(exporter.get_finished_spans())
    [root] = by_name(spans, "request")
    assert root.status.status_code is StatusCode.ERROR
    assert (root.attributes or {})["nodepool.reason"] == "FakeFail"
    assert (root.attributes or {})["nodepool.outcome"] == "declined"
    [decline] = by_name(spans, "decline")
    assert parent_of(decline) == span_id(root)
    assert not by_name(spans, "fulfil")
    [launch] = by_name(spans, "launch")
    assert launch.status.status_code is StatusCode.ERROR
    assert (launch.attributes or {})["nodepool.reason"] == "FakeFail"
    assert (launch.attributes or {})["nodepool.attempts"] == 2
    assert "configured to fail" in (launch.status.description or "")
    # The fake provider fails after creating the resource: each attempt's Launched phase
    # ended well, its Registered phase carries the failure.
    for phase, status in (("Launched", StatusCode.UNSET), ("Registered", StatusCode.ERROR)):
        found = by_name(spans, phase)
        assert sorted((s.attributes or {})["nodepool.attempt"] for s in found) == [1, 2]
        assert {s.status.status_code for s in found} == {status}
        assert all(parent_of(s) == span_id(launch) for s in found)
    assert {(s.attributes or {}).get("nodepool.reason") for s in by_name(spans, "Registered")} \
        == {"FakeFail"}
    assert not by_name(spans, "Initialized")


def test_with_tracing_off_every_request_shares_the_one_noop_span(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps()
    launches = InlineLaunches()
    worker = PoolWorker(deps, "fake", "main", launches, fqdn="test-host")  # type: ignore[arg-type]
    worker.register()
    handlers: list[RequestHandler] = []
    original = worker.new_handler

    def keep(*args: object, **kw: object) -> RequestHandler:
        handler = original(*args, **kw)  # type: ignore[arg-type]
        handlers.append(handler)
        return handler
    worker.new_handler = keep  # type: ignore[method-assign]
    deps.submit(["small"])
    deps.submit(["small", "other"])
    worker.run_once()
    jobs = [slot.job for handler in handlers for slot in handler.slots]
    launches.run_all()

    assert len(handlers) == 2 and len(jobs) == 3
    assert all(handler.span is tracing.NOOP_SPAN for handler in handlers)
    assert all(job is not None and job.span is tracing.NOOP_SPAN for job in jobs)
    assert deps.tracer is tracing.NOOP_TRACER
