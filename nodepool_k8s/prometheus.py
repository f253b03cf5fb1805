"""Prometheus text exposition of the facts the statsd gauges carry.

Owns: turning node and request records (plus counters a launcher keeps) into the Prometheus
text format (version 0.0.4). Pure: the web app calls it with what it has read. Label values
are escaped; nothing here can fail on odd data.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from nodepool_k8s.model import NODE_STATES, REQUEST_STATES, NodeRequest
from nodepool_k8s.status import NodeView


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        text = repr(float(value)) if not float(value).is_integer() else str(int(value))
        self.lines.append(f"{name}{_labels(labels)} {text}")


def render(views: Iterable[NodeView], requests: Iterable[NodeRequest], ready: bool,
           counters: Mapping[tuple[str, tuple[tuple[str, str], ...]], float] | None = None,
           ) -> str:
    """The /metrics body. `counters` maps (metric name, sorted label pairs) to a value."""
    views = list(views)
    w = _Writer()

    w.family("nodepool_nodes", "gauge", "Nodes by state (all providers).")
    by_state = Counter(v.node.state for v in views)
    for state in NODE_STATES:
        w.sample("nodepool_nodes", {"state": state}, by_state.get(state, 0))

    w.family("nodepool_provider_nodes", "gauge", "Nodes by provider and state.")
    by_provider = Counter((v.node.provider or "", v.node.state) for v in views)
    for (provider, state), count in sorted(by_provider.items()):
        w.sample("nodepool_provider_nodes", {"provider": provider, "state": state}, count)

    w.family("nodepool_label_nodes", "gauge", "Nodes by label and state.")
    by_label: Counter[tuple[str, str]] = Counter()
    for v in views:
        for label in v.node.type:
            by_label[(label, v.node.state)] += 1
    for (label, state), count in sorted(by_label.items()):
        w.sample("nodepool_label_nodes", {"label": label, "state": state}, count)

    w.family("nodepool_requests", "gauge", "Node requests by state.")
    req_states = Counter(r.state for r in requests)
    for state in sorted(REQUEST_STATES):
        w.sample("nodepool_requests", {"state": state}, req_states.get(state, 0))

    w.family("nodepool_launcher_ready", "gauge", "1 once the launcher finished starting.")
    w.sample("nodepool_launcher_ready", {}, 1 if ready else 0)

    if counters:
        seen: set[str] = set()
        for (name, pairs), value in sorted(counters.items()):
            if name not in seen:
                w.family(name, "counter", name.replace("_", " "))
                seen.add(name)
            w.sample(name, dict(pairs), value)
    return "\n".join(w.lines) + "\n"
