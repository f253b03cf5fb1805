"""Tracing in a running launcher: its pool worker accepts on one thread, launches run on the
provider's launch threads and the last one to return writes the fulfilment; the request's
spans still form one trace under its root, and stopping the launcher shuts the tracer
down (the spans are flushed). With the tracing extra installed, the configured OTLP/HTTP
exporter delivers spans to a collector."""

from __future__ import annotations

import http.server
import threading

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from nodepool_k8s.config.model import TracingConfig
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.runtime import tracing
from tests.helpers import wait_for
from tests.launchers import BASIC, LauncherFactory


def test_a_build_is_one_trace_across_threads(launchers: LauncherFactory,
                                             zuul: ZuulClient) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    launcher = launchers(BASIC, tracer=tracing.with_provider(provider))
    request_id, nodes = zuul.run_build(["small", "large"], timeout=60.0)

    def finished() -> list[str]:
        return [s.name for s in exporter.get_finished_spans()]
    wait_for(lambda: "request" in finished(), timeout=30.0, message="the request span")
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans if s.context}) == 1
    [root] = [s for s in spans if s.name == "request"]
    assert (root.attributes or {})["nodepool.request.id"] == request_id
    assert sorted((root.attributes or {})["nodepool.nodes"]) == sorted(nodes)  # type: ignore
    root_id = root.context.span_id  # type: ignore[union-attr]
    launch_ids = {s.context.span_id for s in spans  # type: ignore[union-attr]
                  if s.name == "launch" and s.parent and s.parent.span_id == root_id}
    assert len(launch_ids) == 2
    phases = [s for s in spans if s.parent and s.parent.span_id in launch_ids]
    assert sorted(s.name for s in phases) == sorted(["Launched", "Registered",
                                                     "Initialized"] * 2)
    assert [s.name for s in spans if s.parent and s.parent.span_id == root_id
            and s.name != "launch"] == ["accept", "fulfil"]

    launcher.stop()
    # The tracer was shut down with the launcher: its exporter takes no more spans.
    provider.get_tracer("after").start_span("late").end()
    assert "late" not in finished()


class Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that keeps what it is sent (an empty answer is a success)."""

    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server name)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.received.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_configured_exporter_sends_spans_over_otlp_http() -> None:
    """`tracing.start` with a configuration as an operator writes it: the spans reach an
    OTLP/HTTP endpoint, under the configured service name, by the flush at shutdown."""
    # The exporter is in the `test` extra: missing, this fails rather than skips.
    Collector.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        config = TracingConfig(enabled=True, insecure=True, timeout=30.0,
                               endpoint=f"http://127.0.0.1:{server.server_port}/v1/traces",
                               service_name="np-test")
        tracer = tracing.start(config)
        assert tracer.enabled
        root = tracer.root("request", {"nodepool.request.id": "200-0000000001"})
        root.child("accept").end()
        root.end()
        tracer.shutdown()
    finally:
        server.shutdown()
        server.server_close()
    assert Collector.received, "nothing was exported"
    paths = {path for path, _, _ in Collector.received}
    assert paths == {"/v1/traces"}
    assert {kind for _, kind, _ in Collector.received} == {"application/x-protobuf"}
    body = b"".join(body for _, _, body in Collector.received)
    for expected in (b"np-test", b"request", b"accept", b"200-0000000001"):
        assert expected in body
