"""A graceful stop is prompt in every state, and hands in-flight work back.

Aspects: SIGTERM just after start (while joining elections), mid-burst (launches in
flight), with ZooKeeper gone, and with the Kubernetes API gone: the process exits 0 within
the stop deadline (`NODEPOOL_K8S_STOP_TIMEOUT`, 1.5 s, the default; the test waits longer only to
tolerate a loaded machine and reports the time), requests it held are back to `requested`
and unlocked. The measured stop times are printed (`-s`) for the record.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Iterator

import pytest

from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.ops.conftest import LauncherProcess, LauncherProcesses

pytestmark = pytest.mark.slow

STOP = {"NODEPOOL_K8S_STOP_TIMEOUT": "1.5"}
# Generous: a loaded 2-core CI machine; the code's own deadline is 1.5 s.
EXIT_DEADLINE = 20.0


def stop_and_time(proc: LauncherProcess) -> float:
    started = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.wait(EXIT_DEADLINE) == 0, proc.log()[-3000:]
    took = time.monotonic() - started
    print(f"stopped in {took:.2f}s")
    return took


def test_stop_right_after_start(launcher_process: LauncherProcesses) -> None:
    proc = launcher_process(env=STOP, wait_ready=False)
    proc.wait_log("Connected to ZooKeeper")
    stop_and_time(proc)
    assert "Launcher stopped" in proc.log()


def test_stop_mid_burst_hands_requests_back(launcher_process: LauncherProcesses,
                                            zuul: ZuulClient) -> None:
    proc = launcher_process(env=STOP)
    ids = [zuul.submit(["slow"]) for _ in range(8)]
    wait_for(lambda: sum((zuul.get_request(i) or {}).get("state") == "pending"
                         for i in ids) >= 4, 30, message="launches in flight")
    stop_and_time(proc)
    for request_id in ids:
        body = zuul.get_request(request_id)
        assert body is not None and body["state"] == "requested", body
        lock_dir = paths.request_lock_path(request_id)
        assert not (zuul.client.exists(lock_dir) and zuul.client.get_children(lock_dir))


@pytest.fixture
def own_zookeeper() -> Iterator[ZooKeeperServer]:
    """A ZooKeeper of this test's own: it is stopped in the middle of the test."""
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_stop_with_zookeeper_gone(own_zookeeper: ZooKeeperServer, tmp_path: Path) -> None:
    zk = ZkConnection(host="127.0.0.1", port=own_zookeeper.port, chroot="/stop-test")
    procs = LauncherProcesses(zk, tmp_path)
    try:
        proc = procs(env=STOP)
        own_zookeeper.stop()
        proc.wait_log("Connection dropped")
        stop_and_time(proc)
    finally:
        procs.kill_all()


KUBE = """
labels:
  - name: pod
providers:
  - name: kube
    driver: kubernetes
    context: sim
    pools:
      - name: main
        labels:
          - name: pod
            type: pod
            image: busybox
"""


def test_stop_with_the_api_gone(launcher_process: LauncherProcesses, zuul: ZuulClient,
                                tmp_path: Path) -> None:
    sim = Simulator(SimulatorConfig(tls=True, schedule_delay=0, start_delay=0,
                                    token_delay=0, namespace_delete_delay=0)).start()
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim")
    proc = launcher_process(KUBE, env={**STOP, "KUBECONFIG": str(kubeconfig)})
    sim.stop()  # every API call now fails to connect, and is retried
    request_id = zuul.submit(["pod"])
    wait_for(lambda: (zuul.get_request(request_id) or {}).get("state") == "pending", 30,
             message="the launch started against the vanished API")
    stop_and_time(proc)
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] == "requested"
