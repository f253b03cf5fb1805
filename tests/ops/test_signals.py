"""Signals, reloads and systemd notification on a real `nodepool-launcher` process.

Aspects: SIGTERM, SIGINT and SIGUSR1 in the middle of a launch exit 0, hand the request back,
remove the cancelled launch's node, release every lock and unregister every component
(launcher, pools, stats election); READY=1 and STOPPING=1 reach a real notify socket;
SIGHUP with a new valid file adds a label (served, and the pool component says so), with
RELOADING=1 then READY=1; SIGHUP with an invalid file logs the problems and keeps serving
the old configuration; a file change alone reloads; log lines carry the event, request and
node ids; SIGUSR2 dumps the threads' stacks; no READY=1 before ZooKeeper is reachable, and
SIGTERM still stops at once then; a broken configuration or logging file,
or a taken web port, stops the start with status 1 and a clear message.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.ops.conftest import (BASE, LAUNCHER, STOP_SIGNALS, LauncherProcesses,
                                NotifySocket, config_text)

pytestmark = pytest.mark.slow

WITH_LARGE = BASE.replace("""  - name: slow
providers:""", """  - name: slow
  - name: large
providers:""") + """          - name: large
            type: pod
            launch-delay: 0.01
"""


def children(client: KazooClient, path: str) -> list[str]:
    return client.get_children(path) if client.exists(path) else []


def pool_labels(client: KazooClient) -> list[list[str]]:
    out = []
    for name in children(client, paths.POOL_COMPONENTS):
        data, _ = client.get(f"{paths.POOL_COMPONENTS}/{name}")
        out.append(json.loads(data)["supported_labels"])
    return out


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=["SIGTERM", "SIGINT", "SIGUSR1"])
def test_stop_signal_mid_launch(signum: int, launcher_process: LauncherProcesses,
                                zuul: ZuulClient, kazoo_client: KazooClient,
                                notify_socket: NotifySocket) -> None:
    proc = launcher_process(env={"NOTIFY_SOCKET": notify_socket.path})
    ready = notify_socket.wait_field("READY", "1")
    assert ready[0].get("STATUS") == "Serving 1 pool(s)"
    wait_for(lambda: children(kazoo_client, paths.STATS_ELECTION), 10,
             message="stats election contender")
    request_id = zuul.submit(["slow"])
    wait_for(lambda: (zuul.get_request(request_id) or {}).get("state") == "pending", 15)
    wait_for(lambda: children(kazoo_client, paths.NODES), 15, message="node created")
    node_id = children(kazoo_client, paths.NODES)[0]
    wait_for(lambda: (zuul.get_node(node_id) or {}).get("external_id"), 15,
             message="launch in progress")

    proc.signal(signum)
    assert proc.wait(60) == 0, proc.log()[-4000:]

    log = proc.log()
    assert f"Received signal {int(signum)}: stopping gracefully" in log
    assert "Launcher stopped" in log
    notify_socket.wait_field("STOPPING", "1")
    # The request is handed back untouched for another launcher ...
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] == "requested"
    assert body["nodes"] == [] and body["declined_by"] == []
    assert children(kazoo_client, paths.request_lock_path(request_id)) == []
    # ... the cancelled launch left no node behind (its resource was removed by the driver) ...
    assert children(kazoo_client, paths.NODES) == []
    assert "Removed the node of a cancelled launch" in log
    # ... and nothing of this launcher stays registered.
    assert children(kazoo_client, paths.POOL_COMPONENTS) == []
    assert children(kazoo_client, paths.LAUNCHER_COMPONENTS) == []
    assert children(kazoo_client, paths.STATS_ELECTION) == []


def test_sighup_applies_a_new_label(launcher_process: LauncherProcesses, zuul: ZuulClient,
                                    kazoo_client: KazooClient, zk: ZkConnection,
                                    notify_socket: NotifySocket) -> None:
    proc = launcher_process(env={"NOTIFY_SOCKET": notify_socket.path})
    notify_socket.wait_field("READY", "1")
    assert pool_labels(kazoo_client) == [["slow", "small"]]

    launcher_process.write_config(config_text(zk, WITH_LARGE))
    proc.signal(signal.SIGHUP)
    proc.wait_log("Reloading the configuration (SIGHUP)")
    wait_for(lambda: pool_labels(kazoo_client) == [["large", "slow", "small"]], 15,
             message="pool component lists the new label")
    request_id, nodes = zuul.run_build(["large"])
    assert len(nodes) == 1
    # systemd saw the reload begin and end.
    reloading = notify_socket.wait_field("RELOADING", "1")
    assert "MONOTONIC_USEC" in reloading[0]
    notify_socket.wait_field("READY", "1", count=2)
    # The file poll does not reload the same change a second time.
    assert proc.log().count("Reloading the configuration") == 1
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0


def test_sighup_with_an_invalid_file_keeps_the_old_configuration(
        launcher_process: LauncherProcesses, zuul: ZuulClient, kazoo_client: KazooClient,
        zk: ZkConnection) -> None:
    proc = launcher_process()
    pools_before = children(kazoo_client, paths.POOL_COMPONENTS)
    broken = config_text(zk, BASE.replace("name: slow\n            type: namespace",
                                          "name: slow\n            type: vm"))
    launcher_process.write_config(broken)
    proc.signal(signal.SIGHUP)
    proc.wait_log("The new configuration is invalid; still running the previous one")
    log = proc.log()
    assert "type" in log.split("The new configuration is invalid")[1][:2000]
    assert proc.proc.poll() is None
    # Still serving, with the same pool registration.
    request_id, nodes = zuul.run_build(["small"])
    assert len(nodes) == 1
    assert children(kazoo_client, paths.POOL_COMPONENTS) == pools_before
    assert pool_labels(kazoo_client) == [["slow", "small"]]
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0


def test_a_changed_file_is_reloaded_without_a_signal(
        launcher_process: LauncherProcesses, zuul: ZuulClient, kazoo_client: KazooClient,
        zk: ZkConnection) -> None:
    proc = launcher_process()
    launcher_process.write_config(config_text(zk, WITH_LARGE))
    proc.wait_log("Reloading the configuration (the configuration file changed)")
    wait_for(lambda: pool_labels(kazoo_client) == [["large", "slow", "small"]], 15,
             message="pool component lists the new label")
    request_id, nodes = zuul.run_build(["large"])
    assert len(nodes) == 1
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0


def test_log_lines_carry_event_request_and_node(launcher_process: LauncherProcesses,
                                                zuul: ZuulClient) -> None:
    proc = launcher_process()
    request_id = zuul.submit(["small"], event_id="ev-1234")
    result = zuul.wait(request_id)
    assert result is not None and result["state"] == "fulfilled"
    node_id = result["nodes"][0]
    proc.wait_log(f"[e: ev-1234] [node_request: {request_id}] [node: {node_id}] Launching")
    assert f"[e: ev-1234] [node_request: {request_id}] Accepted request" in proc.log()
    # SIGUSR2: every thread's stack on stderr, and the launcher carries on.
    proc.signal(signal.SIGUSR2)
    proc.wait_log("(SIGUSR2):")
    assert "Thread StatsWorker" in proc.log() and "Thread MainThread" in proc.log()
    assert proc.proc.poll() is None
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0


# -- start-up failures (no ZooKeeper needed) ---------------------------------------------------

def run_launcher(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAUNCHER), *args], capture_output=True, text=True,
                          timeout=timeout)


def test_invalid_configuration_at_start(tmp_path: Path) -> None:
    config = tmp_path / "nodepool.yaml"
    config.write_text("zookeeper-servers:\n  - host: localhost\nlabels:\n  - name: a\n"
                      "providers:\n  - name: p\n    driver: nope\n")
    result = run_launcher("-c", str(config))
    assert result.returncode == 1
    assert "invalid configuration" in result.stderr and "driver" in result.stderr


def test_broken_logging_file_at_start(tmp_path: Path) -> None:
    config = tmp_path / "nodepool.yaml"
    config.write_text("zookeeper-servers:\n  - host: localhost\n")
    logging_file = tmp_path / "logging.yaml"
    logging_file.write_text("version: 1\nhandlers:\n  x:\n    class: no.such.Handler\n")
    result = run_launcher("-c", str(config), "-l", str(logging_file))
    assert result.returncode == 1
    assert "logging.yaml" in result.stderr and "invalid logging configuration" in result.stderr


def test_web_port_taken_at_start(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "nodepool.yaml"
        # Nothing listens on port 1: the launcher would retry ZooKeeper for ever.
        config.write_text("zookeeper-servers:\n  - host: 127.0.0.1\n    port: 1\n"
                          f"webapp:\n  port: {port}\n  listen_address: 127.0.0.1\n")
        result = run_launcher("-c", str(config))
    assert result.returncode == 1
    assert f"Cannot serve the web app on 127.0.0.1 port {port}" in result.stderr


def test_not_ready_until_connected(launcher_process: LauncherProcesses,
                                   notify_socket: NotifySocket) -> None:
    """Without ZooKeeper there is no READY=1, and SIGTERM still stops at once."""
    launcher_process.zk = ZkConnection(host="127.0.0.1", port=1, chroot="/nowhere")
    proc = launcher_process(env={"NOTIFY_SOCKET": notify_socket.path}, wait_ready=False)
    notify_socket.wait_field("STATUS", "Connecting to ZooKeeper")
    proc.signal(signal.SIGTERM)
    assert proc.wait(15) == 0, proc.log()
    notify_socket.wait_field("STOPPING", "1")
    assert not [f for f in notify_socket.fields() if "READY" in f]


def test_nodepool_style_foreground_and_pid_file(launcher_process: LauncherProcesses,
                                                tmp_path: Path) -> None:
    pid_path = tmp_path / "run" / "launcher.pid"
    pid_path.parent.mkdir()
    proc = launcher_process(args=("--no-webapp", "-f", "-p", str(pid_path)))
    assert pid_path.read_text() == f"{proc.pid}\n"
    second = launcher_process(args=("--no-webapp", "-f", "-p", str(pid_path)),
                              wait_ready=False)
    assert second.wait(60) == 1
    assert f"process {proc.pid} is running with this pid file" in second.log()
    assert pid_path.read_text() == f"{proc.pid}\n"  # the refused one left it alone
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log()[-4000:]
    assert not pid_path.exists()
