"""A request path without a daemon: the narrow dependencies of the handler, the allocator,
the batch, min-ready and the pool worker, built on a real ZooKeeper with no thread of
their own.

`Deps` satisfies `HandlerDeps`, `BatchDeps` and `MinReadyDeps` (`WorkerDeps` also
`PoolWorkerDeps`): the real stores, guard, event log and registry on a started
`ZkClient`, a ManualClock, and caches that read ZooKeeper on every call (`ReadThrough*`),
so what a step wrote is what the next step sees, with no watch to wait for.
`InlineLaunches` stands in for the launch thread pool: a launch runs when the test says
so, in the test's thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from nodepool_k8s.config.model import Config, PoolConfig, ProviderConfig
from nodepool_k8s.core import quota
from nodepool_k8s.core.model import NodeRequest, RequestState, Resources
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.launcher.plan import PoolInfo
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.launcher.requests.allocation import PoolRef
from nodepool_k8s.launcher.requests.batch import copy_request
from nodepool_k8s.launcher.requests.launch import LaunchOutcome
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.runtime.tracing import NOOP_TRACER, Tracer
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.pool_status import (POOL_BREAKERS, POOL_STATUS, decode_breakers,
                                         decode_pool_status)
from nodepool_k8s.zk.pool_state import PoolState, strongest
from nodepool_k8s.zk.quota_guard import Keep, QuotaGuard, usage_record
from nodepool_k8s.zk.registry import ComponentRegistry, pool_worker_id
from nodepool_k8s.zk.requests import RequestStore
from nodepool_k8s.core.model import Node

SETTINGS = EngineSettings(quota_retry=30.0, min_ready_backoff=10.0,
                          min_ready_backoff_max=60.0, reclaim_interval=60.0)


def pool_yaml(max_servers: int = 10, *, fail: bool = False, min_ready: int = 0,
              retries: int = 1, maintenance: str = "", max_concurrency: int = 0) -> str:
    """Provider `fake` (`max_concurrency`: launches at once, 0 unlimited), pool `main`
    (with `maintenance` windows: YAML list items indented for the pool), namespace labels
    `small` (with the options) and `other`, which launch at once."""
    return f"""
labels:
  - name: small
    min-ready: {min_ready}
  - name: other
providers:
  - name: fake
    driver: fake
    launch-retries: {retries}
    max-concurrency: {max_concurrency}
    pools:
      - name: main
        max-servers: {max_servers}{maintenance}
        labels:
          - name: small
            type: namespace
            launch-delay: 0
            fail: {"true" if fail else "false"}
          - name: other
            type: namespace
            launch-delay: 0
