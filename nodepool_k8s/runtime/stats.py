"""statsd reporting: one facade, every metric name in one place.

Owns: the statsd client (configured from `STATSD_HOST` / `STATSD_PORT` like Nodepool, no
prefix), the names of every metric the launcher emits (Nodepool's keys, so existing
dashboards keep working; its own where Nodepool has none, documented in doc/operation.md)
and the in-process counters, histograms and gauges the web app's `/metrics` exposes in
Prometheus form. When `STATSD_HOST` is unset the facade is a null client, so callers never
check for None; the Prometheus counters are kept either way. Sending is fire-and-forget
UDP: a broken statsd never raises into the engine (errors are logged at debug level).

Names are sanitised (`.` and `:` become `_`) exactly where Nodepool does it: requestor,
tenant and tenant-limit names (and the launcher's host name in the `zk` keys, which are not
Nodepool's). Provider, pool and label names are used as they are, as in Nodepool (a `.` in
them adds a level to the key).
"""

from __future__ import annotations

import logging
import math
import re
import os
import threading
from typing import Any, Mapping, Protocol, Sequence

from nodepool_k8s.core.errors import ConfigError

log = logging.getLogger("nodepool_k8s.runtime.stats")

# Launch results, as in Nodepool (`nodepool.launch.<result>`).
RESULT_READY = "ready"
RESULT_ZKSESSION = "error.zksession"
RESULT_QUOTA = "error.quota"
RESULT_UNKNOWN = "error.unknown"
RESULT_NODEPOOL = "error.nodepool"
# The provider could not act at all (its credentials refused): aborted, not a failure.
RESULT_UNAVAILABLE = "error.unavailable"


# Anything else would break the statsd line protocol (`:`, `|`, `@`, `#`, newlines) or make
# an unreadable key; names come from configuration and from requestors (other programs).
_UNSAFE = re.compile(r"[^A-Za-z0-9_./\-]")


def key_part(name: str) -> str:
    """A provider, pool or label name as a key component: unsafe characters become `_`.
    Dots are kept, as Nodepool keeps them in these names (dashboards rely on the keys)."""
    return _UNSAFE.sub("_", name) or "_"


def sanitize(name: str) -> str:
    """A requestor or tenant name as one key component (dots replaced too, as Nodepool
    does for requestors)."""
    return key_part(name).replace(".", "_")


def launch_keys(provider: str, requestor: str | None, result: str) -> list[str]:
    provider = key_part(provider)
    keys = [f"nodepool.launch.{result}", f"nodepool.launch.provider.{provider}.{result}"]
    if requestor:
        keys.append(f"nodepool.launch.requestor.{sanitize(requestor)}.{result}")
    return keys


def pool_status_gauges(record: Mapping[str, Any]) -> dict[str, float]:
    """statsd gauges of one published pool status (see launcher/reporting/pool_status.py), in
    Nodepool's naming style: `nodepool.pool.<provider>.<pool>.` + `condition.<Type>` (1 when
    True), `usage.<scope>.<resource>`, `limit.<scope>.<resource>`, `nodes.<state>`,
    `requests_queued`. Odd entries of the record are skipped."""
    prefix = (f"nodepool.pool.{key_part(str(record.get('provider', '')))}"
              f".{key_part(str(record.get('pool', '')))}")
    out: dict[str, float] = {}
    for cond in record.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type"):
            out[f"{prefix}.condition.{key_part(str(cond['type']))}"] = \
                1.0 if cond.get("status") == "True" else 0.0
    for row in record.get("usage") or []:
        if not isinstance(row, dict):
            continue
        where = f"{key_part(str(row.get('scope', '')))}.{key_part(str(row.get('resource', '')))}"
        for kind, value in (("usage", row.get("used")), ("limit", row.get("limit"))):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{prefix}.{kind}.{where}"] = float(value)
    nodes = record.get("nodes")
    if isinstance(nodes, dict):
        for state, count in nodes.items():
            if isinstance(count, (int, float)) and not isinstance(count, bool):
                out[f"{prefix}.nodes.{key_part(str(state))}"] = float(count)
    queued = record.get("requests_queued")
    if isinstance(queued, (int, float)) and not isinstance(queued, bool):
        out[f"{prefix}.requests_queued"] = float(queued)
    return out


