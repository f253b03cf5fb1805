"""Optional OpenTelemetry tracing: the only module that imports opentelemetry.

Owns: the process's tracer (`Tracer`) and the small span type the launcher works with
(`Span`). Tracing off (the default) is `NOOP_TRACER`, whose every span is the one
`NOOP_SPAN`: no opentelemetry module is imported, and a request costs no object at all.
Tracing on (`start`) imports the SDK and the OTLP exporter of the configured protocol then,
and sends spans through a batch processor (its own thread) to the collector.

A span never becomes a thread's "current" span (nothing is attached to the context): one
request is worked on by its pool worker's thread and by launch threads, so a child is
always started from its parent explicitly (`Span.child`), and a root span starts from an
empty context, whatever a library may have attached.

How it fails: `missing_packages` names the distributions an enabled configuration lacks
(the configuration checks report them in one line; `start` raises `ConfigError` the same
way). Exporting is best effort: the SDK drops what the collector does not take (it logs
that itself) and a launch never waits for the collector, except at `shutdown`, which
flushes for at most the export timeout.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from typing import Any, Mapping, Protocol, Sequence

from nodepool_k8s.core.errors import ConfigError

log = logging.getLogger("nodepool_k8s.runtime.tracing")

AttributeValue = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, AttributeValue]

# The module an enabled configuration imports, and the distribution that provides it.
SDK = ("opentelemetry.sdk.trace", "opentelemetry-sdk")
EXPORTERS = {
    "http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                      "opentelemetry-exporter-otlp-proto-http"),
    "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
             "opentelemetry-exporter-otlp-proto-grpc"),
}
INSTRUMENTATION = "nodepool_k8s"
REASON_KEY = "nodepool.reason"


class Settings(Protocol):
    """What `start` reads (`config.model.TracingConfig`)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def endpoint(self) -> str | None: ...

    @property
    def protocol(self) -> str: ...

    @property
    def service_name(self) -> str: ...

    @property
    def insecure(self) -> bool: ...

    @property
    def timeout(self) -> float: ...


class Span:
    """A span that records nothing: the type of `NOOP_SPAN`, and the interface of real
    ones. Every method is safe to call on an ended span."""

    recording = False

    @property
    def trace_id(self) -> str:
        """32 hex digits while recording, else empty."""
        return ""

    def child(self, name: str, attributes: Attributes | None = None,
              start_ns: int | None = None) -> "Span":
        """A span under this one; `start_ns` (from `Tracer.now`) if it began earlier."""
        return self

    def set(self, key: str, value: AttributeValue) -> None:
        pass

    def event(self, name: str, message: str = "") -> None:
        pass

    def fail(self, reason: str, message: str = "") -> None:
        """Mark the span failed: status ERROR, `reason` (a `conditions.REASONS` code)."""

    def end(self) -> None:
        pass


NOOP_SPAN = Span()


class Tracer:
    """Tracing off: every span is `NOOP_SPAN`."""

    enabled = False

    def root(self, name: str, attributes: Attributes | None = None,
             start_ns: int | None = None) -> Span:
        """The first span of a new trace; `start_ns` (from `now`) if it began earlier."""
        return NOOP_SPAN

    def now(self) -> int:
        """A start time for `root` (epoch nanoseconds; 0 when off)."""
        return 0

    def shutdown(self) -> None:
        pass


NOOP_TRACER = Tracer()


class _OtelSpan(Span):
    recording = True

    def __init__(self, tracer: "_OtelTracer", span: Any) -> None:
        self._tracer = tracer
        self._span = span
        self._ended = False
        self._lock = threading.Lock()

    @property
    def trace_id(self) -> str:
        return format(self._span.get_span_context().trace_id, "032x")

    def child(self, name: str, attributes: Attributes | None = None,
              start_ns: int | None = None) -> Span:
        return self._tracer.start(name, attributes, parent=self._span, start_ns=start_ns)

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(key, value)

    def event(self, name: str, message: str = "") -> None:
        self._span.add_event(name, {"message": message} if message else None)

    def fail(self, reason: str, message: str = "") -> None:
        self._span.set_attribute(REASON_KEY, reason)
        self._span.set_status(self._tracer.error_status(
            f"{reason}: {message}" if message else reason))

    def end(self) -> None:
        # Ending twice makes the SDK log a warning; the launcher's paths to an end may meet.
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._span.end()


class _OtelTracer(Tracer):
    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Status, StatusCode

        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION)
        self._trace = trace
        self._empty = context.Context()
        self._status, self._error = Status, StatusCode.ERROR

    def start(self, name: str, attributes: Attributes | None, parent: Any = None,
              start_ns: int | None = None) -> Span:
        ctx = self._trace.set_span_in_context(parent) if parent is not None else self._empty
        return _OtelSpan(self, self._tracer.start_span(name, context=ctx,
                                                       attributes=attributes,
                                                       start_time=start_ns or None))

    def error_status(self, description: str) -> Any:
        return self._status(self._error, description)

    def root(self, name: str, attributes: Attributes | None = None,
             start_ns: int | None = None) -> Span:
        return self.start(name, attributes, start_ns=start_ns)

    def now(self) -> int:
        return time.time_ns()

    def shutdown(self) -> None:
        try:
            self._provider.shutdown()
        except Exception as exc:  # the collector's trouble never stops the launcher
            log.warning("Could not flush the last spans: %s", exc)


def with_provider(provider: Any) -> Tracer:
    """Tracing through a ready `TracerProvider` (tests pass one with an in-memory
    exporter); `shutdown` shuts it down."""
    return _OtelTracer(provider)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing_packages(protocol: str) -> list[str]:
    """The distributions tracing over `protocol` needs and this Python cannot import."""
    needed = [SDK, EXPORTERS[protocol]]
    return [dist for module, dist in needed if not _importable(module)]


def unavailable_message(missing: list[str]) -> str:
    return (f"tracing is enabled but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed"
            " (pip install 'nodepool_k8s[tracing]'; grpc needs"
            " opentelemetry-exporter-otlp-proto-grpc)")


def start(settings: Settings) -> Tracer:
    """The tracer `settings` ask for: `NOOP_TRACER` when disabled (nothing imported)."""
    if not settings.enabled:
        return NOOP_TRACER
    missing = missing_packages(settings.protocol)
    if missing:
        raise ConfigError(unavailable_message(missing))
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter_module = importlib.import_module(EXPORTERS[settings.protocol][0])
    except ImportError as exc:  # installed, but broken (e.g. a protobuf it cannot use)
        raise ConfigError(f"tracing is enabled but its packages cannot be loaded: {exc}")
    options: dict[str, Any] = {"endpoint": settings.endpoint, "timeout": settings.timeout}
    if settings.protocol == "grpc":
        options["insecure"] = settings.insecure
    exporter = exporter_module.OTLPSpanExporter(**options)
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: settings.service_name}))
    provider.add_span_processor(BatchSpanProcessor(
        exporter, export_timeout_millis=settings.timeout * 1000.0))
    log.info("Tracing: sending spans over OTLP (%s) to %s as %s", settings.protocol,
             settings.endpoint, settings.service_name)
    return _OtelTracer(provider)
