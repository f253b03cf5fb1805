"""Prometheus exposition of the facts the statsd gauges carry, plus process metrics.

Owns: which metric families `/metrics` has and their labels. The text format itself (escaping,
number formatting, HELP/TYPE lines) is prometheus_client's: each scrape builds a registry
with one collector over what the web app has read, the launcher's in-process counters, and
prometheus_client's process collector (CPU, memory, open files of the launcher). Pure apart
from reading `/proc/self`; nothing here can fail on odd data (label values are escaped by
the library).
"""

from __future__ import annotations

import platform
from collections import Counter
from typing import Any, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)
from prometheus_client.metrics_core import Metric

from nodepool_k8s import __version__
from nodepool_k8s.core.model import NodeRequest, NodeState, RequestState
from nodepool_k8s.runtime.stats import HELP, Histogram
from nodepool_k8s.views import pools as pool_view
from nodepool_k8s.views.listing import NodeView

CounterValues = Mapping[tuple[str, tuple[tuple[str, str], ...]], float]
HistogramValues = Mapping[tuple[str, tuple[tuple[str, str], ...]], Histogram]


def families(views: Iterable[NodeView], requests: Iterable[NodeRequest], ready: bool,
             counters: CounterValues | None = None,
             gauges: CounterValues | None = None) -> list[Metric]:
    """The launcher's own metric families for one scrape."""
    views = list(views)
    out: list[Metric] = []

    nodes = GaugeMetricFamily("nodepool_nodes", "Nodes by state (all providers).",
                              labels=["state"])
    by_state = Counter(v.node.state for v in views)
    for node_state in NodeState:
        nodes.add_metric([node_state], by_state.get(node_state, 0))
    out.append(nodes)

    provider_nodes = GaugeMetricFamily("nodepool_provider_nodes",
                                       "Nodes by provider and state.",
                                       labels=["provider", "state"])
    by_provider = Counter((v.node.provider or "", v.node.state) for v in views)
    for (provider, state), count in sorted(by_provider.items()):
        provider_nodes.add_metric([str(provider), state], count)
    out.append(provider_nodes)

    label_nodes = GaugeMetricFamily("nodepool_label_nodes", "Nodes by label and state.",
                                    labels=["label", "state"])
    by_label: Counter[tuple[str, NodeState]] = Counter()
    for v in views:
        for label in v.node.type:
            by_label[(label, v.node.state)] += 1
    for (label, state), count in sorted(by_label.items()):
        label_nodes.add_metric([label, state], count)
    out.append(label_nodes)

    request_family = GaugeMetricFamily("nodepool_requests", "Node requests by state.",
                                       labels=["state"])
    req_states = Counter(r.state for r in requests)
    for request_state in sorted(RequestState):
        request_family.add_metric([request_state], req_states.get(request_state, 0))
    out.append(request_family)

    out.append(GaugeMetricFamily("nodepool_launcher_ready",
                                 "1 once the launcher finished starting.",
                                 value=1 if ready else 0))
    build = GaugeMetricFamily("nodepool_build_info",
                              "Always 1; the labels say which nodepool_k8s and Python run.",
                              labels=["version", "python"])
    build.add_metric([__version__, platform.python_version()], 1)
    out.append(build)

    out += _labelled(CounterMetricFamily, counters or {})
    out += _labelled(GaugeMetricFamily, gauges or {})
    return out


def _labelled(kind: type[CounterMetricFamily] | type[GaugeMetricFamily],
              values: CounterValues) -> list[Metric]:
    """In-process counters or gauges (`Stats.count`, `Stats.set_gauge`), one family per name."""
    by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = {}
    for (name, pairs), value in sorted(values.items()):
        by_name.setdefault(name, []).append((pairs, value))
    out: list[Metric] = []
    for name, samples in by_name.items():
        label_names = sorted({k for pairs, _ in samples for k, _ in pairs})
        family = kind(name, _help(name), labels=label_names)
        for pairs, value in samples:
            labels = dict(pairs)
            family.add_metric([labels.get(k, "") for k in label_names], value)
        out.append(family)
    return out


