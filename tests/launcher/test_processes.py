"""Real `nodepool-launcher` processes on one ZooKeeper.

Aspects: two launcher processes serving one provider with a provider-wide max-servers never
exceed it together (a watcher samples every change), allocate no node twice and fulfil
every one of 200 requests; a launcher killed with SIGKILL mid-launch and restarted leaves
nothing behind that cleanup does not remove and loses no request; SIGTERM stops gracefully
(exit 0, components unregistered).
"""

from __future__ import annotations

import json
import signal
import threading

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import NodeCounter, Processes

pytestmark = pytest.mark.slow

CONFIG = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    max-servers: {max_servers}
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
            launch-delay: {delay}
"""


def pools(client: KazooClient) -> list[str]:
    return client.get_children(paths.POOL_COMPONENTS) \
        if client.exists(paths.POOL_COMPONENTS) else []


def test_two_processes_share_a_provider_limit(processes: Processes, zk: ZkConnection,
                                              kazoo_client: KazooClient) -> None:
    counter = NodeCounter(kazoo_client)
    body = CONFIG.format(max_servers=6, delay=0.05)
    first, second = processes.start(body), processes.start(body)
    wait_for(lambda: len(pools(kazoo_client)) == 2, 30, message="both launchers registered")
    results: dict[str, list[str]] = {}
    launchers_seen: set[str] = set()
    errors: list[BaseException] = []
    lock = threading.Lock()

    def builds(count: int) -> None:
        with ZuulClient(zk.hosts) as zuul:
            for _ in range(count):
                try:
                    request_id = zuul.submit(["small"])
                    body_ = zuul.wait(request_id, 120)
                    assert body_ is not None and body_["state"] == "fulfilled", body_
                    nodeset = zuul.accept(request_id)
                    zuul.use(nodeset)
                    with lock:
                        results[request_id] = [h.id for h in nodeset.nodes]
                        launchers_seen.update(str(h.data["launcher"]) for h in nodeset.nodes)
                    zuul.release(nodeset)
                except BaseException as exc:
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=builds, args=(20,)) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, f"{errors[0]!r}\n{processes.logs()}"
    assert len(results) == 200
    all_nodes = [n for nodes in results.values() for n in nodes]
    assert len(all_nodes) == len(set(all_nodes)) == 200, "a node was allocated twice"
    assert counter.max["fake"] <= 6, counter.max
    assert len(launchers_seen) == 2, "both launchers should have served requests"
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30, message="all cleaned")
    for proc in (first, second):
        proc.send_signal(signal.SIGTERM)
    assert first.wait(30) == 0 and second.wait(30) == 0
    assert pools(kazoo_client) == []


def test_sigkill_mid_launch_and_restart(processes: Processes, zk: ZkConnection,
                                        kazoo_client: KazooClient) -> None:
    body = CONFIG.format(max_servers=10, delay=3.0)
    victim = processes.start(body)
    wait_for(lambda: len(pools(kazoo_client)) == 1, 30, message="launcher registered")
    with ZuulClient(zk.hosts) as zuul:
        requests = [zuul.submit(["small"]) for _ in range(3)]
        wait_for(lambda: len(kazoo_client.get_children(paths.NODES)) == 3, 30,
                 message="three launches in progress")
        doomed = set(kazoo_client.get_children(paths.NODES))
        victim.kill()
        victim.wait(10)
        successor = processes.start(body)
        for request_id in requests:
            result = zuul.wait(request_id, 60)
            assert result is not None and result["state"] == "fulfilled", processes.logs()
            assert not set(result["nodes"]) & doomed
            nodeset = zuul.accept(request_id)
            zuul.use(nodeset)
            zuul.release(nodeset)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="every node of the killed launcher cleaned up")
    assert kazoo_client.get_children(paths.REQUESTS) == []
    successor.send_signal(signal.SIGTERM)
    assert successor.wait(30) == 0
    assert pools(kazoo_client) == []
    assert kazoo_client.get_children(paths.LAUNCHER_COMPONENTS) == []


def test_starts_with_ten_thousand_nodes(processes: Processes, zk: ZkConnection,
                                        kazoo_client: KazooClient) -> None:
    """The launcher starts and serves with 10,000 foreign nodes (each with a lock dir and a
    realistic, token-bearing record) in its caches. Its memory with that many nodes is
    measured by tools/benchmark (`scale`), not asserted here."""
    record = {"state": "in-use", "type": ["small"], "provider": "elsewhere", "pool": "main",
              "resources": {"instances": 1, "cores": 1, "ram": 512},
              "connection_type": "namespace", "external_id": "main-x",
              "connection_port": {"namespace": "main-x", "host": "https://k8s:6443",
                                  "skiptls": False, "token": "t" * 900, "ca_crt": "c" * 400,
                                  "user": "zuul-worker"},
              "allocated_to": "200-0000000001", "tenant_name": "tenant-1",
              "user_data": {"zuul_system": "z" * 32, "project_name": "org/project"}}
    data = json.dumps(record).encode()
    kazoo_client.ensure_path(paths.NODES)
    for batch in range(40):
        txn = kazoo_client.transaction()
        for index in range(batch * 250, (batch + 1) * 250):
            txn.create(paths.node_path(f"{index:010d}"), data)
            txn.create(paths.node_lock_path(f"{index:010d}"), b"")
        txn.commit()
    proc = processes.start(CONFIG.format(max_servers=10, delay=0.0))
    log = processes.tmp / "launcher-0.log"
    wait_for(lambda: b"Launcher running" in log.read_bytes(), 60, interval=0.1,
             message="launcher ready")
    with ZuulClient(zk.hosts) as zuul:
        request_id = zuul.submit(["small"])
        body = zuul.wait(request_id, 60)
        assert body is not None and body["state"] == "fulfilled"
        # The foreign nodes are another provider's: listed, never touched.
        assert len(kazoo_client.get_children(paths.NODES)) == 10_000 + 1
        zuul.cancel(request_id)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_frozen_launcher_loses_its_session_beside_another(
        processes: Processes, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """A launcher frozen (SIGSTOP) past its session timeout while it holds requests: the
    other launcher serves everything, nothing is allocated twice, and the frozen one, once
    thawed, notices the lost session with a WARNING, rejoins and stops cleanly."""
    body = CONFIG.format(max_servers=20, delay=1.0)
    frozen = processes.start(body)
    wait_for(lambda: len(pools(kazoo_client)) == 1, 30, message="first launcher registered")
    with ZuulClient(zk.hosts) as zuul:
        requests = [zuul.submit(["small"]) for _ in range(6)]
        wait_for(lambda: len(kazoo_client.get_children(paths.NODES)) >= 3, 30,
                 message="launches in progress on the first launcher")
        frozen.send_signal(signal.SIGSTOP)
        try:
            other = processes.start(body)
            # The session timeout is 2 s: the frozen launcher's registration vanishes.
            wait_for(lambda: len(pools(kazoo_client)) == 1
                     and len(kazoo_client.get_children(paths.LAUNCHER_COMPONENTS)) == 1,
                     60, message="the frozen launcher's session expired")
            results = [zuul.wait(request_id, 60) for request_id in requests]
        finally:
            frozen.send_signal(signal.SIGCONT)
        nodes: list[str] = []
        for request_id, result in zip(requests, results):
            assert result is not None and result["state"] == "fulfilled", processes.logs()
            nodes += result["nodes"]
        assert len(nodes) == len(set(nodes)) == 6  # nothing allocated twice
        for request_id in requests:
            nodeset = zuul.accept(request_id)
            zuul.use(nodeset)
            zuul.release(nodeset)
    log = processes.tmp / "launcher-0.log"
    wait_for(lambda: b"ZooKeeper session lost" in log.read_bytes(), 30,
             message="the thawed launcher noticed its lost session")
    wait_for(lambda: len(pools(kazoo_client)) == 2, 60, message="the thawed launcher rejoined")
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 60,
             message="every node deleted")
    for proc in (frozen, other):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]


K8S_CONFIG = """
labels:
  - name: ns
providers:
  - name: k8s
    driver: kubernetes
    context: nowhere
    pools:
      - name: main
        labels:
          - name: ns
            type: namespace
"""


def test_launcher_logs_the_open_acl_warning_at_start(processes: Processes) -> None:
    """config-validate's warnings are the launcher's too: tokens in world-readable records."""
    processes.start(K8S_CONFIG)
    wait_for(lambda: "zookeeper-acl: warning: off: node records of kubernetes providers"
             in processes.logs(), timeout=60, interval=0.1,
             message="the open-ACL warning in the log")
