"""The optional provider capability `ClusterAware`: a driver class declares it among its
bases, and registration (`driver.registry.cluster_aware`) accepts exactly what is declared
and implemented, and refuses a declaration without the methods or methods without the
declaration."""

from __future__ import annotations

from typing import Callable

import pytest

from nodepool_k8s.config.model import PoolConfig, ProviderConfig
from nodepool_k8s.core.errors import DriverContractError, PermanentError
from nodepool_k8s.core.pool_records import CapacityCondition, ConditionRecord
from nodepool_k8s.driver import registry
from nodepool_k8s.driver.base import ClusterAware, ProviderHealth
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider


def _config(driver: str = "fake") -> ProviderConfig:
    return ProviderConfig(name="p", driver=driver, pools={})


class _Aware(FakeProvider, ClusterAware):
    """A fake provider that declares and implements the capability."""

    def on_capacity_change(self, listener: Callable[[], None]) -> None:
        self.listener = listener

    def reload_credentials(self) -> bool:
        return True

    def capacity_condition(self, pool: PoolConfig) -> CapacityCondition | None:
        return None

    def credentials_condition(self) -> ConditionRecord | None:
        return None

    def api_health(self) -> ProviderHealth | None:
        return None


class _DeclaredOnly(FakeProvider, ClusterAware):
    """Declares the capability, implements only part of it."""

    def reload_credentials(self) -> bool:
        return True


class _Undeclared(FakeProvider):
    """Implements a capability method without declaring the capability."""

    def credentials_condition(self) -> ConditionRecord | None:
        return None


def test_the_capability_lists_its_five_methods() -> None:
    assert registry.CLUSTER_AWARE_METHODS == (
        "api_health", "capacity_condition", "credentials_condition", "on_capacity_change",
        "reload_credentials")


def test_the_kubernetes_provider_declares_the_capability() -> None:
    provider = KubernetesProvider(_config("kubernetes"))
    assert registry.cluster_aware(provider) is provider


def test_the_fake_provider_declares_nothing_beyond_the_provider() -> None:
    assert registry.cluster_aware(FakeProvider(_config())) is None


def test_a_declared_and_implemented_capability_is_accepted() -> None:
    provider = _Aware(_config())
    aware = registry.cluster_aware(provider)
    assert aware is provider
    aware.on_capacity_change(print)
    assert provider.listener is print


def test_a_declaration_without_every_method_is_refused() -> None:
    provider = _DeclaredOnly(_config())  # type: ignore[abstract]
    with pytest.raises(DriverContractError) as caught:
        registry.cluster_aware(provider)
    message = str(caught.value)
    assert "_DeclaredOnly declares ClusterAware" in message
    for name in ("capacity_condition", "credentials_condition", "on_capacity_change"):
        assert name in message
    assert "reload_credentials" not in message
    # Permanent: retrying the registration cannot help until the driver is fixed.
    assert isinstance(caught.value, PermanentError)


def test_methods_without_the_declaration_are_refused() -> None:
    with pytest.raises(DriverContractError, match="defines credentials_condition without"
                                                  " declaring ClusterAware"):
        registry.cluster_aware(_Undeclared(_config()))


def test_a_method_set_on_the_instance_counts_as_defined() -> None:
    # A test double patched at run time is held to the same rule.
    provider = FakeProvider(_config())
    provider.reload_credentials = lambda: True  # type: ignore[attr-defined]
    with pytest.raises(DriverContractError, match="reload_credentials"):
        registry.cluster_aware(provider)
