"""Configuration reloads as operator signals: a rejected reload is an event (kind
`reload-rejected`, with the error's first line) in the shared event log and a counter
(statsd `nodepool.launcher.config_reload_failures`, Prometheus
`nodepool_config_reload_failures_total`); an applied one counts in
`nodepool.launcher.config_reloads` / `nodepool_config_reloads_total`. Both Prometheus
counters exist at 0 from the start.

A `LauncherService` in process (fake driver, real ZooKeeper, no web app), reloading
through its own loop (`request_reload`, as SIGHUP does).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from nodepool_k8s.config.loader import load_config
from nodepool_k8s.launcher.service import LauncherService
from nodepool_k8s.runtime import stats as stats_names
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk import events as zk_events
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS
from tests.ops.conftest import config_text


def counter(service: LauncherService, name: str) -> float | None:
    return service.stats.counters().get((name, ()))


Running = tuple[LauncherService, Path, RecordingBackend]


@pytest.fixture
def running(tmp_path: Path, zk: ZkConnection) -> Iterator[Running]:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk))
    backend = RecordingBackend()
    service = LauncherService(str(path), None, load_config(str(path)), settings=TEST_SETTINGS,
                              stats=Stats(backend), webapp=False, poll_interval=0.05)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(service.run()))
    thread.start()
    try:
        wait_for(lambda: service.launcher.ready, 30, message="the launcher to serve")
        yield service, path, backend
    finally:
        service.request_stop()
        thread.join(60)
        assert not thread.is_alive()


def events_of(service: LauncherService, kind: str) -> list[dict[str, Any]]:
    return [e for e in zk_events.read_events(service.launcher.zk) if e.get("kind") == kind]


def test_a_rejected_reload_is_an_event_and_a_counter(running: Running) -> None:
    service, path, backend = running
    assert counter(service, stats_names.PROM_CONFIG_RELOAD_FAILURES) == 0
    assert counter(service, stats_names.PROM_CONFIG_RELOADS) == 0
    good = path.read_text()

    path.write_text(good.replace("driver: fake", "driver: no-such-driver"))
    service.request_reload()
    wait_for(lambda: service.failed_reloads == 1, 30, message="the reload to be rejected")
    (event,) = wait_for(lambda: events_of(service, zk_events.RELOAD_REJECTED), 30,
                        message="a reload-rejected event")
    assert event["message"].startswith("the new configuration is invalid: "), event
    assert "providers[0].driver: expected one of" in event["message"], event
    assert counter(service, stats_names.PROM_CONFIG_RELOAD_FAILURES) == 1
    assert ("incr", stats_names.CONFIG_RELOAD_FAILURES_KEY, 1) in backend.sent
    assert counter(service, stats_names.PROM_CONFIG_RELOADS) == 0

    path.write_text(good.replace("max-servers: 10", "max-servers: 9"))
    service.request_reload()
    wait_for(lambda: service.reloads == 1, 30, message="the reload to be applied")
    assert counter(service, stats_names.PROM_CONFIG_RELOADS) == 1
    assert ("incr", stats_names.CONFIG_RELOADS_KEY, 1) in backend.sent
    assert counter(service, stats_names.PROM_CONFIG_RELOAD_FAILURES) == 1
    assert len(events_of(service, zk_events.RELOAD_REJECTED)) == 1
