"""min-ready: keep spare ready nodes per label, without duplicates across launchers.

Owns: creating min-ready requests (priority `900`, requestor `NodePool:min-ready`,
`reuse: false`, ephemeral, with every key Zuul's reader indexes) for labels this launcher
serves, and finishing the ones this session created: a fulfilled one has its nodes
de-allocated and is deleted in one transaction; a failed one (at capacity) is deleted and
the label backs off before trying again.

A pool that is paused or drained (by an operator or a maintenance window,
`maintenance.in_force`) asks for no spares: it would not serve the requests, and they would
sit queued through the maintenance. A label's global min-ready counts only the pools that
serve.

Pool-level min-ready (a pool label's `min-ready`): the same, per (label, pool), with
requests that name their pool (`model.MIN_READY_POOL`): only that pool serves them (every
other pool skips them, `plan.triage`), its decline fails them, and only spares in that pool
count. A pool's spares also count toward the label's global `min-ready`.

No duplicates with several launchers: every launcher decides under the min-ready guard
(see zk.quota_guard): read the guard version, count outstanding min-ready requests from an
authoritative child listing and spare nodes (`plan.min_ready_shortfall`), then create the
missing requests in the same transaction that bumps the guard. Two launchers deciding at
once conflict on the guard; the loser re-counts and sees the winner's requests. Nodepool
let every launcher create its own (over-provisioning).

Spares are nodes that can be handed out: a ready record of one of this launcher's
providers whose resource is not provably that node's (`allocation.handout_problem`: a
record somebody else wrote, naming kube-system, a namespace that does not exist, or
nothing) is no spare, or one such record would keep min-ready from building a real node
for ever. It is reported once and left alone (not deleted: not ours); proven spares are
remembered, so the check costs a look at the provider's namespace watch once per spare.
When the provider cannot tell now (API unreachable), the node counts, as before. Nor is a
node whose lock holds a contender that is not ephemeral a spare (`engine.stuck_nodes`,
found by the cleanup): nobody can ever lock it to hand it out.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Protocol

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import NodepoolError
from nodepool_k8s.launcher import maintenance, plan
from nodepool_k8s.config.model import Config
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.launcher.requests.allocation import handout_problem
from nodepool_k8s.launcher.settings import EngineSettings, next_backoff
from nodepool_k8s.launcher.worker import PASS_COALESCE, Worker
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import NodeCache, RequestCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.quota_guard import GuardedWrite, QuotaGuard, commit_guarded
from nodepool_k8s.zk.requests import RequestStore, min_ready_request
from nodepool_k8s.zk.txn import Txn


Target = tuple[str, tuple[str, str] | None]
"""(label, (provider, pool)) of a pool-level min-ready target; (label, None): global."""


class MinReadyDeps(Protocol):
    """What min-ready uses of the engine (`launcher.context.Engine` provides it).
    `unhandable` is written: the ready records it found that cannot be handed out, for
    the pool status."""

    unhandable: frozenset[str]

    @property
    def zk(self) -> ZkClient: ...

    @property
    def acting(self) -> bool: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def config(self) -> Config: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...

    @property
    def nodes(self) -> NodeStore: ...

    @property
    def requests(self) -> RequestStore: ...

    @property
    def node_cache(self) -> NodeCache: ...

    @property
    def request_cache(self) -> RequestCache: ...

    @property
    def guard(self) -> QuotaGuard: ...

    @property
    def stuck_nodes(self) -> frozenset[str]: ...

    @property
    def pool_states(self) -> maintenance.OperatorStates: ...


class MinReadyWorker(Worker):
    def __init__(self, engine: MinReadyDeps) -> None:
        super().__init__("MinReadyWorker", engine.clock, engine.stats.thread_crashed,
                         coalesce=PASS_COALESCE)
        self.engine = engine
        # target -> (until, monotonic; delay)
        self._backoff: dict[Target, tuple[float, float]] = {}
        self.created = 0
        # (node id, external id) of spares proven handable (their namespace is theirs).
        self._proven: set[tuple[str, str]] = set()

    def run_once(self) -> float | None:
        if not self.engine.acting:
            return None
        # The back-off is on monotonic time (a backward step of the wall clock held it for
        # as long); the new requests' timestamps are wall time.
        mono = self.clock.monotonic()
        self._finish_own(mono)
        wanted = self._wanted()
        if not wanted:
            return self._next_window_change()
        ready = {target: count for target, count in wanted.items()
                 if self._backoff.get(target, (-math.inf, 0.0))[0] <= mono}
        if ready and self._shortfall(ready, self.engine.request_cache.requests()):
            self._create(ready, self.clock.time())
        until = [u for target, (u, _) in self._backoff.items()
                 if target in wanted and u > mono]
        window = self._next_window_change()
        if window is not None:
            until.append(window)
        return min(until) if until else None

    def _next_window_change(self) -> float | None:
        """When a maintenance window next starts or ends (monotonic), to ask again then."""
        now = self.clock.time()
        changes = [change for provider in self.engine.config.providers.values()
                   for pool in provider.pools.values() if pool.maintenance
                   for change in [maintenance.next_change(pool, now)] if change is not None]
        return self.clock.monotonic() + max(0.0, min(changes) - now) if changes else None

    def _wanted(self) -> dict[Target, int]:
        config = self.engine.config
        now = self.clock.time()
        pools = [(provider.name, pool) for provider in config.providers.values()
                 for pool in provider.pools.values() if not pool.disabled
                 and maintenance.in_force(self.engine.pool_states, provider.name, pool,
                                          now) is None]
        served = {label for _, pool in pools for label in pool.labels}
        wanted: dict[Target, int] = {
            (name, None): label.min_ready for name, label in config.labels.items()
            if label.min_ready > 0 and name in served}
        for provider, pool in pools:
            for name, label_cfg in pool.labels.items():
                if label_cfg.min_ready > 0:
                    wanted[(name, (provider, pool.name))] = label_cfg.min_ready
        return wanted

    def _shortfall(self, wanted: dict[Target, int],
                   requests: list[NodeRequest]) -> dict[Target, int]:
        nodes = self._countable(self.engine.node_cache.nodes())
        short = {target: plan.min_ready_shortfall(target[0], count, nodes, requests,
                                                  pool=target[1])
                 for target, count in wanted.items()}
        return {target: n for target, n in short.items() if n > 0}

    def _countable(self, nodes: list[Node]) -> list[Node]:
        """`nodes` less the would-be spares of our providers that cannot be handed out."""
        providers = self.engine.providers
        stuck = self.engine.stuck_nodes
        out: list[Node] = []
        proven: set[tuple[str, str]] = set()
        unhandable: set[str] = set()
        for node in nodes:
            provider = providers.get(node.provider or "")
            if provider is None or not plan.counts_as_spare(node, node.label or ""):
                out.append(node)
                continue
            if node.id in stuck:  # locked for ever (the cleanup reported it)
                unhandable.add(node.id)
                continue
            key = (node.id, node.external_id or "")
            if key not in self._proven:
                try:
                    if handout_problem(provider, node) is not None:
                        unhandable.add(node.id)
                        continue
                except NodepoolError as exc:  # cannot tell now: count it, as before
                    self.log.debug("[node: %s] Ownership not known now: %s", node.id, exc)
                    out.append(node)
                    continue
            proven.add(key)
            out.append(node)
        self._proven = proven
        self.engine.unhandable = frozenset(unhandable)
        return out

    def _authoritative_requests(self) -> list[NodeRequest]:
        """Every existing min-ready request (cache data, plus a fetch of what it lacks)."""
        store, cache = self.engine.requests, self.engine.request_cache
        prefix = model.MIN_READY_PRIORITY + "-"
        cached: list[str] = []
        missing: list[str] = []
        for request_id in store.ids():
            if not request_id.startswith(prefix):
                continue
            (missing if cache.get(request_id) is None else cached).append(request_id)
        # Changes made under another's lock are left unread by the cache: read them now.
        cache.refresh(cached)
        found = [r for i in cached if (r := cache.get(i)) is not None]
        for path, item in self.engine.zk.get_many([paths.request_path(i) for i in missing]):
            if item is not None:
                request = request_codec.parse(paths.basename(path), item[0], item[1].version)
                if request is not None:
                    found.append(request)
        return found

    def _current_nodes(self, labels: set[str]) -> None:
        """Read the cached nodes of `labels` that lack changes (the node cache leaves a
        node's changes under another's lock unread). A spare built for another launcher's
        min-ready request turns ready under that launcher's lock: counted from its older
        `building` copy, while its request reads fulfilled, it would be no spare and no
        outstanding node either, and a second spare would be asked for. The requests were
        just read fresh, so the refresh also waits for node events queued before then."""
        cache = self.engine.node_cache
        cache.refresh([node.id for node in cache.nodes() if node.label in labels])

    def _create(self, wanted: dict[Target, int], now: float) -> None:
        def attempt() -> GuardedWrite[None] | None:
            versions = self.engine.guard.read([paths.MIN_READY_GUARD])
            requests = self._authoritative_requests()
            self._current_nodes({label for label, _ in wanted})
            short = self._shortfall(wanted, requests)
            if not short:
                return None
            txn = Txn()
            for (label, pool), count in sorted(short.items(), key=lambda i: repr(i[0])):
                target = f"{pool[0]}/{pool[1]}" if pool is not None else None
                for _ in range(count):
                    RequestStore.add_create(txn, min_ready_request(label, now, target),
                                            model.MIN_READY_PRIORITY, ephemeral=True)

            def committed(results: list[Any]) -> None:
                self.created += sum(short.values())
                self.log.info("Created min-ready requests: %s", {
                    (f"{label}@{pool[0]}/{pool[1]}" if pool else label): n
                    for (label, pool), n in short.items()})
            return GuardedWrite(versions, txn, committed)

        # CONTENDED (every attempt lost to another launcher): the next pass decides again.
        commit_guarded(self.engine.zk, self.engine.settings.guard_attempts, attempt)

    def _finish_own(self, now: float) -> None:
        """`now`: monotonic (a failed request starts its label's back-off)."""
        engine = self.engine
        session = engine.zk.session_id
        for request in engine.request_cache.requests():
            if not plan.is_min_ready(request) or request.state not in (
                    model.RequestState.FULFILLED, model.RequestState.FAILED):
                continue
            if engine.request_cache.owner(request.id) != session:
                continue
            found = engine.requests.get_with_stat(request.id)
            if found is None:
                continue
            fresh, stat = found
            txn = Txn()
            node_locks: list[HeldLock] = []
            try:
                if fresh.state == model.RequestState.FULFILLED:
                    for target in self._targets(fresh):
                        self._backoff.pop(target, None)
                    self._release_nodes(fresh, txn, node_locks)
                else:
                    self._back_off(fresh, now)
                engine.requests.delete_own_min_ready(txn, fresh, stat)
                txn.commit(engine.zk)
                for node_lock in node_locks:
                    node_lock.mark_released()
            except errors.TxnFailed as exc:
                self.log.info("Could not finish min-ready request %s yet: %s", fresh.id, exc)
                self.wake()
            finally:
                for node_lock in node_locks:
                    if not node_lock.released:
                        node_lock.release()

    def _release_nodes(self, request: NodeRequest, txn: Txn,
                       node_locks: list[HeldLock]) -> None:
        """Queue the writes that free the fulfilled min-ready request's nodes for anyone.

        Each node is locked first, like every node write: an operator's `nodepool delete`
        may hold it (an unlocked write made its own write fail with a version conflict).
        A node locked elsewhere is left allocated: once the request is gone, the cleanup
        worker de-allocates it under its lock."""
        for node_id in request.nodes:
            got = self.engine.nodes.lock_and_read(node_id)
            if got is None:
                continue
            node_lock, node = got
            node_locks.append(node_lock)
            if node.allocated_to == request.id:
                node.set(allocated_to=None)
                self.engine.nodes.add_store(txn, node, node_lock, release=True)
            else:
                node_lock.release_in(txn)

    @staticmethod
    def _targets(request: NodeRequest) -> list[Target]:
        target = plan.target_pool(request)
        pool: tuple[str, str] | None = None
        if target is not None:
            provider, _, name = target.partition("/")
            pool = (provider, name)
        return [(label, pool) for label in request.node_types]

    def _back_off(self, request: NodeRequest, now: float) -> None:
        settings = self.engine.settings
        for target in self._targets(request):
            _, last = self._backoff.get(target, (0.0, 0.0))
            delay = next_backoff(last, settings.min_ready_backoff,
                                 settings.min_ready_backoff_max)
            self._backoff[target] = (now + delay, delay)
            self.log.info("min-ready request for %s failed; next attempt in %.0fs",
                          target[0] if target[1] is None
                          else f"{target[0]} in pool {target[1][0]}/{target[1][1]}", delay)