class _Snapshot:
    """A collector that yields families computed beforehand (one scrape's data)."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def histogram_families(histograms: HistogramValues) -> list[Metric]:
    """In-process histograms (`Stats.observe`), e.g. the lifecycle phase durations."""
    by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], Histogram]]] = {}
    for (name, pairs), histogram in sorted(histograms.items(), key=lambda kv: kv[0]):
        by_name.setdefault(name, []).append((pairs, histogram))
    out: list[Metric] = []
    for name, samples in by_name.items():
        label_names = sorted({k for pairs, _ in samples for k, _ in pairs})
        family = HistogramMetricFamily(name, _help(name), labels=label_names)
        for pairs, histogram in samples:
            values = dict(pairs)
            buckets = [(_bound(b), float(c)) for b, c in zip(histogram.buckets,
                                                             histogram.counts)]
            buckets.append(("+Inf", float(histogram.count)))
            family.add_metric([values.get(k, "") for k in label_names], buckets,
                              histogram.total)
        out.append(family)
    return out


def _help(name: str) -> str:
    return HELP.get(name) or name.removeprefix("nodepool_").replace("_", " ") + "."


def _bound(value: float) -> str:
    return repr(float(value))


def pool_families(pools: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """Per running pool worker: its conditions (1 = status True; `_neutral` 1 for a state
    the operator chose, so that alerts can leave a paused pool alone), usage and limits.

    A pool worker is named by its provider, pool and `launcher` (the launcher's host name,
    `host/2`, `host/3` for further workers of the same pool on the same host, in the order
    of their ids): labels that stay the same across restarts, unlike the worker's
    per-process id. A condition's reason is not a label (it changes with every transition
    and would make a new series each time): `nodepool pool-list` and `/pool-list` show it."""
    condition = GaugeMetricFamily(
        "nodepool_pool_condition", "Pool conditions (1 when the condition's status is True).",
        labels=["provider", "pool", "launcher", "condition"])
    neutral = GaugeMetricFamily(
        "nodepool_pool_condition_neutral",
        "Pool conditions in a state the operator chose (1: paused, draining, disabled;"
        " neither healthy nor a fault).",
        labels=["provider", "pool", "launcher", "condition"])
    usage = GaugeMetricFamily("nodepool_pool_usage",
                              "Pool usage per limited resource (servers: nodes, cores: CPUs,"
                              " ram: MiB, others in their own unit).",
                              labels=["provider", "pool", "launcher", "scope", "resource"])
    limit = GaugeMetricFamily("nodepool_pool_limit",
                              "Pool limit per limited resource (units as nodepool_pool_usage).",
                              labels=["provider", "pool", "launcher", "scope", "resource"])
    nodes = GaugeMetricFamily("nodepool_pool_nodes", "Nodes of the pool by state.",
                              labels=["provider", "pool", "launcher", "state"])
    launching = GaugeMetricFamily("nodepool_pool_launches_in_progress",
                                  "Launches of the pool worker not finished yet.",
                                  labels=["provider", "pool", "launcher"])
    queued = GaugeMetricFamily("nodepool_pool_requests_queued",
                               "Requests that wait on the pool: held at quota, or held"
                               " back while it is paused, drained or busy (or their tenant"
                               " is at its limit) and no other pool takes them.",
                               labels=["provider", "pool", "launcher"])
    for key, record in _named(pools):
        _add_conditions(condition, neutral, key, record)
        for row in record.get("usage") or []:
            if not isinstance(row, dict):
                continue
            labels = key + [str(row.get("scope", "")), str(row.get("resource", ""))]
            if _number(row.get("used")):
                usage.add_metric(labels, row["used"])
            if _number(row.get("limit")):
                limit.add_metric(labels, row["limit"])
        for state, count in sorted((record.get("nodes") or {}).items()):
            if _number(count):
                nodes.add_metric(key + [str(state)], count)
        if _number(record.get("launches_in_progress")):
            launching.add_metric(key, record["launches_in_progress"])
        if _number(record.get("requests_queued")):
            queued.add_metric(key, record["requests_queued"])
    return [condition, neutral, usage, limit, nodes, launching, queued] \
        + combined_families(pools)


def combined_families(pools: Iterable[Mapping[str, Any]]) -> list[Metric]:
    """Per pool, whichever launchers serve it: its combined conditions (`views.pools`'s
    rule: the worst status wins), how many launchers publish its status and are ready, and
    its drifted spares. Labelled by provider and pool only, so an alert on a pool fires once
    however many launchers serve it."""
    condition = GaugeMetricFamily(
        "nodepool_pool_combined_condition",
        "Pool conditions combined over every launcher serving the pool (1 when the"
        " combined status is True: no launcher reports it False or Unknown).",
        labels=["provider", "pool", "condition"])
    neutral = GaugeMetricFamily(
        "nodepool_pool_combined_condition_neutral",
        "Combined pool conditions in a state the operator chose on every launcher (1:"
        " paused, draining, disabled).", labels=["provider", "pool", "condition"])
    launchers = GaugeMetricFamily(
        "nodepool_pool_launchers", "Launchers publishing a status for the pool.",
        labels=["provider", "pool"])
    ready = GaugeMetricFamily(
        "nodepool_pool_launchers_ready",
        "Launchers of the pool whose API server and credentials are not known bad.",
        labels=["provider", "pool"])
    drifted = GaugeMetricFamily(
        "nodepool_pool_drifted_spares",
        "Spare nodes of the pool built from an older configuration of their label (replaced"
        " within the pool's drift-budget).", labels=["provider", "pool"])
    for record in pool_view.combine(r for r in pools if isinstance(r, Mapping)):
        key = [str(record.get("provider", "")), str(record.get("pool", ""))]
        _add_conditions(condition, neutral, key, record)
        entries = [e for e in record.get("launchers") or [] if isinstance(e, dict)]
        launchers.add_metric(key, len(entries))
        ready.add_metric(key, sum(1 for e in entries if e.get("ready") is True))
        if _number(record.get("drifted")):
            drifted.add_metric(key, record["drifted"])
    return [condition, neutral, launchers, ready, drifted]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _named(pools: Iterable[Mapping[str, Any]]) -> list[tuple[list[str], Mapping[str, Any]]]:
    """Each record with its stable labels [provider, pool, launcher] (see pool_families)."""
    out: list[tuple[list[str], Mapping[str, Any]]] = []
    for group in pool_view.groups(r for r in pools if isinstance(r, Mapping)):
        for name, record in zip(pool_view.launcher_names(group), group):
            out.append(([str(record.get("provider", "")), str(record.get("pool", "")), name],
                        record))
    return out


def _add_conditions(condition: GaugeMetricFamily, neutral: GaugeMetricFamily,
                    key: list[str], record: Mapping[str, Any]) -> None:
    """One sample per condition of a pool record: 1 when True (and, in `neutral`, 1 when
    the state is one an operator chose)."""
    for cond in record.get("conditions") or []:
        if isinstance(cond, dict):
            labels = key + [str(cond.get("type", ""))]
            condition.add_metric(labels, 1 if cond.get("status") == "True" else 0)
            neutral.add_metric(labels, 1 if cond.get("neutral") is True else 0)


def render(views: Iterable[NodeView], requests: Iterable[NodeRequest], ready: bool,
           counters: CounterValues | None = None, process: bool = True,
           histograms: HistogramValues | None = None,
           pools: Iterable[Mapping[str, Any]] = (),
           gauges: CounterValues | None = None) -> str:
    """The /metrics body (text format 0.0.4). `counters` and `gauges` map (metric name,
    sorted label pairs) to a value, `histograms` to a `stats.Histogram`; `process` adds
    prometheus_client's process_* metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families(views, requests, ready, counters, gauges)
                                + histogram_families(histograms or {})
                                + pool_families(pools)))
    if process:
        ProcessCollector(registry=registry)
    return generate_latest(registry).decode("utf8")
