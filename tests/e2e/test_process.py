"""A real `nodepool-launcher` process with the Kubernetes driver, killed with SIGKILL in the
middle of its launches and started again.

Aspects: the successor resets the killed launcher's pending requests and fulfils every one
with new nodes; the killed launcher's `building` nodes are deleted with their namespaces (a
namespace created but not yet recorded on its node is caught by the leak sweeper); after the
builds nothing is left in ZooKeeper or in the cluster. Credentials come from $KUBECONFIG,
as in production.
"""

from __future__ import annotations

import signal
from typing import Callable

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import PROCESS_CONFIG, PROCESS_ENV, our_namespaces, wait_cluster_empty
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import Processes

pytestmark = pytest.mark.slow


def wait_logged(processes: Processes, predicate: Callable[[], object], timeout: float,
                message: str) -> None:
    """wait_for, with the launchers' log tails in the failure."""
    try:
        wait_for(predicate, timeout, message=message)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{processes.logs()}") from None


def building(kazoo_client: KazooClient, zuul: ZuulClient) -> set[str]:
    found: set[str] = set()
    if kazoo_client.exists(paths.NODES) is None:
        return found
    for node_id in kazoo_client.get_children(paths.NODES):
        node = zuul.get_node(node_id)
        if node and node["state"] == "building":
            found.add(node_id)
    return found


def test_sigkill_mid_launch_and_restart(processes: Processes, zk: ZkConnection,
                                        k8s_sim: Simulator,
                                        kazoo_client: KazooClient) -> None:
    k8s_sim.config.start_delay = 30.0  # pods stay ContainerCreating: launches in flight
    victim = processes.start(PROCESS_CONFIG, env=PROCESS_ENV)
    with ZuulClient(zk.hosts) as zuul:
        requests = [zuul.submit(["pod"]) for _ in range(3)]
        wait_logged(processes, lambda: len(building(kazoo_client, zuul)) == 3
                    and len(k8s_sim.list("pods")) == 3, 60,
                    "three launches waiting for their pods")
        doomed = building(kazoo_client, zuul)
        doomed_namespaces = set(our_namespaces(k8s_sim))
        assert len(doomed_namespaces) == 3
        victim.kill()
        assert victim.wait(10) == -signal.SIGKILL
        k8s_sim.config.start_delay = 0.0

        processes.start(PROCESS_CONFIG, env=PROCESS_ENV)
        for request_id in requests:
            result = zuul.wait(request_id, 60)
            assert result is not None and result["state"] == "fulfilled", processes.logs()
            assert not set(result["nodes"]) & doomed
            nodeset = zuul.accept(request_id)
            assert {h.data["external_id"] for h in nodeset.nodes}.isdisjoint(doomed_namespaces)
            zuul.use(nodeset)
            zuul.release(nodeset)
    wait_logged(processes, lambda: not kazoo_client.get_children(paths.NODES), 60,
                "every node cleaned up")
    wait_cluster_empty(k8s_sim, 30, processes.logs())
    assert kazoo_client.get_children(paths.REQUESTS) == []
