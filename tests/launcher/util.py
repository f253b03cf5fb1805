"""Helpers for launcher tests: a watcher that samples node counts on every change."""

from __future__ import annotations

import json
import threading

from kazoo.client import KazooClient

from nodepool_k8s.zk import paths


class NodeCounter:
    """Samples, on every change of `/nodepool/nodes`, how many nodes each provider (and
    each label) has, and keeps the maxima: a limit that is ever exceeded shows up here."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.max: dict[str, int] = {}
        self.max_labels: dict[str, int] = {}
        self.max_total = 0
        self.samples = 0
        self._lock = threading.Lock()
        client.ensure_path(paths.NODES)
        client.ChildrenWatch(paths.NODES, self._changed)

    def _changed(self, children: list[str]) -> None:
        providers: dict[str, int] = {}
        labels: dict[str, int] = {}
        for child in children:
            try:
                body = json.loads(self.client.get(paths.node_path(child))[0])
            except Exception:
                continue
            providers[body.get("provider")] = providers.get(body.get("provider"), 0) + 1
            for label in body.get("type") or []:
                labels[label] = labels.get(label, 0) + 1
        with self._lock:
            self.samples += 1
            self.max_total = max(self.max_total, len(children))
            for key, count in providers.items():
                self.max[key] = max(self.max.get(key, 0), count)
            for key, count in labels.items():
                self.max_labels[key] = max(self.max_labels.get(key, 0), count)
