"""statsd reporting: one facade, every metric name in one place.

Owns: the statsd client (configured from `STATSD_HOST` / `STATSD_PORT` like Nodepool, no
prefix) and the names of the metrics the launcher emits. When `STATSD_HOST` is unset the
facade is a null client, so callers never check for None. Sending is fire-and-forget UDP:
a broken statsd never raises into the engine (errors are logged at debug level).

Other reporters (gauges, the web app, Prometheus) should add their names here too, so a
rename happens in one file.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Mapping, Protocol

log = logging.getLogger("nodepool_k8s.stats")

# Launch results, as in Nodepool (`nodepool.launch.<result>`).
RESULT_READY = "ready"
RESULT_ZKSESSION = "error.zksession"
RESULT_QUOTA = "error.quota"
RESULT_UNKNOWN = "error.unknown"
RESULT_NODEPOOL = "error.nodepool"


def sanitize(name: str) -> str:
    """statsd keys use `.` as separator and `:` as value separator: replace both."""
    return name.replace(".", "_").replace(":", "_")


def launch_keys(provider: str, requestor: str | None, result: str) -> list[str]:
    keys = [f"nodepool.launch.{result}", f"nodepool.launch.provider.{provider}.{result}"]
    if requestor:
        keys.append(f"nodepool.launch.requestor.{sanitize(requestor)}.{result}")
    return keys


def leaked_nodes_key(provider: str) -> str:
    return f"nodepool.provider.{provider}.leaked.nodes"


class StatsBackend(Protocol):
    def timing(self, stat: str, delta: float) -> None: ...

    def incr(self, stat: str, count: int = 1) -> None: ...

    def gauge(self, stat: str, value: float) -> None: ...


class NullBackend:
    def timing(self, stat: str, delta: float) -> None:
        pass

    def incr(self, stat: str, count: int = 1) -> None:
        pass

    def gauge(self, stat: str, value: float) -> None:
        pass


class RecordingBackend:
    """Keeps what was sent, for tests: `(kind, key, value)` tuples."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float]] = []
        self._lock = threading.Lock()

    def timing(self, stat: str, delta: float) -> None:
        with self._lock:
            self.sent.append(("timing", stat, delta))

    def incr(self, stat: str, count: int = 1) -> None:
        with self._lock:
            self.sent.append(("incr", stat, count))

    def gauge(self, stat: str, value: float) -> None:
        with self._lock:
            self.sent.append(("gauge", stat, value))

    def keys(self, kind: str | None = None) -> list[str]:
        with self._lock:
            return [k for (t, k, _) in self.sent if kind is None or t == kind]


class Stats:
    """What the engine reports. Wraps a backend; never raises."""

    def __init__(self, backend: StatsBackend | None = None) -> None:
        self.backend: StatsBackend = backend or NullBackend()

    def _safe(self, fn: str, key: str, value: float) -> None:
        try:
            getattr(self.backend, fn)(key, value)
        except Exception as exc:  # statsd must never take the launcher down
            log.debug("statsd %s %s failed: %s", fn, key, exc)

    def launch(self, provider: str, requestor: str | None, result: str,
               duration_ms: float) -> None:
        for key in launch_keys(provider, requestor, result):
            self._safe("timing", key, duration_ms)
            self._safe("incr", key, 1)

    def leaked_nodes(self, provider: str, count: int = 1) -> None:
        self._safe("incr", leaked_nodes_key(provider), count)


def from_env(env: Mapping[str, str] | None = None) -> Stats:
    """A statsd-backed facade when STATSD_HOST is set, else a null one."""
    env = os.environ if env is None else env
    host = env.get("STATSD_HOST")
    if not host:
        return Stats()
    import statsd  # imported only when configured

    port = int(env.get("STATSD_PORT", "8125"))
    return Stats(statsd.StatsClient(host, port))