def launch_error_key(provider: str, reason: str) -> str:
    """A failed (or quota-aborted) launch by reason (`conditions.REASONS`, bounded).

    Its own branch (`reason.`), not beside Nodepool's `error.<result>` keys: the same
    failure is already counted there once, and `sumSeries(...error.*)` must not count it
    twice."""
    return f"nodepool.launch.provider.{key_part(provider)}.reason.{key_part(reason)}"


# The whole launch, from the node's creation to ready: a timer of its own, so that the
# phase timers add up to it instead of including it.
TOTAL_PHASE = "total"


def phase_keys(provider: str, pool: str, label: str, phase: str) -> list[str]:
    """Timers of one lifecycle phase (`conditions.PHASES`) per provider, pool and label;
    the whole launch (`TOTAL_PHASE`) is `...ready_time` instead of a phase."""
    prefix = f"nodepool.launch.provider.{key_part(provider)}"
    leaf = "ready_time" if phase == TOTAL_PHASE else f"phase.{phase}"
    return [f"{prefix}.{leaf}",
            f"{prefix}.pool.{key_part(pool)}.{leaf}",
            f"nodepool.launch.label.{key_part(label)}.{leaf}"]


def request_keys(provider: str, labels: Sequence[str], result: str) -> list[str]:
    """Timers of one finished request (`REQUEST_RESULTS`) overall, per provider and per
    distinct label it asked for (a request for several labels counts under each)."""
    keys = [f"nodepool.request.{result}",
            f"nodepool.request.provider.{key_part(provider)}.{result}"]
    keys += [f"nodepool.request.label.{key_part(label)}.{result}"
             for label in sorted(set(labels))]
    return keys


def api_call_key(provider: str, verb: str, resource: str, code: str) -> str:
    """One Kubernetes API request; a subresource (`serviceaccounts/token`) becomes one key
    component (`serviceaccounts_token`)."""
    return (f"nodepool.provider.{key_part(provider)}.kubernetes.{key_part(verb)}"
            f".{key_part(resource).replace('/', '_')}.{key_part(code)}")


def zk_state_key(hostname: str, state: str) -> str:
    return f"nodepool.launcher.{sanitize(hostname)}.zk.state.{key_part(state)}"


def zk_session_lost_key(hostname: str) -> str:
    return f"nodepool.launcher.{sanitize(hostname)}.zk.session_lost"


def zk_reconnects_key(hostname: str) -> str:
    return f"nodepool.launcher.{sanitize(hostname)}.zk.reconnects"


def leaked_nodes_key(provider: str) -> str:
    return f"nodepool.provider.{key_part(provider)}.leaked.nodes"


def delete_refused_key(provider: str) -> str:
    return f"nodepool.provider.{key_part(provider)}.delete_refused"


def handed_back_key(provider: str, pool: str, reason: str) -> str:
    return f"nodepool.pool.{key_part(provider)}.{key_part(pool)}.handed_back.{key_part(reason)}"


def delete_stuck_key(provider: str) -> str:
    return f"nodepool.provider.{key_part(provider)}.delete_stuck"


def spares_removed_key(provider: str, pool: str, reason: str) -> str:
    return (f"nodepool.provider.{key_part(provider)}.pool.{key_part(pool)}"
            f".spares_removed.{key_part(reason)}")


def malformed_key(kind: str) -> str:
    return f"nodepool.malformed.{key_part(kind)}"


def thread_crash_key(thread: str) -> str:
    return f"nodepool.launcher.thread_crash.{sanitize(thread)}"


# Configuration reloads of this launcher: applied (the unchanged ones too) and rejected.
CONFIG_RELOADS_KEY = "nodepool.launcher.config_reloads"
CONFIG_RELOAD_FAILURES_KEY = "nodepool.launcher.config_reload_failures"


# Gauges the stats leader reports for the whole system (see launcher/reporting/gauges.py).
def nodes_key(state: str) -> str:
    return f"nodepool.nodes.{key_part(state)}"


