"""The leak sweep: cloud resources of our providers that no node accounts for.

Owns: comparing `provider.list_resources()` with the node records and deciding what is
leaked. A resource is leaked when its node does not exist (checked in ZooKeeper, not only
in the cache) or when the node names another resource and is past its launch. It is deleted
only after it was seen leaked on two sweeps and the first sighting (or the resource's own
creation time) is at least the provider's `leak-grace` ago, so a launch that has created its
namespace but not yet recorded the external id is never swept (Nodepool deleted on a single
sighting). A resource already being deleted (a Terminating namespace) is judged the same way,
so one that stays is finished like a node's. Deletions go through the deleter, which parks
them while the resource is going (no thread waits); `nodepool.provider.<p>.leaked.nodes`
counts them.

Time: sweeps and sightings are on monotonic time; a resource's creation time (the cloud's
clock) is judged by `clock.StampAges`, so a forward step of this launcher's wall clock does
not make a resource created a second ago look older than `leak-grace`, and a backward step
does not hold the sweep.

Failure: a provider that cannot be listed (TemporaryError) is skipped until the next sweep.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping, Protocol, Sequence

from nodepool_k8s.core import model
from nodepool_k8s.runtime.clock import Clock, StampAges
from nodepool_k8s.launcher import plan
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver.base import CloudResource, Provider
from nodepool_k8s.core.errors import NodepoolError, ProviderUnavailable
from nodepool_k8s.launcher.upkeep.deleter import NodeDeleter
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.nodes import NodeStore

log = logging.getLogger("nodepool_k8s.LeakSweeper")

IN_PROGRESS = frozenset({model.NodeState.INIT, model.NodeState.BUILDING})


class LeakDeps(Protocol):
    """What the leak sweep uses of the launcher's shared state (`context.Engine` is one)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...

    @property
    def node_cache(self) -> NodeCache: ...

    @property
    def nodes(self) -> NodeStore: ...

    def provider_config(self, name: str | None) -> ProviderConfig | None: ...


class LeakSweeper:
    def __init__(self, engine: LeakDeps, deleter: NodeDeleter) -> None:
        self.engine = engine
        self.deleter = deleter
        # (provider, external id) -> (first sighting, number of sweeps it was seen leaked)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}
        # The age of a leaked resource by its creation time (the cloud's clock).
        self._created = StampAges(engine.clock)
        self._next: dict[str, float] = {}  # provider -> its next sweep (monotonic)
        self.leaks_found = 0

    def next_due(self) -> float:
        return min(self._next.values(), default=math.inf)

    def sweep_due(self, now: float) -> None:
        """Sweep every provider whose sweep is due at `now` (monotonic)."""
        interval = self.engine.settings.leak_sweep_interval
        for name, provider in list(self.engine.providers.items()):
            if self._next.get(name, -math.inf) > now:
                continue
            self._next[name] = now + interval
            try:
                resources = provider.list_resources()
            except NodepoolError as exc:
                # Refused credentials: the driver reports those once, not per sweep.
                log.log(logging.INFO if isinstance(exc, ProviderUnavailable)
                        else logging.WARNING,
                        "Could not list resources of provider %s: %s", name, exc)
                continue
            self.sweep(name, resources, now)
        for name in [n for n in self._next if n not in self.engine.providers]:
            del self._next[name]

    def _is_leaked(self, resource: CloudResource) -> bool:
        # A resource already being deleted counts too: with no node to finish it, nothing
        # else would notice it staying (a namespace a job's finalizer holds Terminating).
        if resource.node_id is None:
            return True
        node: plan.NodeFacts | None = self.engine.node_cache.get(resource.node_id)
        if node is None:
            node = self.engine.nodes.get(resource.node_id)
        if node is None:
            return True
        if node.external_id == resource.external_id:
            return False
        # A launch may have created a new attempt's resource before recording it.
        return node.state not in IN_PROGRESS

    def sweep(self, provider_name: str, resources: Sequence[CloudResource],
              now: float) -> None:
        """One sweep of `resources`, listed at `now` (monotonic)."""
        provider_cfg = self.engine.provider_config(provider_name)
        grace = provider_cfg.leak_grace if provider_cfg else 60.0
        self.deleter.prune_leaks(provider_name, (r.external_id for r in resources))
        current: set[tuple[str, str]] = set()
        for resource in resources:
            if not self._is_leaked(resource):
                continue
            key = (provider_name, resource.external_id)
            current.add(key)
            first, sightings = self._seen.get(key, (now, 0))
            sightings += 1
            self._seen[key] = (first, sightings)
            created_long_ago = resource.created is not None \
                and self._created.age(key, resource.created) >= grace
            if sightings == 1:
                log.info("Resource %s of provider %s looks leaked (node %s); deleting it if "
                         "still leaked on a later sweep %.0fs from now", resource.external_id,
                         provider_name, resource.node_id, grace)
                continue
            if now - first >= grace or created_long_ago:
                if self.deleter.delete_leak(provider_name, resource.external_id):
                    self.leaks_found += 1
        for key in [k for k in self._seen if k[0] == provider_name and k not in current]:
            del self._seen[key]
            self._created.forget(key)
