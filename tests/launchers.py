"""In-process launchers for tests: config from YAML through the real loader, test-friendly
engine settings, and a factory that always stops what it started (the `launchers` fixture
in tests/conftest.py)."""

from __future__ import annotations

import textwrap
from typing import Any, Callable

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import Config
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from tests.helpers import ZkConnection

TEST_SETTINGS = EngineSettings(cleanup_interval=5.0, leak_sweep_interval=3600.0,
                               stale_init_age=5.0, delete_retry=0.2, quota_retry=0.2,
                               min_ready_backoff=0.5, stop_timeout=10.0,
                               empty_node_age=0.5)

BASIC = """
labels:
  - name: small
  - name: large
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
          - name: large
            type: pod
            cpu: 2
            memory: 1024
            launch-delay: 0.01
"""


def small_pool(max_servers: int) -> str:
    """Provider `fake`, pool `main` with `max-servers`, one namespace label `small`."""
    return f"""
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: {max_servers}
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
"""


def make_config(zk: ZkConnection, body: str = BASIC, timeout: float = 5.0) -> Config:
    text = zk.config_yaml() + f"zookeeper-timeout: {timeout}\n" + textwrap.dedent(body)
    return load_config_text(text)


class LauncherFactory:
    def __init__(self, zk: ZkConnection) -> None:
        self.zk = zk
        self.started: list[Launcher] = []

    def __call__(self, body: str = BASIC, *, clock: Clock = SYSTEM_CLOCK,
                 settings: EngineSettings = TEST_SETTINGS, stats: Stats | None = None,
                 start: bool = True, **kw: Any) -> Launcher:
        launcher = Launcher(make_config(self.zk, body), clock=clock, settings=settings,
                            stats=stats or Stats(RecordingBackend()), **kw)
        self.started.append(launcher)
        if start:
            assert launcher.start()
        return launcher

    def stop_all(self) -> None:
        for launcher in self.started:
            launcher.stop()


Factory = Callable[..., Launcher]
