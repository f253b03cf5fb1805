"""Which class implements a provider's `driver:` name: an explicit map, no directory scan.

Owns: turning a `ProviderConfig` into a `Provider`, and checking, when the launcher registers
a provider, the optional capabilities its class declares (`cluster_aware`, `api_metered`).
The Kubernetes driver is imported only when a configuration uses it, so the fake driver
(tests, demo, benchmark) never loads the `kubernetes` client. An unknown driver name raises
`ConfigError` (the schema should have caught it first); a driver class that declares a
capability it does not implement, or implements `ClusterAware`'s methods without declaring
it, raises `DriverContractError`.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable, cast

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver.base import ApiMetered, ClusterAware, Provider
from nodepool_k8s.core.errors import ConfigError, DriverContractError

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


# The methods of `ClusterAware`, read off the Protocol itself so the check follows it.
CLUSTER_AWARE_METHODS: tuple[str, ...] = tuple(sorted(
    name for name, value in vars(ClusterAware).items()
    if not name.startswith("_") and inspect.isfunction(value)))


def cluster_aware(provider: Provider) -> ClusterAware | None:
    """`provider` as a `ClusterAware` when its class declares it, None when not.

    Checked once per provider, when the launcher registers it: a class that names
    `ClusterAware` among its bases must define every method of it (not inherit the
    Protocol's empty stubs), and a class that does not must define none of them; either
    mistake would otherwise go unnoticed until a pool never resumed after freed capacity or
    a rewritten kubeconfig was never read. Raises `DriverContractError`."""
    cls = type(provider)
    defined = [name for name in CLUSTER_AWARE_METHODS
               if callable(inspect.getattr_static(provider, name, None))
               and _owner(cls, name) is not ClusterAware]
    if ClusterAware in cls.__mro__:
        missing = sorted(set(CLUSTER_AWARE_METHODS) - set(defined))
        if missing:
            raise DriverContractError(
                f"provider {provider.name}: {cls.__qualname__} declares ClusterAware but"
                f" does not implement {', '.join(missing)}")
        return cast(ClusterAware, provider)
    if defined:
        raise DriverContractError(
            f"provider {provider.name}: {cls.__qualname__} defines {', '.join(defined)}"
            " without declaring ClusterAware (name it among the class's bases)")
    return None


def _owner(cls: type, name: str) -> type | None:
    """The class in `cls`'s MRO whose body defines `name`."""
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def api_metered(provider: Provider) -> ApiMetered | None:
    """`provider` as an `ApiMetered` when its class declares it (names it among its bases),
    None when not. Raises `DriverContractError` for a declaration without the method."""
    cls = type(provider)
    if ApiMetered not in cls.__mro__:
        return None
    if _owner(cls, "on_api_call") is ApiMetered:
        raise DriverContractError(f"provider {provider.name}: {cls.__qualname__} declares"
                                  " ApiMetered but does not implement on_api_call")
    return cast(ApiMetered, provider)
