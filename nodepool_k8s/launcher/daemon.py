"""The composition root: builds one launcher process and runs it until stopped.

Owns the wiring and the lifecycle, nothing else: the ZooKeeper client, the caches, the
component registry, providers (from `driver.registry`), one launch pool per provider, one
`PoolWorker` per (provider, pool), the cleanup and min-ready workers, the deleter and the
statsd gauge reporter (`gauges.GaugeReporter`, stats leader election); cache
events wake the workers; session events stop and resume them; `reload(config)` adds,
replaces and removes providers and pools; `stop()` shuts down gracefully (stop taking work,
cancel launches, hand pending requests back, release locks, unregister, close the session).

What other components use: `ready` (True once serving), `reader` (a `ZkReader` for
read-only views), `node_cache` / `request_cache` / `component_cache`, `reload(config)`,
`refresh_credentials()` (a reload with an unchanged configuration), `wake_all()`, and
`engine` (shared state: config, providers, stats, clock, tracer). The tracer is made
from the configuration's `tracing` at construction (a reload does not change it) unless
one is given, and flushed last when stopping.

Failure modes: `start` blocks until ZooKeeper is reachable (retrying, logging every 10 s)
and returns False if `stop` was requested meanwhile; a provider that fails to start is
logged and retried in the background, its pools stay idle until then; a lost session stops
all activity and, on reconnect, registers the components again and re-syncs the caches.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from nodepool_k8s.core import model, records
from nodepool_k8s.runtime import threads, tracing
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import Config, ProviderConfig, with_installation_id
from nodepool_k8s.driver.base import ClusterAware, Provider
from nodepool_k8s.driver.registry import api_metered, cluster_aware, make_provider
from nodepool_k8s.core.errors import ConfigError, NodepoolError
from nodepool_k8s.launcher.upkeep.cleanup import CleanupWorker
from nodepool_k8s.launcher.context import Engine
from nodepool_k8s.launcher.upkeep.deleter import NodeDeleter
from nodepool_k8s.launcher.reporting.gauges import GaugeReporter
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.launcher.requests.launch import LaunchPool
from nodepool_k8s.launcher.requests.min_ready import MinReadyWorker
from nodepool_k8s.launcher.pool_worker import PoolWorker
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.core.model import Node
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk.cache import CacheEvent, ComponentCache, NodeCache, RequestCache
from nodepool_k8s.zk.client import ConnectionState, ZkClient, ZkSettings
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.identity import settle as settle_installation_id
from nodepool_k8s.zk.pool_status import JsonDirCache
from nodepool_k8s.zk.reader import ZkReader
from nodepool_k8s.zk.registry import Registration

log = logging.getLogger("nodepool_k8s.NodePool")

ProviderFactory = Callable[[ProviderConfig, Clock], Provider]
PoolKey = tuple[str, str]
CACHE_SYNC_TIMEOUT = 60.0
# How often a start-up wait looks at the stop request (only while starting).
START_WAIT_SLICE = 0.1
PROVIDER_RETRY = 30.0
# How long a reload waits for the providers reading their credentials again (on threads of
# their own, in parallel) before it goes on without them.
CREDENTIALS_RELOAD_WAIT = 5.0
# The part of the stop deadline spent handing work back; the rest closes the session.
HANDBACK_SHARE = 0.75


class Launcher:
    def __init__(self, config: Config, *, clock: Clock = SYSTEM_CLOCK,
                 stats: Stats | None = None, settings: EngineSettings | None = None,
                 provider_factory: ProviderFactory = make_provider,
                 hostname: str | None = None, fqdn: str | None = None,
                 tracer: tracing.Tracer | None = None) -> None:
        self.zk = ZkClient(ZkSettings.from_config(config))
        # Callbacks are wired here, at construction; they reach workers made below, and are
        # only called once start() runs.
        self.engine = Engine(self.zk, config, clock=clock, stats=stats or Stats(),
                             settings=settings or EngineSettings(),
                             hostname=hostname or socket.gethostname(),
                             wake_all=self.wake_all, request_delete=self._request_delete,
                             tracer=tracer if tracer is not None
                             else tracing.start(config.tracing))
        self.provider_factory = provider_factory
        self.fqdn = fqdn
        # Launch first: launches report to it, pool workers say when a request waits for
        # quota, housekeeping yields to launches while none does (see launcher.precedence).
        self.first = LaunchFirst(self._other_pool_waits)
        self.deleter = NodeDeleter(self.engine, self.engine.settings.delete_workers,
                                   on_done=self._deletion_done, first=self.first)
        self.cleanup = CleanupWorker(self.engine, self.deleter)
        self.min_ready = MinReadyWorker(self.engine)
        engine = self.engine
        self.gauges = GaugeReporter(self.zk, engine.stats, engine.node_cache,
                                    engine.request_cache, engine.components,
                                    identifier=f"{engine.registry.hostname}-{os.getpid()}")
        self.pool_workers: dict[PoolKey, PoolWorker] = {}
        self.launch_pools: dict[str, LaunchPool] = {}
        self._failed_providers: set[str] = set()
        self._registration: Registration | None = None
        self._registered_epoch = 0
        self._installation_id: str | None = None
        self._ready = threading.Event()
        self._components_changed = threading.Condition()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._retry_thread: threading.Thread | None = None
        self._reading_credentials: dict[str, threading.Thread] = {}

    # -- what other components use ---------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    @property
    def config(self) -> Config:
        return self.engine.config

    @property
    def reader(self) -> ZkReader:
        return ZkReader(self.zk)

    @property
    def node_cache(self) -> NodeCache:
        return self.engine.node_cache

    @property
    def request_cache(self) -> RequestCache:
        return self.engine.request_cache

    @property
    def component_cache(self) -> ComponentCache:
        return self.engine.components

    @property
    def pool_status_cache(self) -> JsonDirCache[dict[str, Any]]:
        return self.engine.pool_statuses

    @property
    def providers(self) -> dict[str, Provider]:
        return self.engine.providers

    def _on_malformed(self, kind: str, path: str) -> None:
        self.engine.stats.malformed(kind)

    def wake_all(self) -> None:
        for worker in list(self.pool_workers.values()):
            worker.wake()
        self.cleanup.wake()
        self.min_ready.wake()

    # -- start ----------------------------------------------------------------------------
    def start(self, stop: threading.Event | None = None) -> bool:
        """Connect and start every worker; False if `stop` was set before connecting."""
        if stop is not None:
            self._stop = stop
        if not self.zk.start(self._stop):
            return False
        engine = self.engine
        engine.set_config(self._with_installation_id(engine.config))
        self._registered_epoch = self.zk.epoch
        engine.stats.zk_connection(engine.registry.hostname, ConnectionState.CONNECTED.value,
                                   initial=True)
        self.zk.add_listener(self._report_session)
        self.zk.add_listener(self._on_session)
        records.REPORTS.add_listener(self._on_malformed)
        for cache in (engine.components, engine.node_cache, engine.request_cache,
                      engine.pool_states):
            cache.start()
        engine.breakers.start()
        engine.pool_statuses.start()
        for cache in (engine.components, engine.node_cache, engine.request_cache,
                      engine.pool_states):
            if not self._wait_unless_stopped(cache.wait_synced, CACHE_SYNC_TIMEOUT) \
                    and not self._stop.is_set():
                log.warning("%s did not finish its initial sync in %.0fs", cache.name,
                            CACHE_SYNC_TIMEOUT)
        self._registration = engine.registry.register_launcher("initializing")
        engine.node_cache.add_listener(self._on_node_event)
        engine.request_cache.add_listener(self._on_request_event)
        engine.components.add_listener(self._on_component_event)
        # A pause, drain or resume takes effect at once: every pool worker looks again.
        engine.pool_states.add_listener(lambda kind, key: self.wake_all())
        engine.breakers.add_listener(self._on_breaker_event)
        for cache in (engine.node_cache, engine.request_cache, engine.components):
            cache.add_listener(self.gauges.changed)
        self.gauges.start()
        self.gauges.report_config(engine.config)
        engine.events.start()
        with self._lock:
            for name, provider_cfg in engine.config.providers.items():
                self._start_provider(provider_cfg)
            for key in self._wanted_pools(engine.config):
                self._start_pool(key)
        self.cleanup.start()
        self.min_ready.start()
        engine.registry.update(self._registration, state="running")
        # Like Nodepool, consider ourselves ready once our own pools are visible in the
        # registry cache: decisions such as "every pool declined" rely on it.
        own = {w.id for w in self.pool_workers.values()}
        with self._components_changed:
            if not self._wait_unless_stopped(
                    lambda timeout: self._components_changed.wait_for(
                        lambda: own <= {c.id for c in engine.components.pools()}, timeout),
                    CACHE_SYNC_TIMEOUT) and not self._stop.is_set():
                log.warning("Own pool components not visible after %.0fs", CACHE_SYNC_TIMEOUT)
        self._ready.set()
        log.info("Launcher running with %d pool(s)", len(self.pool_workers))
        return True

    def _wait_unless_stopped(self, wait: Callable[[float], bool], timeout: float) -> bool:
        """`wait(timeout)`, cut short when a stop is requested meanwhile (a SIGTERM during
        the start must not wait for a slow initial sync): True once `wait` succeeded."""
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if wait(min(START_WAIT_SLICE, remaining)):
                return True
        return False

    @staticmethod
    def _wanted_pools(config: Config) -> list[PoolKey]:
        return [(p.name, pool) for p in config.providers.values() for pool in p.pools]

    def _start_provider(self, provider_cfg: ProviderConfig) -> bool:
        name = provider_cfg.name
        try:
            provider = self.provider_factory(provider_cfg, self.engine.clock)
            cluster = cluster_aware(provider)
            metered = api_metered(provider)
            if metered is not None:
                metered.on_api_call(self.engine.stats.api_call)
            if cluster is not None:
                # Freed capacity (or credentials accepted again) wakes the workers, so a
                # pool paused at the cloud's limit resumes without polling.
                cluster.on_capacity_change(self.wake_all)
            provider.start()
        except NodepoolError as exc:
            log.error("Provider %s failed to start (%s); retrying in the background", name,
                      exc)
            self._failed_providers.add(name)
            self._ensure_retry_thread()
            return False
        workers = provider_cfg.max_concurrency if provider_cfg.max_concurrency > 0 \
            else self.engine.settings.launch_workers
        old_pool = self.launch_pools.get(name)
        old_provider = self.engine.providers.get(name)
        self.launch_pools[name] = LaunchPool(name, workers, self.first)
        if cluster is None:
            self.engine.cluster_aware.pop(name, None)
        else:
            self.engine.cluster_aware[name] = cluster
        self.engine.providers[name] = provider
        self._failed_providers.discard(name)
        for (prov, _), worker in self.pool_workers.items():
            if prov == name:
                worker.launches = self.launch_pools[name]
        if old_provider is not None and old_pool is not None:
            self._retire(old_provider, old_pool)
        return True

    def _retire(self, provider: Provider, pool: LaunchPool) -> None:
        """Stop a replaced provider once the launches it is running have returned."""
        def run() -> None:
            pool.shutdown(wait=True)
            try:
                provider.stop()
            except Exception:
                log.exception("Error stopping replaced provider %s", provider.name)
        threads.start(f"retire-{provider.name}", run, on_crash=threads.Crash.END,
                      report=self.engine.stats.thread_crashed)

    def _ensure_retry_thread(self) -> None:
        if self._retry_thread is not None and self._retry_thread.is_alive():
            return

        def run() -> None:
            while not self._stop.wait(PROVIDER_RETRY) and self._failed_providers:
                with self._lock:
                    for name in sorted(self._failed_providers):
                        provider_cfg = self.engine.config.providers.get(name)
                        if provider_cfg is None:
                            self._failed_providers.discard(name)
                        elif self._start_provider(provider_cfg):
                            self.wake_all()
        # The guard restarts the loop after anything unexpected (a provider factory raising
        # something other than NodepoolError), logged and counted, instead of dying silently.
        self._retry_thread = threads.start("provider-retry", run,
                                           on_crash=threads.Crash.RESTART,
                                           report=self.engine.stats.thread_crashed,
                                           stopping=self._stop)

    def _start_pool(self, key: PoolKey) -> None:
        provider, pool = key
        launches = self.launch_pools.get(provider) or LaunchPool(
            provider, self.engine.settings.launch_workers, self.first)
        self.launch_pools.setdefault(provider, launches)
        worker = PoolWorker(self.engine, provider, pool, launches, fqdn=self.fqdn,
                            first=self.first)
        worker.register()
        self.pool_workers[key] = worker
        worker.start()

    def _stop_pool(self, key: PoolKey) -> None:
        worker = self.pool_workers.pop(key)
        worker.stop()
        worker.join(self.engine.settings.stop_timeout)
        worker.shutdown_handlers(self.engine.settings.stop_timeout)
        worker.unregister()

    # -- events ---------------------------------------------------------------------------
    def _on_node_event(self, kind: CacheEvent, node_id: str) -> None:
        self.cleanup.on_node_event(kind, node_id)
        # Every kind, LOCK too: the cache reports a node's data change and its unlock as
        # separate events, so a paused pool may have looked while a released node still
        # seemed locked (reuse, reclaim of the oldest idle node) and must look again.
        for worker in list(self.pool_workers.values()):
            worker.wake()
        self.min_ready.wake()

    def _on_request_event(self, kind: CacheEvent, request_id: str) -> None:
        self.cleanup.on_request_event(kind, request_id)
        if kind is CacheEvent.LOCK:
            # A request's lock changed: only a release can let a pool take it (the pool
            # pass leaves a locked one alone); min-ready counts no locks.
            if not self.engine.request_cache.is_locked(request_id):
                for worker in list(self.pool_workers.values()):
                    worker.wake()
            return
        for worker in list(self.pool_workers.values()):
            worker.wake()
        self.min_ready.wake()

    def _on_component_event(self, kind: CacheEvent, key: str) -> None:
        if kind is CacheEvent.REMOVED and self.engine.registry.owns(key) \
                and not self.engine.stopping.is_set():
            # Another client deleted one of our live registrations: without it, Zuul and
            # the other launchers believe our pool is gone (and may fail requests only it
            # serves) until the session ends. Not on the cache's thread: it writes.
            threads.start("reregister", lambda: self._restore_registration(key),
                          on_crash=threads.Crash.END, report=self.engine.stats.thread_crashed)
        with self._components_changed:
            self._components_changed.notify_all()
        self.cleanup.on_component_event(kind, key)
        for worker in list(self.pool_workers.values()):
            worker.wake()

    def _restore_registration(self, key: str) -> None:
        log.warning("Component %s/%s of this launcher was deleted by another client; "
                    "registering it again", paths.COMPONENTS, key)
        try:
            self.engine.registry.reregister_all()
        except NodepoolError as exc:
            log.warning("Could not re-register components yet: %s", exc)

    def _on_breaker_event(self, kind: CacheEvent, key: str) -> None:
        for worker in list(self.pool_workers.values()):
            worker.wake()

    def _report_session(self, state: ConnectionState, epoch: int) -> None:
        """The connection's state for statsd and /metrics (every event after the first
        connect: a CONNECTED one is a reconnect)."""
        self.engine.stats.zk_connection(self.engine.registry.hostname, state.value)

    def _on_session(self, state: ConnectionState, epoch: int) -> None:
        """Runs on the ZooKeeper state thread (may use ZooKeeper)."""
        if self.engine.stopping.is_set():
            return
        if state is ConnectionState.LOST:
            self.engine.registry.forget_paths()
            for worker in list(self.pool_workers.values()):
                worker.cancel_launches()
                worker.wake()
        elif state is ConnectionState.CONNECTED:
            if epoch != self._registered_epoch:
                try:
                    self.engine.registry.reregister_all()
                    self._registered_epoch = epoch
                except NodepoolError as exc:
                    log.warning("Could not re-register components yet: %s", exc)
                self.cleanup.request_full_pass()
            self.wake_all()

    def _other_pool_waits(self, provider: str) -> bool:
        """A registered pool of `provider` is paused (waits for quota or capacity, or an
        operator paused it): another launcher's, or ours as ZooKeeper shows it."""
        return any(p.paused and p.provider == provider
                   for p in self.engine.registered_pools())

    def _deletion_done(self) -> None:
        self.cleanup.wake()  # a deletion completed or failed: cleanup re-evaluates

    def _request_delete(self, node_id: str, reason: str) -> bool:
        return self.deleter.submit(node_id, reason, _ready_and_unallocated)

    def _with_installation_id(self, config: Config) -> Config:
        """`config` with the installation id in force: settled once, at the start, from the
        configuration or the local state file and checked against ZooKeeper (see
        `zk.identity`; `InstallationIdError` stops the start before anything runs). It
        never changes while the launcher runs: a reload that configures another id is
        refused (`ConfigError`)."""
        if self._installation_id is None:
            identity = settle_installation_id(
                self.zk, configured=config.installation_id if config.installation_id_explicit
                else None, derived=config.installation_id,
                state_file=config.installation_id_file, write=True)
            log.info("Installation id %s (%s)", identity.value, identity.source)
            self._installation_id = identity.value
        elif config.installation_id_explicit \
                and config.installation_id != self._installation_id:
            raise ConfigError(
                f"installation-id changed to {config.installation_id} while the launcher runs"
                f" with {self._installation_id}: not applied (the id marks which namespaces"
                " are this installation's); restart the launcher after recording the new id"
                " in ZooKeeper as well (see doc/operation.md)")
        return with_installation_id(config, self._installation_id)

    # -- reload ---------------------------------------------------------------------------
    def reload(self, config: Config) -> None:
        """Switch to `config`: providers and pools are added, replaced or removed."""
        config = self._with_installation_id(config)
        with self._lock:
            old = self.engine.config
            self.engine.set_config(config)
            wanted = set(self._wanted_pools(config))
            for key in [k for k in self.pool_workers if k not in wanted]:
                self._stop_pool(key)
            for name in [n for n in self.engine.providers if n not in config.providers]:
                provider = self.engine.providers.pop(name)
                self.engine.cluster_aware.pop(name, None)
                launches = self.launch_pools.pop(name, None)
                if launches is not None:
                    self._retire(provider, launches)
                else:
                    provider.stop()
            kept = []
            for name, provider_cfg in config.providers.items():
                if name not in self.engine.providers or old.providers.get(name) != provider_cfg:
                    self._start_provider(provider_cfg)
                else:
                    kept.append(name)
            for key in sorted(wanted - set(self.pool_workers)):
                self._start_pool(key)
        # Outside the lock: a provider's credential plugin must hold up neither the rest of
        # the reload nor a stop.
        self._refresh_credentials(kept)
        log.info("Configuration reloaded: %d pool(s)", len(self.pool_workers))
        self.engine.events.record(zk_events.CONFIG_RELOADED,
                                  message=f"{len(self.pool_workers)} pool(s)")
        self.gauges.report_config(config)
        self.wake_all()

    def refresh_credentials(self) -> None:
        """A reload whose configuration is unchanged: the providers read their credentials
        again (a rewritten kubeconfig is what operators reload for, too)."""
        with self._lock:
            names = list(self.engine.providers)
        self._refresh_credentials(names)
        self.wake_all()

    def _refresh_credentials(self, names: list[str]) -> None:
        """Have the running providers `names` read their credentials again (lock not held).

        An operator who rewrote a kubeconfig reloads and expects it used, not only after the
        next 401. A provider whose kubeconfig now names another server or trust does not
        switch in place (see driver/kubernetes/credentials.py): it is replaced, as for
        changed settings. Providers that are not `ClusterAware` (fake) are skipped.

        Reading credentials may run a provider's exec plugin (bounded by its
        `credentials-exec-timeout`). Each provider reads on a thread of its own, without
        the launcher's lock; the reload waits up to CREDENTIALS_RELOAD_WAIT for them, and
        a provider still reading then finishes in the background (its own launches wait
        for it, nobody else's). A provider still reading from an earlier reload is not
        asked again."""
        started: list[threading.Thread] = []
        with self._lock:
            for name in names:
                cluster = self.engine.cluster_aware.get(name)
                if cluster is None:
                    continue
                busy = self._reading_credentials.get(name)
                if busy is not None and busy.is_alive():
                    log.warning("Provider %s is still reading its credentials from an earlier"
                                " reload (its exec plugin?); not asking again", name)
                    continue
                thread = threads.start(
                    f"credentials-{name}",
                    functools.partial(self._read_credentials, name, cluster),
                    on_crash=threads.Crash.END, report=self.engine.stats.thread_crashed)
                self._reading_credentials[name] = thread
                started.append(thread)
        deadline = time.monotonic() + CREDENTIALS_RELOAD_WAIT
        for thread in started:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s: still reading credentials after %.0fs; the reload goes on"
                            " without waiting for it", thread.name, CREDENTIALS_RELOAD_WAIT)

    def _read_credentials(self, name: str, cluster: ClusterAware) -> None:
        try:
            keep = cluster.reload_credentials()
        except Exception:  # noqa: BLE001 - one provider must not stop the reload
            log.exception("Provider %s could not read its credentials again", name)
            return
        if keep:
            return
        with self._lock:
            provider_cfg = self.engine.config.providers.get(name)
            if self.engine.stopping.is_set() or provider_cfg is None \
                    or self.engine.cluster_aware.get(name) is not cluster:
                return  # stopping, or replaced or removed meanwhile
            log.info("Provider %s: replacing it to follow its kubeconfig", name)
            self._start_provider(provider_cfg)
        self.wake_all()

    # -- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Graceful stop within `stop_timeout` seconds overall. Idempotent.

        Hands requests back first (most of the time budget), then leaves the election,
        unregisters and closes the session. Every wait uses what is left of the one
        deadline, so no state (ZooKeeper or the API unreachable) makes it longer; the
        service ends the process when the deadline passes anyway (see LauncherService).
        """
        engine = self.engine
        if engine.stopping.is_set():
            return
        clock = engine.clock
        deadline = clock.monotonic() + engine.settings.stop_timeout * HANDBACK_SHARE

        def left() -> float:
            return max(0.0, deadline - clock.monotonic())
        log.info("Stopping launcher")
        self._ready.clear()
        engine.stopping.set()
        records.REPORTS.remove_listener(self._on_malformed)
        self._stop.set()
        with self._lock:
            workers = list(self.pool_workers.values())
            for worker in workers:
                worker.stop()
            for worker in workers:
                worker.join(left())
            connected = self.zk.connected
            for worker in workers:
                if connected:
                    worker.shutdown_handlers(left())
                else:
                    worker.drop_handlers("stopping without a ZooKeeper connection")
            self.cleanup.stop()
            self.min_ready.stop()
            self.cleanup.join(left())
            self.min_ready.join(left())
            # Leave the stats election while the session is open: another launcher takes
            # over at once instead of after our session times out.
            self.gauges.stop(left())
            engine.events.stop()
            self.deleter.shutdown(wait=False)
            for launches in self.launch_pools.values():
                launches.shutdown(wait=False)
            try:
                engine.registry.unregister_all()
            except NodepoolError as exc:
                log.debug("unregister failed: %s", exc)
            for cache in (engine.request_cache, engine.node_cache, engine.components,
                          engine.pool_states):
                cache.stop()
            engine.breakers.stop()
            engine.pool_statuses.stop()
            for provider in list(engine.providers.values()):
                try:
                    provider.stop()
                except Exception:
                    log.exception("Error stopping provider %s", provider.name)
            self.zk.stop()
            # Last: the spans of the requests handed back above are flushed too.
            engine.tracer.shutdown()
        log.info("Launcher stopped")


def _ready_and_unallocated(node: Node) -> bool:
    return node.state == model.NodeState.READY and not node.allocated_to