def provider_nodes_key(provider: str, state: str) -> str:
    return f"nodepool.provider.{key_part(provider)}.nodes.{key_part(state)}"


def label_nodes_key(label: str, state: str) -> str:
    return f"nodepool.label.{key_part(label)}.nodes.{key_part(state)}"


def addressable_requests_key(provider: str, pool: str) -> str:
    return (f"nodepool.provider.{key_part(provider)}.pool.{key_part(pool)}"
            ".addressable_requests")


# Gauges every launcher reports for its own configuration.
def max_servers_key(provider: str) -> str:
    return f"nodepool.provider.{key_part(provider)}.max_servers"


def tenant_limit_key(tenant: str, limit: str) -> str:
    return f"nodepool.tenant_limits.{sanitize(tenant)}.{sanitize(limit)}"


# Prometheus counter families kept in process (rendered by prometheus.py for /metrics).
PROM_LAUNCHES = "nodepool_launch_total"
PROM_LEAKED = "nodepool_leaked_nodes_total"
PROM_GAUGE_REPORTS = "nodepool_stats_gauge_reports_total"
PROM_MALFORMED = "nodepool_malformed_records_total"
PROM_DELETE_REFUSED = "nodepool_delete_refused_total"
PROM_DELETE_STUCK = "nodepool_delete_stuck_total"
PROM_HANDED_BACK = "nodepool_requests_handed_back_total"
PROM_SPARES_REMOVED = "nodepool_spares_removed_total"
PROM_THREAD_CRASHES = "nodepool_thread_crashes_total"
PROM_LAUNCH_ERRORS = "nodepool_launch_errors_total"
PROM_PHASE_SECONDS = "nodepool_node_phase_seconds"
PROM_LAUNCH_SECONDS = "nodepool_node_launch_seconds"
PROM_REQUEST_WAIT = "nodepool_request_wait_seconds"
PROM_API_REQUESTS = "nodepool_kubernetes_api_requests_total"
PROM_ZK_STATE = "nodepool_zk_connection_state"
PROM_ZK_SESSION_LOSSES = "nodepool_zk_session_losses_total"
PROM_ZK_RECONNECTS = "nodepool_zk_reconnects_total"

# A request's end as this launcher wrote it.
REQUEST_FULFILLED = "fulfilled"
REQUEST_FAILED = "failed"
REQUEST_RESULTS = (REQUEST_FULFILLED, REQUEST_FAILED)
# The ZooKeeper connection's states (`zk.client.ConnectionState` values).
ZK_STATES = ("connected", "suspended", "lost")
PROM_CONFIG_RELOADS = "nodepool_config_reloads_total"
PROM_CONFIG_RELOAD_FAILURES = "nodepool_config_reload_failures_total"

