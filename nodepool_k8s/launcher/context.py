"""The shared state of one launcher process, built by the daemon and handed to workers.

Owns: references to the ZooKeeper client, stores, caches, registry and quota guard, the
current configuration (swapped atomically on reload), the live providers, the clock, stats,
the tracer and engine settings, plus a few derived views every worker needs (registered
pools, quota fallbacks, usage). It holds no threads and makes no decisions; workers take
what they need from it instead of reaching into each other.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

from nodepool_k8s.core import quota
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.model import Config, PoolConfig, ProviderConfig
from nodepool_k8s.driver.base import ClusterAware, Provider
from nodepool_k8s.launcher.plan import PoolInfo
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.core.model import MIN_READY_PRIORITY, Node, Resources
from nodepool_k8s.runtime.stats import NullBackend, Stats
from nodepool_k8s.runtime.tracing import NOOP_TRACER, Tracer
from nodepool_k8s.zk.cache import ComponentCache, NodeCache, RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.pool_state import PoolStateCache
from nodepool_k8s.zk.pool_status import (POOL_BREAKERS, POOL_STATUS, JsonDirCache,
                                         decode_breakers, decode_pool_status)
from nodepool_k8s.zk.quota_guard import Keep, QuotaGuard
from nodepool_k8s.zk.registry import ComponentRegistry
from nodepool_k8s.zk.requests import RequestStore

# A launcher that let a first look end without taking the request gets no look for this
# many looks' time (`request_first_look` each): a busy launcher's share of new requests is
# then read by everyone at once, as without the look, instead of waiting a look each.
LOOK_BACKOFF = 4
# First looks tracked at most (a look whose request went away is never told over).
MAX_LOOKS_TRACKED = 4096


class Engine:
    def __init__(self, zk: ZkClient, config: Config, *, clock: Clock, stats: Stats,
                 settings: EngineSettings, hostname: str | None = None,
                 wake_all: Callable[[], None] = lambda: None,
                 request_delete: Callable[[str, str], bool] = lambda node_id, reason: False,
                 tracer: Tracer = NOOP_TRACER) -> None:
        self.zk = zk
        self._config = config
        self.clock = clock
        self.stats = stats
        self.settings = settings
        # The spans of each request (`runtime.tracing`): the no-op tracer unless enabled.
        self.tracer = tracer
        self.nodes = NodeStore(zk)
        self.requests = RequestStore(zk)
        self.node_cache = NodeCache(zk, clock.monotonic)
        self.node_cache.left_to_builder = self._left_to_builder
        self.request_cache = RequestCache(zk)
        self.request_cache.first_look = self._request_first_look
        self.request_cache.look_over = self._request_look_over
        # First looks under way: request -> the session whose turn it is; and the sessions
        # that let a look end without taking the request -> until when (monotonic) they
        # get none. Only on the request cache's thread.
        self._turn_of: dict[str, int] = {}
        self._busy_until: dict[int, float] = {}
        self.components = ComponentCache(zk)
        self.registry = ComponentRegistry(zk, hostname)
        self.guard = QuotaGuard(zk, clock, nodes=self.node_cache)
        # Operator pause/drain per provider or pool (see launcher.fleet).
        self.pool_states = PoolStateCache(zk)
        # The installation's lifecycle event log (`nodepool events`): best effort.
        self.events = EventLog(zk, clock)
        # Every pool's published status and circuit-breaker record (launcher.pool_status).
        self.pool_statuses = JsonDirCache(zk, POOL_STATUS, "pool-status-cache",
                                          decode_pool_status, skip_read=self._others_status)
        self.breakers = JsonDirCache(zk, POOL_BREAKERS, "breaker-cache",
                                     decode_breakers)
        self.providers: dict[str, Provider] = {}
        # The live providers that declare `ClusterAware`, checked when registered (the
        # daemon keeps this in step with `providers`).
        self.cluster_aware: dict[str, ClusterAware] = {}
        # Ids of ready records of our providers that cannot be handed out (not provably
        # theirs, or locked for ever): no spares. Min-ready's view of its last count; the
        # pool status uses it.
        self.unhandable: frozenset[str] = frozenset()
        # Node and request ids whose lock dir holds a contender that is not ephemeral (no
        # session will ever release it): the cleanup's full passes find them.
        self.stuck_nodes: frozenset[str] = frozenset()
        self.stuck_requests: frozenset[str] = frozenset()
        self.stopping = threading.Event()
        # Called when capacity may have freed or new work may exist (the daemon's).
        self.wake_all: Callable[[], None] = wake_all
        # Asks the deleter to remove a node (the daemon's, wired at construction).
        self.request_delete: Callable[[str, str], bool] = request_delete

    @property
    def config(self) -> Config:
        return self._config

    def _left_to_builder(self, node: Node) -> bool:
        """Whether the node cache may leave `node`'s changes unread (`node`: its last read
        record): another launcher, still registered, built it for a request. That builder
        does everything to the node: fulfils the request, de-allocates the node if the
        request goes before Zuul takes it, deletes it once Zuul releases it; this launcher
        counts its quota from fields that never change. So neither Zuul's use and release
        nor the builder's deletion is read here: the entry stays stale, and the znode's
        deletion removes it. What reads such an entry: the cleanup, once it has been left
        unread without a lock for `delete_grace` (the builder did not delete it: it acts as
        before on what it reads), on its full passes and when a launcher goes away;
        min-ready for the labels it counts; the tenant limits and views when they need it
        current. A spare the builder made of it is not handed out or reclaimed here until
        read (the builder does both). Not a node whose last record is unallocated (a
        spare: any launcher of the pool may hand it out), nor a min-ready request's (a
        spare every min-ready counts). Not with a zero delete grace: then every launcher
        deletes a used node at once."""
        if not node.allocated_to or not node.launcher or self.settings.delete_grace <= 0 \
                or node.allocated_to.startswith(MIN_READY_PRIORITY + "-"):
            return False  # a min-ready request's node is a spare every min-ready counts
        if node.launcher in self.registry.pool_ids():
            return False
        return any(c.id == node.launcher for c in self.components.pools())

    def _others_status(self, record: dict[str, Any], locked: bool) -> bool:
        """Whether the pool-status cache may leave a change of the status last read as
        `record` unread: another launcher's pool's, while no statsd is configured. Then
        nothing needs other launchers' statuses at each of their changes: the web app's
        views `refresh` them when they are built, the CLI reads ZooKeeper itself. With
        statsd each publish of a pool's status sends gauges combined with the other
        launchers' records of the pool (`pool_status.combined`), so they are read as they
        change."""
        return isinstance(self.stats.backend, NullBackend) \
            and record.get("id") not in self.registry.pool_ids()

    def _request_first_look(self, request_id: str) -> float:
        """Seconds the request cache leaves new request `request_id` unread for the
        launcher whose turn it is (zk/mirror.py, "First look"; `request_first_look`).

        Only where any launcher could serve any request: every registered pool serves the
        same labels (else the one whose turn it is might not serve it, and every request
        would wait). The launchers taking turns are those with a pool not paused (a paused
        one takes nothing new), ordered by session; the request's sequence number picks
        one. Every launcher works this out alike from the same registrations; where one
        sees them differently for a moment (a pool pausing), a request is read by two
        launchers, or waits out the look. Not min-ready requests (their creator must
        read them). Asked on the cache's thread: no ZooKeeper read."""
        delay = self.settings.request_first_look
        if delay <= 0 or request_id.startswith(MIN_READY_PRIORITY + "-"):
            return 0.0
        pools = self.components.pools()
        if len(pools) < 2 or len({p.supported_labels for p in pools}) != 1:
            return 0.0
        mine = self.registry.pool_ids()
        own = {p.owner for p in pools if p.id in mine}
        turns = sorted({p.owner for p in pools if not p.paused and p.owner})
        if len(own) != 1 or len(turns) < 2:
            return 0.0
        try:
            sequence = int(request_id.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            return 0.0
        turn = turns[sequence % len(turns)]
        if turn in own or self._busy_until.get(turn, -math.inf) > self.clock.monotonic():
            return 0.0
        if len(self._turn_of) >= MAX_LOOKS_TRACKED:
            self._turn_of.clear()  # looks whose end was never told (requests gone): forget
        self._turn_of[request_id] = turn
        return delay

    def _request_look_over(self, request_id: str, taken: bool) -> None:
        """A first look ended. Not taken: the launcher whose turn it was did not take the
        request in time (busy, at quota, stuck); it gets no look for `LOOK_BACKOFF` looks'
        time, so its share of the requests is not held back at every one."""
        turn = self._turn_of.pop(request_id, None)
        if turn is not None and not taken:
            self._busy_until[turn] = self.clock.monotonic() \
                + LOOK_BACKOFF * self.settings.request_first_look
            for session in [s for s, t in self._busy_until.items()
                            if t <= self.clock.monotonic()]:
                del self._busy_until[session]

    def set_config(self, config: Config) -> None:
        self._config = config

    @property
    def acting(self) -> bool:
        """Workers act only while connected and not shutting down."""
        return self.zk.connected and not self.stopping.is_set()

    def provider_config(self, name: str | None) -> ProviderConfig | None:
        return self._config.provider_config(name)

    def pool_config(self, provider: str | None, pool: str | None) -> PoolConfig | None:
        return self._config.pool_config(provider, pool)

    def label_quota(self, node: quota.NodeUsage) -> Resources | None:
        """The quota a node's label counts for, for nodes without `resources`."""
        return self._config.label_quota(node.provider, node.pool, node.label)

    def registered_pools(self) -> list[PoolInfo]:
        return [PoolInfo(id=c.id, provider=c.provider_name, labels=c.supported_labels,
                         priority=c.priority, paused=c.paused)
                for c in self.components.pools() if c.id]

    def cached_usage(self, keep: Keep = None) -> list[quota.UsageRecord]:
        """Usage from the cache, of the nodes `keep` accepts (all without it)."""
        memo, cache = self.guard.memo, self.node_cache
        return [memo.record(n.id, n, self.label_quota, cache) for n in cache.nodes()
                if keep is None or keep(n)]

    def usage(self, keep: Keep = None, ids: list[str] | None = None) -> list[quota.UsageRecord]:
        """Authoritative usage (see zk.quota_guard); call after reading guard versions
        (`ids`: the node listing read with them, `guard.read_listing`)."""
        return self.guard.usage(self.node_cache, self.label_quota, keep, ids)
