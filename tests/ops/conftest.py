"""Fixtures for the operator surface: real launcher processes and the sockets they report to.

`launcher_process` starts `nodepool-launcher` (the installed console script) on the fake
driver and the test's ZooKeeper chroot, with its output in a log file, and always kills it
at the end. `notify_socket` is a real AF_UNIX datagram socket standing in for systemd's
`NOTIFY_SOCKET`; `statsd` a real UDP listener on 127.0.0.1 standing in for statsd. Both
collect on a background thread; tests wait for what they expect with deadlines.
`running_service` runs the launcher service (launcher and web app) in the test's process
instead, with the `Stats` the test gives it, and scrapes its `/metrics`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodepool_k8s.config.loader import load_config
from nodepool_k8s.launcher.service import LauncherService
from nodepool_k8s.runtime.stats import Stats
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS

LAUNCHER = Path(sys.executable).with_name("nodepool-launcher")

BASE = """
labels:
  - name: small
  - name: slow
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
          - name: slow
            type: namespace
            launch-delay: 60
"""


def config_text(zk: ZkConnection, body: str = BASE, webapp: str | None = None) -> str:
    text = zk.config_yaml() + "zookeeper-timeout: 5.0\n" + textwrap.dedent(body)
    if webapp:
        text += textwrap.dedent(webapp)
    return text


class LauncherProcess:
    """One `nodepool-launcher` subprocess with its config file and log."""

    def __init__(self, tmp: Path, config: Path, args: list[str], env: dict[str, str]) -> None:
        self.config = config
        self.log_path = tmp / "launcher.log"
        command = [str(LAUNCHER)] if LAUNCHER.exists() else [
            sys.executable, "-m", "nodepool_k8s.cmd.launcher"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(command + ["-c", str(config)] + args,
                                         env={**os.environ, **env}, stdout=log,
                                         stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout: float = 30.0, count: int = 1) -> None:
        wait_for(lambda: self.log().count(text) >= count or self.proc.poll() is not None,
                 timeout, interval=0.05, message=f"{text!r} in the launcher log")
        assert self.log().count(text) >= count, \
            f"launcher exited ({self.proc.returncode}) before logging {text!r}:\n{self.log()}"

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"launcher did not exit in {timeout}s:\n{self.log()[-4000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class LauncherProcesses:
    def __init__(self, zk: ZkConnection, tmp: Path) -> None:
        self.zk = zk
        self.tmp = tmp
        self.started: list[LauncherProcess] = []

    def write_config(self, text: str, name: str = "nodepool.yaml") -> Path:
        path = self.tmp / name
        # Write and rename, as configuration management does: the reader never sees a torn
        # file, and the mtime changes.
        partial = path.with_suffix(".tmp")
        partial.write_text(text)
        os.replace(partial, path)
        return path

    def __call__(self, body: str = BASE, *, args: tuple[str, ...] = ("--no-webapp",),
                 env: dict[str, str] | None = None, webapp: str | None = None,
                 wait_ready: bool = True) -> LauncherProcess:
        config = self.write_config(config_text(self.zk, body, webapp))
        settings_env = {"NODEPOOL_K8S_CLEANUP_INTERVAL": "2", "NODEPOOL_K8S_STALE_INIT_AGE": "2",
                        "NODEPOOL_K8S_STOP_TIMEOUT": "10"}
        proc = LauncherProcess(self.tmp, config, list(args), {**settings_env, **(env or {})})
        self.started.append(proc)
        if wait_ready:
            proc.wait_log("Launcher running")
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()


@pytest.fixture
def launcher_process(zk: ZkConnection, tmp_path: Path) -> Iterator[LauncherProcesses]:
    procs = LauncherProcesses(zk, tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()


class Collector:
    """Datagrams received on a socket, read by a background thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.messages: list[str] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        # A blocked recv is not woken by close() from another thread: use a short timeout.
        sock.settimeout(0.1)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self.messages.append(data.decode())

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.messages)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self.sock.close()