# HELP texts of the in-process counters and histograms (`/metrics`), with their units.
HELP = {
    PROM_LAUNCHES: "Launches finished by this launcher, by provider and Nodepool result"
                   " (ready, error.quota, error.unknown, ...).",
    PROM_LEAKED: "Cluster resources of this installation found without a node record and"
                 " deleted.",
    PROM_GAUGE_REPORTS: "Times this launcher, as stats leader, sent the global gauges.",
    PROM_MALFORMED: "Records in ZooKeeper that could not be decoded, by kind (each logged once"
                    " with its path).",
    PROM_DELETE_REFUSED: "Deletions refused because the resource is not provably this"
                         " installation's.",
    PROM_DELETE_STUCK: "Deletions still not finished after terminating-grace.",
    PROM_HANDED_BACK: "Requests a pool held but handed back to other pools (it could not"
                      " serve them: the reason is why it waited), by provider, pool, reason.",
    PROM_SPARES_REMOVED: "Spare nodes (ready, unallocated, unlocked) this launcher asked to"
                         " delete, by provider, pool and reason: drift, expiry (max-age),"
                         " surplus (beyond min-ready) or drain; each within the pool's"
                         " disruption budgets.",
    PROM_THREAD_CRASHES: "Launcher threads that raised and were restarted, by thread.",
    PROM_LAUNCH_ERRORS: "Failed or quota-aborted launches by provider and reason code; each is"
                        " also one of nodepool_launch_total's error results.",
    PROM_PHASE_SECONDS: "Seconds each launch phase took (launch, register, initialize, ready,"
                        " deletion); the phases of one node add up to"
                        " nodepool_node_launch_seconds.",
    PROM_LAUNCH_SECONDS: "Seconds from a node's creation to ready.",
    PROM_REQUEST_WAIT: "Seconds from a node request's creation (by its requestor) to this"
                       " launcher fulfilling or failing it, by provider, pool, the request's"
                       " labels and result.",
    PROM_API_REQUESTS: "Requests this launcher sent to a provider's Kubernetes API, by"
                       " provider, verb, resource and HTTP status code (none: no answer).",
    PROM_ZK_STATE: "1 for the state the ZooKeeper connection is in (connected, suspended,"
                   " lost), 0 for the others.",
    PROM_ZK_SESSION_LOSSES: "ZooKeeper sessions this launcher lost (expired: its locks and"
                            " ephemeral znodes went with them).",
    PROM_ZK_RECONNECTS: "Times this launcher connected to ZooKeeper again after the"
                        " connection dropped (in the same session or a new one).",
    PROM_CONFIG_RELOADS: "Configuration reloads (SIGHUP or a changed file) this launcher"
                         " applied, an unchanged configuration included.",
    PROM_CONFIG_RELOAD_FAILURES: "Configuration reloads this launcher rejected (invalid, or"
                                 " not applicable to the running launcher): it still runs"
                                 " the previous configuration; the event log has the error"
                                 " (kind reload-rejected).",
}
# Histogram buckets (seconds) of the lifecycle phases: image pulls take minutes.
PHASE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Requests also wait in the queue behind others and for quota: up to hours.
REQUEST_BUCKETS = PHASE_BUCKETS + (1800.0, 3600.0, 7200.0)

CounterKey = tuple[str, tuple[tuple[str, str], ...]]


