"""statsd gauges: the system-wide picture (from one stats leader) and each launcher's limits.

Owns: what Nodepool's gauges say and when they are sent.

* Global gauges, computed from this launcher's caches and sent only by the stats leader
  (kazoo Election at `/nodepool/elections/stats`, shared with Nodepool launchers, so a
  mixed deployment still reports once): `nodepool.nodes.<state>` (all eleven states,
  zero-initialised), `nodepool.provider.<p>.nodes.<state>`,
  `nodepool.label.<l>.nodes.<state>` (providers and labels of the registered pools,
  zero-initialised, plus any a node names) and
  `nodepool.provider.<p>.pool.<pool>.addressable_requests` (requests in any state whose
  labels that pool supports; one left unread to another launcher's first look counts for
  every pool). Sent when the node, request or component cache changes, at
  most once per `MIN_INTERVAL` (a burst of changes costs one report), and when a launcher
  becomes leader. A key that was reported before and has no subject any more (a provider
  removed from every launcher) is reported once more as 0, so it does not stay stale.
* Configuration gauges, sent by every launcher at start and after each reload:
  `nodepool.provider.<p>.max_servers` (what the provider may run at most: the sum of its
  pools' `max-servers`, capped by the provider's own `max-servers`; not sent when
  unlimited) and `nodepool.tenant_limits.<tenant>.<limit>` (each finite limit).

The functions computing the values are pure; `GaugeReporter` owns the thread and the
election. Failure: a report that fails is logged and retried on the next change; losing
the ZooKeeper session ends the leadership (`Term.held`) and this launcher contends again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from typing import Iterable, Protocol, Sequence

from nodepool_k8s.runtime import stats, threads
from nodepool_k8s.config.model import Config
from nodepool_k8s.core.model import NODE_STATES, NodeRequest
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import Component
from nodepool_k8s.zk.client import ConnectionState, ZkClient
from nodepool_k8s.zk.election import Election, Term

log = logging.getLogger("nodepool_k8s.StatsWorker")

# Nodepool reports at most once a second; so do we. This is a real-time rate limit on I/O,
# not an engine decision, so it uses time.monotonic rather than the injected clock (a test's
# manual clock would never let a second report through).
MIN_INTERVAL = 1.0
# How long the leader waits for a change before re-checking that it still leads.
TERM_CHECK = 5.0


class CountedNode(Protocol):
    """What a gauge needs of a node (a cached node record has it)."""

    @property
    def state(self) -> str: ...

    @property
    def provider(self) -> str | None: ...

    @property
    def type(self) -> Sequence[str]: ...


class NodeSource(Protocol):
    """The node records a gauge report counts (`zk.cache.NodeCache`)."""

    def nodes(self) -> Iterable[CountedNode]: ...

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool: ...


class RequestSource(Protocol):
    """The node requests a gauge report counts (`zk.cache.RequestCache`)."""

    def requests(self) -> Iterable[NodeRequest]: ...


class PoolSource(Protocol):
    """The registered pool components (`zk.cache.ComponentCache`)."""

    def pools(self) -> Iterable[Component]: ...


def global_gauges(nodes: Iterable[CountedNode], requests: Iterable[NodeRequest],
                  pools: Iterable[Component], unread: int = 0) -> dict[str, float]:
    """The leader's gauges, from the caches' contents. `unread`: requests the cache has
    not read (left to another launcher's first look, taken there: zk/mirror.py "First
    look"), counted as addressable by every pool (a first look is only taken where every
    pool serves the same labels)."""
    pools = list(pools)
    values: Counter[str] = Counter()
    providers = {p.provider_name for p in pools if p.provider_name}
    labels = set().union(*(p.supported_labels for p in pools)) if pools else set()
    for state in NODE_STATES:
        values[stats.nodes_key(state)] = 0
        for provider in providers:
            values[stats.provider_nodes_key(provider, state)] = 0
        for label in labels:
            values[stats.label_nodes_key(label, state)] = 0
    for node in nodes:
        values[stats.nodes_key(node.state)] += 1
        if node.provider:
            values[stats.provider_nodes_key(node.provider, node.state)] += 1
        for label in node.type:
            values[stats.label_nodes_key(label, node.state)] += 1
    # Several launchers may register the same provider and pool: one key, their labels.
    pool_labels: dict[tuple[str, str], set[str]] = {}
    for pool in pools:
        name = pool.data.get("name")
        if pool.provider_name and isinstance(name, str):
            pool_labels.setdefault((pool.provider_name, name), set()).update(
                pool.supported_labels)
    request_labels = [set(r.node_types) for r in requests]
    for (provider, pool_name), supported in pool_labels.items():
        values[stats.addressable_requests_key(provider, pool_name)] = unread + sum(
            1 for wanted in request_labels if wanted <= supported)
    return dict(values)


def config_gauges(config: Config) -> dict[str, float]:
    """This launcher's limits: provider capacity and tenant limits (may include inf)."""
    values: dict[str, float] = {}
    for provider in config.providers.values():
        pools = sum(max(0.0, p.max_servers) for p in provider.pools.values())
        values[stats.max_servers_key(provider.name)] = min(pools, provider.max_servers)
    for tenant in config.tenant_resource_limits.values():
        for key, limit in tenant.limits.items():
            values[stats.tenant_limit_key(tenant.tenant_name, key)] = limit
    return values


