"""A running launcher and the optional `ClusterAware` capability of its providers.

Aspects: a provider whose class declares the capability is registered as such: its
capacity-change notice is the launcher's wake-up, its Capacity and Credentials
conditions are what the pool status publishes (stepped: one pass of the pool worker
alone), and a configuration reload has it read its credentials again; a provider whose
class declares the capability without implementing it is refused when registered
(logged, nothing of it runs), while the launcher itself keeps serving.
"""

from __future__ import annotations

import logging
from typing import Callable

import pytest

from nodepool_k8s.config.model import PoolConfig, ProviderConfig
from nodepool_k8s.core.pool_records import CapacityCondition, ConditionRecord, PoolStatusRecord
from nodepool_k8s.driver.base import ClusterAware, ProviderHealth
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.runtime.clock import Clock, ManualClock
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection
from tests.launcher.requests.support import WorkerDeps
from tests.launcher.requests.test_pool_worker import worker_for
from tests.launchers import LauncherFactory, make_config, small_pool

REFUSED: ConditionRecord = {"status": "False", "reason": "Rejected",
                            "message": "the test refuses them"}
UNREACHABLE = ProviderHealth(False, "Unreachable", "the test's API server is down", 5.0)


class AwareProvider(FakeProvider, ClusterAware):
    """A fake cloud that reports fixed capacity and credentials conditions."""

    def __init__(self, config: ProviderConfig, clock: Clock) -> None:
        super().__init__(config, clock)
        self.listeners: list[Callable[[], None]] = []
        self.reloads = 0

    def on_capacity_change(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)

    def reload_credentials(self) -> bool:
        self.reloads += 1
        return True

    def capacity_condition(self, pool: PoolConfig) -> CapacityCondition | None:
        return {"status": "False", "reason": "NoneAvailable", "message": "the test is full",
                "labels": {name: {"available": False} for name in pool.labels}}

    def credentials_condition(self) -> ConditionRecord | None:
        return REFUSED

    def api_health(self) -> ProviderHealth | None:
        return UNREACHABLE


class IncompleteProvider(FakeProvider, ClusterAware):
    """Declares the capability but implements one method of five."""

    def reload_credentials(self) -> bool:
        return True


def status_of(zk: ZkConnection, zkc: ZkClient, aware: bool) -> PoolStatusRecord:
    """What one pass of the pool worker publishes for `small_pool(2)`, its provider an
    `AwareProvider` registered as cluster-aware if `aware` (a plain fake otherwise)."""
    deps = WorkerDeps(zkc, make_config(zk, small_pool(2)), ManualClock())
    if aware:
        provider = AwareProvider(deps.config.providers["fake"], deps.clock)
        deps.providers["fake"] = provider
        deps.cluster_aware["fake"] = provider
    worker, _ = worker_for(deps)
    worker.run_once()
    assert worker.published_status is not None
    return worker.published_status


def test_a_declared_capability_is_used_by_the_launcher(launchers: LauncherFactory) -> None:
    providers: list[AwareProvider] = []

    def factory(config: ProviderConfig, clock: Clock) -> AwareProvider:
        providers.append(AwareProvider(config, clock))
        return providers[-1]

    launcher = launchers(small_pool(2), provider_factory=factory)
    provider = providers[0]
    assert launcher.engine.cluster_aware == {"fake": provider}
    assert provider.listeners == [launcher.wake_all]
    launcher.refresh_credentials()  # a reload of an unchanged configuration
    assert provider.reloads == 1


def test_the_pool_status_shows_a_cluster_aware_providers_conditions(
        zk: ZkConnection, zkc: ZkClient) -> None:
    status = status_of(zk, zkc, aware=True)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Capacity"]["status"], conditions["Capacity"]["reason"]) \
        == ("False", "NoneAvailable")
    assert conditions["Credentials"]["reason"] == "Rejected"
    assert conditions["Credentials"]["message"] == REFUSED["message"]
    assert (conditions["ApiReachable"]["status"], conditions["ApiReachable"]["reason"],
            conditions["ApiReachable"]["message"]) \
        == ("False", "Unreachable", "the test's API server is down")
    assert status["capacity"] == {"labels": {"small": {"available": False}}}


def test_a_plain_provider_reports_neither_condition(launchers: LauncherFactory,
                                                    zk: ZkConnection, zkc: ZkClient) -> None:
    launcher = launchers(small_pool(2))
    assert launcher.engine.cluster_aware == {}
    status = status_of(zk, zkc, aware=False)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Capacity"]["status"] == conditions["Credentials"]["status"] \
        == conditions["ApiReachable"]["status"] == "Unknown"
    # Capacity awareness off is a setting, not a fault: neutral, reason Disabled.
    assert (conditions["Capacity"]["reason"], conditions["Capacity"]["neutral"]) \
        == ("Disabled", True)
    assert not conditions["Credentials"]["neutral"]


def test_an_incomplete_declaration_is_refused_at_registration(
        launchers: LauncherFactory, caplog: pytest.LogCaptureFixture) -> None:
    made: list[IncompleteProvider] = []

    def factory(config: ProviderConfig, clock: Clock) -> IncompleteProvider:
        made.append(IncompleteProvider(config, clock))  # type: ignore[abstract]
        return made[-1]

    with caplog.at_level(logging.ERROR):
        launcher = launchers(small_pool(2), provider_factory=factory)
    assert made and not made[0].started
    assert launcher.providers == {} and launcher.engine.cluster_aware == {}
    refused = [r.getMessage() for r in caplog.records if "declares ClusterAware" in
               r.getMessage()]
    assert refused and "on_capacity_change" in refused[0], refused
