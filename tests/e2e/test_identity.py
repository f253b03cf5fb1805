"""A ZooKeeper writer cannot re-target a launcher at another installation's namespaces.

Aspects: installation A's launcher ran once (its id pinned in its state directory); someone
rewrites A's `/nodepool_k8s/installation-id` to installation B's id (readable from B's
namespace labels). A restarted `nodepool-launcher` exits 1 with one line naming the znode
and both ids, and B's namespaces, one of them in use, labelled exactly like namespaces this
provider would sweep as leaks, stay: nothing in the simulated cluster is deleted.
"""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.zk.identity import INSTALLATION_ID_PATH
from tests.e2e.util import PROCESS_CONFIG, PROCESS_ENV, admin_api
from tests.launcher.util import Processes
from tests.launchers import LauncherFactory

pytestmark = pytest.mark.slow

OTHER = "installation-b"


def _other_namespace(sim: Simulator, node_id: str) -> str:
    name = f"main-{node_id}"
    admin_api(sim).create_namespace({"metadata": {"name": name, "labels": {
        "nodepool_provider_name": "k8s", "nodepool_installation_id": OTHER,
        "nodepool_node_id": node_id, "nodepool_pool_name": "main",
        "nodepool_node_label": "pod"}}})
    return name


def test_rewritten_installation_id_stops_the_launcher(
        launchers: LauncherFactory, processes: Processes, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    first = launchers(PROCESS_CONFIG)
    own = first.config.installation_id
    first.stop()
    others = [_other_namespace(k8s_sim, "0000000123"), _other_namespace(k8s_sim, "0000000124")]
    kazoo_client.set(INSTALLATION_ID_PATH, OTHER.encode())

    code = processes.exit_code(processes.start(PROCESS_CONFIG, env=PROCESS_ENV))
    logs = processes.logs()
    assert code == 1, logs
    line = next((x for x in logs.splitlines()
                 if x.startswith("nodepool-launcher: installation id: ")), None)
    assert line is not None, logs
    assert INSTALLATION_ID_PATH in line and repr(OTHER) in line and repr(own) in line, line
    assert "Traceback" not in logs
    for name in others:
        namespace = k8s_sim.get("namespaces", name)
        assert namespace is not None and namespace["status"]["phase"] == "Active", name
    assert k8s_sim.counters.get("delete namespaces", 0) == 0