class GaugeReporter:
    """The `StatsWorker` thread: contends for the stats election and reports while leader."""

    def __init__(self, zk: ZkClient, stats_: Stats, nodes: NodeSource,
                 requests: RequestSource, components: PoolSource,
                 identifier: str | None = None, min_interval: float = MIN_INTERVAL) -> None:
        self.zk = zk
        self.stats = stats_
        self.nodes = nodes
        self.requests = requests
        self.components = components
        self.min_interval = min_interval
        self.election = Election(zk, paths.STATS_ELECTION, identifier)
        self.leading = False
        self.reports = 0
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._last_report = -math.inf
        self._last_keys: set[str] = set()
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.zk.add_listener(self._on_session)
        self._thread = threads.start(
            "StatsWorker", lambda: self.election.run(self._lead, self._stop),
            on_crash=threads.Crash.RESTART, report=self.stats.thread_crashed,
            stopping=self._stop)

    def stop(self, timeout: float | None = None) -> None:
        """Leave the election (before the session closes, so the next leader takes over at
        once instead of after our session times out)."""
        self._stop.set()
        self.election.cancel()
        self._changed.set()
        self.zk.remove_listener(self._on_session)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- events (called on cache and session threads: quick, no ZooKeeper) ------------------
    def changed(self, *_: object) -> None:
        self._changed.set()

    def _on_session(self, state: ConnectionState, epoch: int) -> None:
        # A lost session ends the term: wake the leader loop so it notices at once.
        self._changed.set()

    def report_config(self, config: Config) -> None:
        """Every launcher: its provider capacities and tenant limits (start, reload)."""
        sent = self.stats.gauges(config_gauges(config))
        log.debug("Reported %d configuration gauges", sent)

    # -- leadership -----------------------------------------------------------------------
    def _lead(self, term: Term) -> None:
        log.info("This launcher now reports the global gauges (stats leader)")
        self.leading = True
        self._changed.set()  # report at once: the previous leader may have been gone a while
        try:
            while not self._stop.is_set() and term.held:
                if not self._changed.wait(TERM_CHECK):
                    continue
                if self._stop.is_set() or not term.held:
                    break
                if not self.zk.connected:
                    # Suspended: the caches may be stale; report once they caught up (their
                    # reconnect events set `_changed` again).
                    self._changed.clear()
                    continue
                try:
                    delay = self.report_if_due(time.monotonic())
                except Exception:
                    log.exception("Reporting the global gauges failed")
                    continue
                if delay > 0:
                    self._stop.wait(delay)  # more changes coalesce into the next report
        finally:
            self.leading = False

    def report_if_due(self, now: float) -> float:
        """The leader's look after a change, at `now` (monotonic): report, unless the last
        report is less than `min_interval` old; the seconds still to wait (0 after a
        report). A report that raises is not retried before the next change."""
        delay = self._last_report + self.min_interval - now
        if delay > 0:
            return delay
        self._changed.clear()
        self._last_report = now
        self.report()
        return 0.0

    def report(self) -> None:
        # Node states by count: entries whose changes the cache left unread are read now.
        self.nodes.refresh()
        unread = getattr(self.requests, "unread", None)
        computed = global_gauges(self.nodes.nodes(), self.requests.requests(),
                                 self.components.pools(),
                                 len(unread()) if unread is not None else 0)
        values = dict(computed)
        for key in self._last_keys - computed.keys():
            values[key] = 0  # its provider, label or pool is gone: do not leave it stale
        self._last_keys = set(computed)
        self.stats.gauges(values)
        self.stats.count(stats.PROM_GAUGE_REPORTS)
        self.reports += 1