"""


class ReadThroughNodes:
    """The `NodeCache` calls the request path makes, answered from ZooKeeper itself."""

    def __init__(self, zk: ZkClient, store: NodeStore) -> None:
        self.zk = zk
        self.store = store

    def get(self, node_id: str) -> Node | None:
        return self.store.get(node_id)

    def nodes(self) -> list[Node]:
        return [n for n in (self.store.get(i) for i in self.store.ids()) if n is not None]

    def is_locked(self, node_id: str) -> bool:
        return bool(self.zk.get_children(paths.node_lock_path(node_id)))

    # What the upkeep workers ask on top (tests/launcher/upkeep/).
    def ids(self) -> list[str]:
        return [n.id for n in self.nodes()]

    def allocated_to(self, request_id: str) -> list[str]:
        return [n.id for n in self.nodes() if n.allocated_to == request_id]

    def held(self) -> dict[str, frozenset[str]]:
        found = ((i, self.zk.get_children(paths.node_lock_path(i)) or [])
                 for i in self.store.ids())
        return {node_id: frozenset(names) for node_id, names in found if names}

    def empty_ids(self) -> list[str]:
        return [i for i in self.store.ids() if self.store.is_empty(i)]

    def stale(self) -> set[str]:
        return set()  # every answer above is read fresh

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool:
        return True

    def is_stale(self, node_id: str) -> bool:
        return False

    def left_unread(self) -> dict[str, float]:
        return {}

    def malformed(self) -> dict[str, str]:
        return {i: "malformed" for i in self.store.ids()
                if not self.store.is_empty(i) and self.store.get(i) is None}

    def unusable(self, node_id: str) -> bool:
        return not self.store.is_empty(node_id) and self.store.get(node_id) is None \
            and self.zk.exists(paths.node_path(node_id)) is not None

    def evict(self, node_id: str) -> None:
        """Nothing is kept, so nothing is stale."""


class ReadThroughRequests:
    """The `RequestCache` calls the request path makes, answered from ZooKeeper itself."""

    def __init__(self, zk: ZkClient, store: RequestStore) -> None:
        self.zk = zk
        self.store = store

    def get(self, request_id: str) -> NodeRequest | None:
        return self.store.get(request_id)

    def requests(self) -> list[NodeRequest]:
        found = (self.store.get(i) for i in self.store.ids())
        return [r for r in found if r is not None]

    def owner(self, request_id: str) -> int | None:
        stat = self.zk.exists(paths.request_path(request_id))
        return stat.ephemeral_owner if stat is not None else None

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) \
            and self.zk.exists(paths.request_path(request_id)) is not None

    def ids(self) -> list[str]:
        return [r.id for r in self.requests()]

    def evict(self, request_id: str) -> None:
        """Nothing is kept, so nothing is stale."""

    def is_locked(self, request_id: str) -> bool:
        """Locks are not followed (as a cache without persistent watches)."""
        return False

    def follows_locks(self) -> bool:
        return False

    def is_stale(self, request_id: str) -> bool:
        return False

    def held_elsewhere(self, request_id: str) -> bool:
        return False

    def is_closed(self, request_id: str) -> bool:
        """Nothing is kept, so nothing is taken as closed unread."""
        return False

    def closed(self) -> list[str]:
        return []

    def unread(self) -> list[str]:
        """Everything is read through: no request is left unread."""
        return []

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool:
        return True


class Deps:
    """The engine slice the request path uses (see the module docstring)."""

    def __init__(self, zk: ZkClient, config: Config, clock: ManualClock,
                 settings: EngineSettings = SETTINGS, tracer: Tracer = NOOP_TRACER) -> None:
        self.zk = zk
        self.config = config
        self.clock = clock
        self.settings = settings
        self.stats = Stats(RecordingBackend())
        self.tracer = tracer
        self.nodes = NodeStore(zk)
        self.requests = RequestStore(zk)
        self.node_cache = ReadThroughNodes(zk, self.nodes)
        self.request_cache = ReadThroughRequests(zk, self.requests)
        self.guard = QuotaGuard(zk, clock)
        self.events = EventLog(zk, clock)
        self.providers: dict[str, Provider] = {
            name: FakeProvider(cfg, clock) for name, cfg in config.providers.items()}
        self.stuck_nodes: frozenset[str] = frozenset()
        self.unhandable: frozenset[str] = frozenset()
        self.pool_states = SetPoolStates()
        self.acting = True
        self.ref = PoolRef(pool_worker_id("fake", "main", "test-host"), "fake", "main")
        # As in a running installation (Zuul creates them): the parents of nodes, requests
        # and request locks exist.
        for path in (paths.NODES, paths.REQUESTS, paths.REQUEST_LOCKS):
            zk.ensure_path(path)

    def provider_config(self, name: str | None) -> ProviderConfig | None:
        return self.config.provider_config(name)

    def pool_config(self, provider: str | None, pool: str | None) -> PoolConfig | None:
        return self.config.pool_config(provider, pool)

    def label_quota(self, node: quota.NodeUsage) -> Resources | None:
        return self.config.label_quota(node.provider, node.pool, node.label)

    def cached_usage(self, keep: Keep = None) -> list[quota.UsageRecord]:
        return [usage_record(n, self.label_quota) for n in self.node_cache.nodes()
                if keep is None or keep(n)]

    def usage(self, keep: Keep = None, ids: list[str] | None = None
              ) -> list[quota.UsageRecord]:
        return self.guard.usage(self.node_cache, self.label_quota,  # type: ignore[arg-type]
                                keep, ids)

    # -- for the tests --------------------------------------------------------------------
    @property
    def provider(self) -> FakeProvider:
        provider = self.providers["fake"]
        assert isinstance(provider, FakeProvider)
        return provider

    def submit(self, labels: list[str], *, reuse: bool = True, priority: str = "200",
               relative_priority: int = 0) -> str:
        """A request as Zuul creates it (`requested`)."""
        now = self.clock.time()
        request = NodeRequest(id="", state="requested", node_types=list(labels),
                              requestor="zuul-test", state_time=now, created_time=now,
                              reuse=reuse, relative_priority=relative_priority)
        path = self.zk.create(f"{paths.REQUESTS}/{priority}-", request_codec.encode(request),
                              sequence=True, makepath=True)
        return paths.basename(path)

    def accept(self, request_id: str) -> tuple[NodeRequest, HeldLock]:
        """Lock the request and write it `pending`, as a pool worker accepting it does."""
        cached = self.requests.get(request_id)
        assert cached is not None
        fresh = copy_request(cached)
        fresh.state, fresh.state_time = RequestState.PENDING, self.clock.time()
        lock = self.requests.store_fresh(fresh, release=False)
        assert lock is not None
        return fresh, lock


class InlineLaunches:
    """The launch pool's interface; launches run in the caller's thread on `run_all` (or
    the oldest on `run_oldest`). Each counts with `first` (launch first) from its
    submission until it returned, as `LaunchPool` does."""

    def __init__(self, first: LaunchFirst | None = None) -> None:
        self.queued: list[tuple[Callable[[], LaunchOutcome], Callable[[], None],
                                Future[LaunchOutcome]]] = []
        self.first = first

    @property
    def in_flight(self) -> int:
        return len(self.queued)

    def submit(self, fn: Callable[[], LaunchOutcome],
               done: Callable[[], None]) -> Future[LaunchOutcome]:
        future: Future[LaunchOutcome] = Future()
        self.queued.append((fn, done, future))
        if self.first is not None:
            self.first.launch_queued()
        return future

    def run_all(self) -> int:
        """Run every queued launch to its end; how many ran."""
        ran, self.queued = self.queued, []
        for fn, done, future in ran:
            self._run(fn, done, future)
        return len(ran)

    def run_oldest(self) -> None:
        """Run the launch queued first to its end."""
        self._run(*self.queued.pop(0))

    def _run(self, fn: Callable[[], LaunchOutcome], done: Callable[[], None],
             future: Future[LaunchOutcome]) -> None:
        future.set_result(fn())
        done()
        if self.first is not None:
            self.first.launch_returned()


class ReadThroughJson:
    """The `JsonDirCache` calls a pool worker's breaker makes, answered from ZooKeeper."""

    def __init__(self, zk: ZkClient, root: str,
                 decode: Callable[[str, bytes, Any], dict[str, Any]]) -> None:
        self.zk = zk
        self.root = root
        self.decode = decode

    def get(self, key: str) -> dict[str, Any] | None:
        got = self.zk.get(f"{self.root}/{key}")
        return self.decode(key, got[0], got[1]) if got is not None else None

    def items(self) -> dict[str, dict[str, Any]]:
        found = ((key, self.get(key)) for key in self.zk.get_children(self.root) or [])
        return {key: value for key, value in found if value is not None}


