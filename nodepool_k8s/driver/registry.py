"""Which class implements a provider's `driver:` name: an explicit map, no directory scan.

Owns: turning a `ProviderConfig` into a `Provider`. The Kubernetes driver is imported only
when a configuration uses it, so the fake driver (tests, demo, benchmark) never loads the
`kubernetes` client. An unknown driver name raises `ConfigError` (the schema should have
caught it first).
"""

from __future__ import annotations

import importlib
from typing import Callable

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.core.errors import ConfigError

Factory = Callable[[ProviderConfig, Clock], Provider]


def _fake(config: ProviderConfig, clock: Clock) -> Provider:
    from nodepool_k8s.driver.fake import FakeProvider

    return FakeProvider(config, clock=clock)


def _kubernetes(config: ProviderConfig, clock: Clock) -> Provider:
    module = importlib.import_module("nodepool_k8s.driver.kubernetes.provider")
    cls = getattr(module, "KubernetesProvider")
    provider: Provider = cls(config, clock=clock)
    return provider


DRIVERS: dict[str, Factory] = {"fake": _fake, "kubernetes": _kubernetes}


def make_provider(config: ProviderConfig, clock: Clock = SYSTEM_CLOCK) -> Provider:
    try:
        factory = DRIVERS[config.driver]
    except KeyError:
        raise ConfigError(f"provider {config.name}: unknown driver {config.driver!r}") \
            from None
    return factory(config, clock)
