"""The web app's view of a running launcher (a `webapp.StatusSource`).

Owns: answering the web app from what the launcher already keeps. Requests come from the
request cache, labels from the registered pool components (every launcher's, as Nodepool's
`/label-list` shows them), readiness from `Launcher.ready`, and the Prometheus counters,
histograms and gauges from the stats facade (launch results, leaked nodes, gauge reports,
request waits, Kubernetes API requests, the ZooKeeper connection's state).

Nodes: the node cache keeps slim records (no hostname, comment, hold job, user data), so the
full records are fetched in one batched read (multiRead): only those whose version in the
cache differs from the full record read last time (a steady installation of thousands of
nodes costs a few reads a second, not thousands), and the "locked" flag comes from the
cache's lock contenders. The result is kept for one second so `/node-list` and `/metrics`
scraped together cost one read.

Failure: before the caches have synced, or while ZooKeeper cannot be read, the node and
request views raise (the web app answers 503 with the reason); `/ready` and the counters
always answer.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Mapping, Protocol, Sequence

from nodepool_k8s.config import fingerprint
from nodepool_k8s.config.model import Config
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.core.records import MalformedRecord
from nodepool_k8s.runtime.stats import CounterKey, Histogram, Stats
from nodepool_k8s.views.listing import NodeView
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk.cache import Component
from nodepool_k8s.zk.client import ZkClient

NODE_VIEW_TTL = 1.0


class NodeIndex(Protocol):
    """The node ids and lock flags this source reads (`zk.cache.NodeCache`)."""

    @property
    def synced(self) -> bool: ...

    def ids(self) -> list[str]: ...

    def get(self, node_id: str) -> Node | None: ...

    def is_locked(self, node_id: str) -> bool: ...

    def malformed(self) -> dict[str, str]: ...

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool: ...


class RequestIndex(Protocol):
    """The requests this source reads (`zk.cache.RequestCache`)."""

    @property
    def synced(self) -> bool: ...

    def requests(self) -> list[NodeRequest]: ...

    def malformed(self) -> dict[str, str]: ...

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool: ...


class PoolIndex(Protocol):
    """The registered pool components (`zk.cache.ComponentCache`)."""

    def pools(self) -> Iterable[Component]: ...


class StatusIndex(Protocol):
    """Every pool's published status (`zk.pool_status.JsonDirCache`)."""

    @property
    def synced(self) -> bool: ...

    def items(self) -> Mapping[str, dict[str, Any]]: ...

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool: ...


class LauncherLike(Protocol):
    """What this source reads of `launcher.daemon.Launcher`."""

    @property
    def zk(self) -> ZkClient: ...

    @property
    def ready(self) -> bool: ...

    @property
    def node_cache(self) -> NodeIndex: ...

    @property
    def request_cache(self) -> RequestIndex: ...

    @property
    def component_cache(self) -> PoolIndex: ...

    @property
    def pool_status_cache(self) -> StatusIndex: ...


class LauncherStatus:
    def __init__(self, launcher: LauncherLike, stats: Stats, ttl: float = NODE_VIEW_TTL) -> None:
        self.launcher = launcher
        self.stats = stats
        self.ttl = ttl
        self._lock = threading.Lock()
        self._views: tuple[float, list[NodeView]] | None = None
        self._full: dict[str, Node] = {}  # the full records read last, by id
        self.full_reads = 0  # full node records read from ZooKeeper (for the tests)

    def _require_synced(self, synced: bool, what: str) -> None:
        if not synced:
            raise TemporaryError(f"the launcher has not read the {what} from ZooKeeper yet")

    def node_views(self) -> Sequence[NodeView]:
        with self._lock:
            now = time.monotonic()
            if self._views is not None and now - self._views[0] < self.ttl:
                return self._views[1]
            cache = self.launcher.node_cache
            self._require_synced(cache.synced, "nodes")
            # Entries whose changes the cache left unread are read now (a view asks).
            cache.refresh()
            ids = sorted(cache.ids())
            full: dict[str, Node] = {}
            changed: list[str] = []
            for node_id in ids:
                known, summary = self._full.get(node_id), cache.get(node_id)
                if known is not None and summary is not None and summary.version >= 0 \
                        and summary.version == known.version:
                    full[node_id] = known  # unchanged since it was read
                else:
                    changed.append(node_id)
            found_all = self.launcher.zk.get_many([paths.node_path(i) for i in changed])
            self.full_reads += len(changed)
            for node_id, (_, found) in zip(changed, found_all):
                if found is None or not found[0]:
                    continue  # deleted since the cache saw it, or no data
                node = node_codec.parse(node_id, found[0], found[1].version)
                if node is not None:
                    full[node_id] = node
            self._full = full
            views = [NodeView(full[i], cache.is_locked(i)) for i in ids if i in full]
            self._views = (now, views)
            return views

    def requests(self) -> Sequence[NodeRequest]:
        cache = self.launcher.request_cache
        self._require_synced(cache.synced, "requests")
        # Entries whose changes the cache left unread (made under another's lock) are
        # read now (a view asks).
        cache.refresh()
        return cache.requests()

    def malformed(self) -> Sequence[MalformedRecord]:
        """Node and request znodes the caches could not decode (shown, never acted on)."""
        out = [MalformedRecord("node", key, reason)
               for key, reason in self.launcher.node_cache.malformed().items()]
        out += [MalformedRecord("request", key, reason)
                for key, reason in self.launcher.request_cache.malformed().items()]
        return out

    def supported_labels(self) -> Sequence[Sequence[str]]:
        return [sorted(c.supported_labels) for c in self.launcher.component_cache.pools()]

    def pool_components(self) -> Sequence[Component]:
        """The registered pools (labels, paused), for why a request waits."""
        return list(self.launcher.component_cache.pools())

    def ready(self) -> bool:
        return self.launcher.ready

    def pool_statuses(self) -> Sequence[dict[str, Any]]:
        """Every running pool's published status (every launcher's; launcher.pool_status)."""
        cache = self.launcher.pool_status_cache
        self._require_synced(cache.synced, "pool status")
        # Other launchers' statuses whose changes the cache left unread (no statsd: the
        # engine's `_others_status`) are read now (a view asks).
        cache.refresh()
        return list(cache.items().values())

    def config_hashes(self) -> fingerprint.Hashes | None:
        """What a node built now would record, per (provider, pool) and label: the loaded
        configuration's, so `/node-list` and `/node/<id>` say which nodes drifted."""
        config = getattr(self.launcher, "config", None)
        return fingerprint.config_hashes(config) if isinstance(config, Config) else None

    def counters(self) -> dict[CounterKey, float]:
        return self.stats.counters()

    def histograms(self) -> dict[CounterKey, Histogram]:
        return self.stats.histograms()

    def gauges(self) -> dict[CounterKey, float]:
        return self.stats.gauge_values()

    def events(self) -> list[dict[str, Any]]:
        """The installation's event log (`/events`), oldest first."""
        return zk_events.read_events(self.launcher.zk)
