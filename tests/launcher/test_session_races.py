"""A session expiry that lands in the middle of a pool worker's pass.

Aspects: a request the pass locks after the old session ended (its lock lives in the new
session) is served to the end: it is neither abandoned with its lock still held by the
live session (the request would stay `pending` until the orphaned-lock check released it
two full cleanup passes later) nor declined because its launch was cancelled as if it
belonged to the lost session; a pool registration the new session re-created before the
loss event arrived is not registered a second time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import Callable

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.model import PoolLabel, ProviderConfig
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.core.model import Resources
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ConnectionState
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory, make_config, small_pool
from tests.sessions import expire_session

# No full cleanup pass during the test: the orphaned-lock check must not be what rescues
# the request.
SETTINGS = dataclasses.replace(TEST_SETTINGS, cleanup_interval=3600.0)


class GatedProvider(FakeProvider):
    """Holds the pool worker inside its pass (at `cloud_limits`, which a pass asks before
    it walks the requests) once `hold_when()` is true, until `gate` is set."""

    def __init__(self, config: ProviderConfig, clock: Clock) -> None:
        super().__init__(config, clock)
        self.hold_when: Callable[[], bool] | None = None
        self.entered = threading.Event()
        self.gate = threading.Event()

    def cloud_limits(self, label: PoolLabel | None = None) -> Resources:
        hold = self.hold_when
        if hold is not None and threading.current_thread().name.startswith("PoolWorker") \
                and hold():
            self.hold_when = None
            self.entered.set()
            self.gate.wait(30)
        return super().cloud_limits(label)


def hold_loss_event(launcher: Launcher) -> tuple[threading.Event, threading.Event]:
    """Hold back the delivery of a session loss to the launcher's listeners (listeners run
    in the order they were added: this one, added before the launcher starts, runs ahead of
    the launcher's): the first event is set once the loss arrived, the second lets it on."""
    lost_held = threading.Event()
    deliver = threading.Event()

    def hold_loss(state: ConnectionState, epoch: int) -> None:
        if state is ConnectionState.LOST:
            lost_held.set()
            deliver.wait(30)

    launcher.zk.add_listener(hold_loss)
    return lost_held, deliver


def test_request_locked_in_the_new_session_mid_pass_is_served(
        launchers: LauncherFactory, zk: ZkConnection, zuul: ZuulClient) -> None:
    providers: list[GatedProvider] = []

    def factory(config: ProviderConfig, clock: Clock) -> GatedProvider:
        providers.append(GatedProvider(config, clock))
        return providers[-1]

    # A launch slower than the passes that follow it: the request is still launching when
    # the worker notices the new session.
    launcher = launchers(small_pool(5).replace("launch-delay: 0.01", "launch-delay: 3.0"),
                         settings=SETTINGS, provider_factory=factory)
    provider = providers[0]
    # The pass to hold is one that walks the request (in the cache already).
    provider.hold_when = lambda: bool(launcher.request_cache.requests())
    request_id = zuul.submit(["small"])
    assert provider.entered.wait(15), "the pool worker's pass did not start"
    epoch = launcher.zk.epoch
    expire_session(zk, launcher.zk)
    wait_for(lambda: launcher.zk.epoch > epoch and launcher.zk.connected, 30,
             message="a new session")
    wait_for(lambda: launcher.component_cache.pools(), 30, message="pool registered again")
    provider.gate.set()  # the pass goes on, in the new session
    wait_for(lambda: provider.launching, 15, message="the launch started")
    worker = next(iter(launcher.pool_workers.values()))
    passes = worker.passes
    launcher.wake_all()
    wait_for(lambda: worker.passes > passes, 15, message="the next pass")
    result = zuul.wait(request_id, 30)
    assert result is not None and result["state"] == "fulfilled", result


def test_launch_started_in_the_new_session_is_not_cancelled_by_the_late_loss_event(
        launchers: LauncherFactory, zk: ZkConnection, zuul: ZuulClient) -> None:
    """The session-lost event reaches the launcher's listeners on their own thread, after
    the connection already moved on: by then a launch of the new session may be running.
    Cancelling it would fail the request (this pool's only node launch failed)."""
    providers: list[GatedProvider] = []

    def factory(config: ProviderConfig, clock: Clock) -> GatedProvider:
        providers.append(GatedProvider(config, clock))
        return providers[-1]

    launcher = launchers(small_pool(5).replace("launch-delay: 0.01", "launch-delay: 1.0"),
                         settings=SETTINGS, provider_factory=factory, start=False)
    lost_held, deliver = hold_loss_event(launcher)
    assert launcher.start()
    provider = providers[0]
    # The pass to hold is one that walks the request (in the cache already).
    provider.hold_when = lambda: bool(launcher.request_cache.requests())
    request_id = zuul.submit(["small"])
    assert provider.entered.wait(15), "the pool worker's pass did not start"
    epoch = launcher.zk.epoch
    expire_session(zk, launcher.zk)
    assert lost_held.wait(30)
    wait_for(lambda: launcher.zk.epoch > epoch and launcher.zk.connected, 30,
             message="a new session")
    provider.gate.set()  # the pass goes on, in the new session, and launches
    wait_for(lambda: provider.launching, 15, message="the launch started")
    deliver.set()
    result = zuul.wait(request_id, 30)
    assert result is not None and result["state"] == "fulfilled", result


def test_registration_rewritten_before_the_late_loss_event_is_not_duplicated(
        launchers: LauncherFactory, zk: ZkConnection, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """A pool whose registration changes (here: its priority, by a reload) in the new
    session before the loss reaches the listeners re-creates its znode there; the late
    loss event must not make the re-registration create a second one (a stale copy with
    the old priority, labels and paused flag would stay for the whole session)."""
    caplog.set_level(logging.INFO, logger="nodepool_k8s.zk.registry")
    launcher = launchers(small_pool(5), settings=SETTINGS, start=False)
    lost_held, deliver = hold_loss_event(launcher)
    assert launcher.start()
    epoch = launcher.zk.epoch
    expire_session(zk, launcher.zk)
    assert lost_held.wait(30)
    wait_for(lambda: launcher.zk.epoch > epoch and launcher.zk.connected, 30,
             message="a new session")
    launcher.reload(make_config(zk, small_pool(5).replace(
        "      - name: main\n", "      - name: main\n        priority: 50\n")))

    def priorities() -> list[int]:
        found = []
        for child in kazoo_client.get_children(paths.POOL_COMPONENTS):
            data, _ = kazoo_client.get(f"{paths.POOL_COMPONENTS}/{child}")
            found.append(json.loads(data)["priority"])
        return found

    wait_for(lambda: priorities() == [50], 15, message="the pool registered again")
    deliver.set()
    wait_for(lambda: "Re-registered" in caplog.text, 15, message="the re-registration")
    assert priorities() == [50]
