"""Fixtures for driver tests: a simulated cluster per test and providers connected to it.

The official client always talks HTTPS to the simulator (nodepool_k8s.dev.simulator); nothing
of the client is mocked. Providers get the kubeconfig path explicitly, so tests never
depend on the process environment.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import PoolLabel, ProviderConfig
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider, KubernetesSettings
from nodepool_k8s.driver.kubernetes.waiter import ObjectWatch
from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from tests.helpers import Signal
from tests.kubernetes.factories import make_provider

FAST = KubernetesSettings(unschedulable_grace=30.0, delete_timeout=10.0, cleanup_timeout=10.0,
                          watch_timeout=30, wait_tick=0.02)


def fast_config(**kw: Any) -> SimulatorConfig:
    kw.setdefault("tls", True)
    for key in ("schedule_delay", "start_delay", "token_delay", "namespace_delete_delay"):
        kw.setdefault(key, 0)
    return SimulatorConfig(**kw)


@pytest.fixture
def changes() -> Iterator[Signal]:
    """Told of every change the test's simulators (`sim`, `make_sim`) and providers
    (`make_k8s_provider`: their shared watches) report: objects, watches opened or ended,
    API calls, cache updates. The checks waited for read `sim.get`, `sim.counters` and the
    watches' caches, never the API: a check that called the API would wake itself."""
    signal = Signal()
    yield signal
    signal.close()


def watches_of(provider: KubernetesProvider) -> list[ObjectWatch]:
    """The provider's shared watches (pods, namespaces, capacity)."""
    watches = [provider._pods, provider._namespaces]
    if provider._capacity is not None:
        watches += provider._capacity.watches.values()
    return [w for w in watches if w is not None]


def watching(provider: KubernetesProvider) -> Signal:
    """A `Signal` told of every change of `provider`'s shared watches (close it when done),
    for a provider a test starts itself."""
    signal = Signal()
    for watch in watches_of(provider):
        signal.listen(watch)
    return signal


@pytest.fixture
def make_sim(changes: Signal) -> Iterator[Callable[..., Simulator]]:
    started: list[Simulator] = []

    def factory(**kw: Any) -> Simulator:
        sim = Simulator(fast_config(**kw)).start()
        started.append(sim)
        changes.listen(sim, calls=True)
        return sim

    yield factory
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(k8s_sim: Simulator, changes: Signal) -> Simulator:
    """The suite-wide simulator fixture (TLS, zero delays); `make_sim` for other settings."""
    changes.listen(k8s_sim, calls=True)
    return k8s_sim


ProviderFactory = Callable[..., KubernetesProvider]


@pytest.fixture
def make_k8s_provider(tmp_path: Any, changes: Signal) -> Iterator[ProviderFactory]:
    providers: list[KubernetesProvider] = []

    def factory(sim: Simulator, *labels: PoolLabel, clock: Clock = SYSTEM_CLOCK,
                settings: KubernetesSettings = FAST, config: ProviderConfig | None = None,
                kubeconfig: str | None = None, **provider_kw: Any) -> KubernetesProvider:
        if kubeconfig is None:
            kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-{len(providers)}",
                                              context="sim")
        config = config or make_provider(*labels, **provider_kw)
        provider = KubernetesProvider(config, clock=clock, kubeconfig=kubeconfig,
                                      settings=settings)
        providers.append(provider)
        provider.start()
        for watch in watches_of(provider):
            changes.listen(watch)
        changes.until(provider.watches_synced, message="the provider's watches to sync")
        return provider

    yield factory
    for provider in providers:
        provider.stop()


@pytest.fixture
def provider(sim: Simulator, make_k8s_provider: ProviderFactory) -> KubernetesProvider:
    return make_k8s_provider(sim)