class NotifySocket(Collector):
    """What systemd's notify socket would receive: one message per datagram."""

    def __init__(self, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        self.path = path
        super().__init__(sock)

    def fields(self) -> list[dict[str, str]]:
        return [dict(line.split("=", 1) for line in message.splitlines() if "=" in line)
                for message in self.snapshot()]

    def wait_field(self, key: str, value: str | None = None, count: int = 1,
                   timeout: float = 30.0) -> list[dict[str, str]]:
        def matching() -> list[dict[str, str]]:
            return [f for f in self.fields() if key in f and (value is None or f[key] == value)]
        wait_for(lambda: len(matching()) >= count, timeout,
                 message=f"{count} notification(s) with {key}={value}")
        return matching()


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    # A short directory: AF_UNIX paths are limited to 107 bytes, pytest's tmp_path is long.
    directory = tempfile.mkdtemp(prefix="np-notify-")
    sock = NotifySocket(os.path.join(directory, "notify"))
    try:
        yield sock
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)


class StatsdListener(Collector):
    """A statsd server's view: `key:value|type` lines (a datagram may hold several)."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        super().__init__(sock)

    @property
    def env(self) -> dict[str, str]:
        return {"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(self.port)}

    def lines(self) -> list[tuple[str, str, str]]:
        out = []
        for message in self.snapshot():
            for line in message.splitlines():
                key, _, rest = line.partition(":")
                value, _, kind = rest.partition("|")
                out.append((key, value, kind))
        return out

    def gauges(self) -> dict[str, float]:
        """The last value of every gauge (what a statsd server would hold)."""
        return {k: float(v) for k, v, t in self.lines() if t == "g"}

    def gauge_history(self, key: str) -> list[float]:
        return [float(v) for k, v, t in self.lines() if t == "g" and k == key]

    def counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for key, value, kind in self.lines():
            if kind == "c":
                totals[key] = totals.get(key, 0) + float(value)
        return totals

    def timers(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for key, value, kind in self.lines():
            if kind == "ms":
                out.setdefault(key, []).append(float(value))
        return out


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class ServiceUnderTest:
    """A `LauncherService` (launcher and web app) running in this process on its own thread,
    with its `Stats` given by the test (e.g. a real statsd client aimed at `StatsdListener`)."""

    def __init__(self, service: LauncherService, base_url: str) -> None:
        self.service = service
        self.base_url = base_url

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """`/metrics` as (sample name, labels, value); [] while it answers 503."""
        try:
            with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as answer:
                text = answer.read().decode()
        except OSError:
            return []
        return [(sample.name, dict(sample.labels), sample.value)
                for family in text_string_to_metric_families(text)
                for sample in family.samples]

    def scrape(self) -> dict[str, float]:
        """`/metrics` as {'name[(label, value), ...]': value}; {} while it answers 503."""
        return {f"{name}{sorted(labels.items())}": value
                for name, labels, value in self.samples()}


@contextlib.contextmanager
def running_service(config_path: Path, stats: Stats) -> Iterator[ServiceUnderTest]:
    """Run the launcher service of `config_path` (which must enable the web app on port 0)
    until the block ends; yields once `/metrics` says the launcher is ready."""
    service = LauncherService(str(config_path), None, load_config(str(config_path)),
                              settings=TEST_SETTINGS, stats=stats, poll_interval=0.1)
    status: list[int] = []
    thread = threading.Thread(target=lambda: status.append(service.run()))
    thread.start()
    try:
        webapp = wait_for(lambda: service.webapp, 30, message="web app started")
        running = ServiceUnderTest(service, f"http://127.0.0.1:{webapp.port}")
        wait_for(lambda: running.scrape().get("nodepool_launcher_ready[]") == 1, 30,
                 message="launcher ready")
        yield running
    finally:
        service.request_stop()
        thread.join(60)
        assert not thread.is_alive()