class Histogram:
    """Cumulative bucket counts and the sum of observations, as Prometheus wants them."""

    __slots__ = ("buckets", "counts", "total", "count")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def copy(self) -> "Histogram":
        other = Histogram(self.buckets)
        other.counts, other.total, other.count = list(self.counts), self.total, self.count
        return other


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
        self._counts: dict[CounterKey, float] = {}
        self._histograms: dict[CounterKey, Histogram] = {}
        self._gauges: dict[CounterKey, float] = {}
        self._counts_lock = threading.Lock()

    def _safe(self, fn: str, key: str, value: float) -> None:
        try:
            getattr(self.backend, fn)(key, value)
        except Exception as exc:  # statsd must never take the launcher down
            log.debug("statsd %s %s failed: %s", fn, key, exc)

    def count(self, name: str, amount: float = 1, **labels: str) -> None:
        """Add to an in-process (Prometheus) counter only; nothing is sent to statsd."""
        key = (name, tuple(sorted(labels.items())))
        with self._counts_lock:
            self._counts[key] = self._counts.get(key, 0) + amount

    def counters(self) -> dict[CounterKey, float]:
        """A snapshot of the in-process counters, for Prometheus (`/metrics`)."""
        with self._counts_lock:
            return dict(self._counts)

    def observe(self, name: str, value: float, buckets: tuple[float, ...] = PHASE_BUCKETS,
                **labels: str) -> None:
        """Add to an in-process (Prometheus) histogram (`buckets`: its upper bounds, the
        same for every observation of one name)."""
        key = (name, tuple(sorted(labels.items())))
        with self._counts_lock:
            histogram = self._histograms.get(key)
            if histogram is None:
                histogram = self._histograms[key] = Histogram(buckets)
            histogram.observe(value)

    def set_gauge(self, name: str, value: float, **labels: str) -> None:
        """Set an in-process (Prometheus) gauge only; nothing is sent to statsd."""
        key = (name, tuple(sorted(labels.items())))
        with self._counts_lock:
            self._gauges[key] = value

    def gauge_values(self) -> dict[CounterKey, float]:
        """A snapshot of the in-process gauges, for Prometheus (`/metrics`)."""
        with self._counts_lock:
            return dict(self._gauges)

    def histograms(self) -> dict[CounterKey, Histogram]:
        """A snapshot of the in-process histograms, for Prometheus (`/metrics`)."""
        with self._counts_lock:
            return {k: h.copy() for k, h in self._histograms.items()}

    def launch_error(self, provider: str, reason: str) -> None:
        """A launch that failed (or was aborted for quota), by bounded reason."""
        self._safe("incr", launch_error_key(provider, reason), 1)
        self.count(PROM_LAUNCH_ERRORS, provider=provider, reason=reason)

    def phases(self, provider: str, pool: str, label: str,
               seconds: Mapping[str, float]) -> None:
        """Lifecycle phase durations of one node (`conditions.timings`)."""
        for phase, value in seconds.items():
            for key in phase_keys(provider, pool, label, phase):
                self._safe("timing", key, value * 1000.0)
            if phase == TOTAL_PHASE:
                self.observe(PROM_LAUNCH_SECONDS, value, provider=provider, pool=pool,
                             label=label)
            else:
                self.observe(PROM_PHASE_SECONDS, value, provider=provider, pool=pool,
                             label=label, phase=phase)

    def launch(self, provider: str, requestor: str | None, result: str,
               duration_ms: float) -> None:
        for key in launch_keys(provider, requestor, result):
            self._safe("timing", key, duration_ms)
            self._safe("incr", key, 1)
        self.count(PROM_LAUNCHES, provider=provider, result=result)

    def request_done(self, provider: str, pool: str, labels: Sequence[str], result: str,
                     seconds: float) -> None:
        """A request this launcher fulfilled or failed (`REQUEST_RESULTS`), `seconds` after
        its requestor created it. `labels`: the labels it asked for that the pool knows
        (empty when it asked for any other: one bounded `(unsupported)` series then)."""
        seconds = max(0.0, seconds)
        for key in request_keys(provider, labels, result):
            self._safe("timing", key, seconds * 1000.0)
        self.observe(PROM_REQUEST_WAIT, seconds, REQUEST_BUCKETS, provider=provider,
                     pool=pool, labels=",".join(sorted(set(labels))) or "(unsupported)",
                     result=result)

    def api_call(self, provider: str, verb: str, resource: str, code: str) -> None:
        """One request sent to a provider's Kubernetes API and its HTTP status (`none` when
        no answer came; see `driver.base.ApiCallListener`)."""
        self._safe("incr", api_call_key(provider, verb, resource, code), 1)
        self.count(PROM_API_REQUESTS, provider=provider, verb=verb, resource=resource,
                   code=code)

    def zk_connection(self, hostname: str, state: str, initial: bool = False) -> None:
        """The ZooKeeper connection is now in `state` (`ZK_STATES`): one gauge per state, 1
        for this one. After the `initial` connect, a `lost` state counts a session loss and
        a `connected` one a reconnect (the counters start at 0 with the initial call)."""
        gauges = {}
        for name in ZK_STATES:
            value = 1.0 if name == state else 0.0
            gauges[zk_state_key(hostname, name)] = value
            self.set_gauge(PROM_ZK_STATE, value, state=name)
        self.gauges(gauges)
        if initial:
            self.count(PROM_ZK_SESSION_LOSSES, 0)
            self.count(PROM_ZK_RECONNECTS, 0)
        elif state == "lost":
            self._safe("incr", zk_session_lost_key(hostname), 1)
            self.count(PROM_ZK_SESSION_LOSSES)
        elif state == "connected":
            self._safe("incr", zk_reconnects_key(hostname), 1)
            self.count(PROM_ZK_RECONNECTS)

    def leaked_nodes(self, provider: str, count: int = 1) -> None:
        self._safe("incr", leaked_nodes_key(provider), count)
        self.count(PROM_LEAKED, count, provider=provider)

    def delete_refused(self, provider: str) -> None:
        """A node's resource was not provably ours: the record was dropped, nothing deleted."""
        self._safe("incr", delete_refused_key(provider), 1)
        self.count(PROM_DELETE_REFUSED, provider=provider)

    def delete_stuck(self, provider: str) -> None:
        """A deletion (a node's or a leak's) stayed underway past the provider's grace
        (a namespace Terminating past `terminating-grace`); counted once per deletion."""
        self._safe("incr", delete_stuck_key(provider), 1)
        self.count(PROM_DELETE_STUCK, provider=provider)

    def handed_back(self, provider: str, pool: str, reason: str) -> None:
        """A pool handed a request it held back to other pools (`reason`: why it could
        not serve it, a waiting reason code)."""
        self._safe("incr", handed_back_key(provider, pool, reason), 1)
        self.count(PROM_HANDED_BACK, provider=provider, pool=pool, reason=reason)

    def spare_removed(self, provider: str, pool: str, reason: str) -> None:
        """A spare of the pool was asked to be deleted for `reason` (disruption.py)."""
        self._safe("incr", spares_removed_key(provider, pool, reason), 1)
        self.count(PROM_SPARES_REMOVED, provider=provider, pool=pool, reason=reason)

    def malformed(self, kind: str) -> None:
        """A malformed record (`node`, `request`) was seen for the first time."""
        self._safe("incr", malformed_key(kind), 1)
        self.count(PROM_MALFORMED, kind=kind)

    def thread_crashed(self, thread: str) -> None:
        """A long-lived thread's body raised (see nodepool_k8s/runtime/threads.py)."""
        self._safe("incr", thread_crash_key(thread), 1)
        self.count(PROM_THREAD_CRASHES, thread=thread)

    def config_reload(self, applied: bool) -> None:
        """A configuration reload this launcher applied, or rejected (kept the old one)."""
        if applied:
            self._safe("incr", CONFIG_RELOADS_KEY, 1)
            self.count(PROM_CONFIG_RELOADS)
        else:
            self._safe("incr", CONFIG_RELOAD_FAILURES_KEY, 1)
            self.count(PROM_CONFIG_RELOAD_FAILURES)

    def gauges(self, values: Mapping[str, float]) -> int:
        """Send many gauges, batched into few packets when the client can; returns how many.

        Infinite values are skipped: statsd has no way to carry them (an unlimited
        `max_servers` is simply not reported).
        """
        finite = {k: v for k, v in values.items() if not math.isinf(v) and not math.isnan(v)}
        if not finite or isinstance(self.backend, NullBackend):
            return 0
        backend: Any = self.backend
        pipe = None
        try:
            # statsd's pipeline packs gauges into datagrams of up to 512 bytes: a few hundred
            # gauges cost a handful of packets instead of one each.
            pipe = backend.pipeline() if hasattr(backend, "pipeline") else None
        except Exception as exc:
            log.debug("statsd pipeline unavailable: %s", exc)
        target = pipe if pipe is not None else backend
        for key, value in sorted(finite.items()):
            try:
                target.gauge(key, value)
            except Exception as exc:
                log.debug("statsd gauge %s failed: %s", key, exc)
        if pipe is not None:
            try:
                pipe.send()
            except Exception as exc:
                log.debug("statsd pipeline send failed: %s", exc)
        return len(finite)


def from_env(env: Mapping[str, str] | None = None) -> Stats:
    """A statsd-backed facade when STATSD_HOST is set, else a null one.

    ConfigError for a value that can never work (a port that is not 1-65535, a host that
    is not valid UTF-8). A host that does not resolve now (DNS trouble) is logged as an
    ERROR and the launcher runs without metrics rather than not at all."""
    env = os.environ if env is None else env
    host = env.get("STATSD_HOST")
    if not host:
        return Stats()
    try:
        host.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("STATSD_HOST: not valid UTF-8") from None
    raw_port = env.get("STATSD_PORT", "8125")
    try:
        port = int(raw_port)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise ConfigError(f"STATSD_PORT: {raw_port[:40]!r} is not a port (1-65535)")
    import statsd  # imported only when configured

    try:
        return Stats(statsd.StatsClient(host, port))
    except (OSError, UnicodeError) as exc:
        log.error("statsd at %s:%d is unusable (%s): running without statsd metrics",
                  host[:100], port, exc)
        return Stats()