class NoComponents:
    """No other launcher's pool is registered (the pool worker counts itself)."""

    def pools(self) -> list[Any]:
        return []


class SetPoolStates:
    """The operator's pause and drain states, set by the test (none at first)."""

    def __init__(self) -> None:
        self.states: list[PoolState] = []

    def state_for(self, provider: str, pool: str) -> PoolState | None:
        return strongest(s for s in self.states if s.covers(provider, pool))


class WorkerDeps(Deps):
    """`Deps` and what a pool worker uses on top (`PoolWorkerDeps`): a real registry,
    nobody else registered; deletions asked for are recorded."""

    def __init__(self, zk: ZkClient, config: Config, clock: ManualClock,
                 settings: EngineSettings = SETTINGS) -> None:
        super().__init__(zk, config, clock, settings)
        self.stopping = threading.Event()
        self.registry = ComponentRegistry(zk, "test-host")
        self.components = NoComponents()
        self.cluster_aware: dict[str, Any] = {}  # the fake driver is not cluster-aware
        self.breakers = ReadThroughJson(zk, POOL_BREAKERS, decode_breakers)
        self.pool_statuses = ReadThroughJson(zk, POOL_STATUS, decode_pool_status)
        self.stuck_requests: frozenset[str] = frozenset()
        self.deletions: list[tuple[str, str]] = []

    def registered_pools(self) -> list[PoolInfo]:
        return []

    def request_delete(self, node_id: str, reason: str) -> bool:
        self.deletions.append((node_id, reason))
        return True
