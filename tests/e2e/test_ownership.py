"""Ownership through the launcher: records naming namespaces that are not ours, and two
installations with the same provider name on one cluster.

Aspects: a `used` record whose external id is `kube-system`, a `deleting` record naming an
unrelated namespace and one naming another node's namespace never lead to a DELETE (the
simulator's call counters); the namespaces stay, each znode is removed with the reason
written first as `delete_refused`, one WARNING per node and
`nodepool.provider.k8s.delete_refused` counted. Two launchers (different ZooKeeper chroots,
so different installation ids; same provider name, colliding node ids) sweep leaks on the
same cluster for longer than `leak-grace` and never delete each other's namespaces.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Iterable

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.core.model import Node
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import LEAK_CONFIG, LEAK_GRACE, SWEEP_INTERVAL, admin_api
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory


def fulfilled(zuul: ZuulClient) -> tuple[str, str]:
    request_id = zuul.submit(["ns"])
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    return request_id, str(body["nodes"][0])


def record_stores(launcher: Launcher, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every node record the launcher writes (the znode itself is gone afterwards)."""
    written: list[dict[str, Any]] = []
    store = launcher.engine.nodes.store

    def recording(node: Node, held: HeldLock) -> None:
        store(node, held)
        written.append(dict(node.to_dict(), id=node.id))

    monkeypatch.setattr(launcher.engine.nodes, "store", recording)
    return written


def test_records_naming_namespaces_not_ours_are_dropped_without_a_delete(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    k8s_sim.config.enforce_rbac = True
    launcher = launchers(LEAK_CONFIG)
    written = record_stores(launcher, monkeypatch)
    keep_request, keep = fulfilled(zuul)
    request_id, tampered = fulfilled(zuul)
    admin_api(k8s_sim).create_namespace({"metadata": {"name": "team-x", "labels": {
        "nodepool_provider_name": "k8s", "nodepool_node_id": "0000000099"}}})
    before = {n["metadata"]["name"] for n in k8s_sim.list("namespaces")}
    k8s_sim.reset_counters()

    # 1. Zuul used a node whose record (corrupted) names kube-system, and returns it.
    nodeset = zuul.accept(request_id)
    nodeset.nodes[0].data["external_id"] = "kube-system"
    zuul.use(nodeset)
    zuul.release(nodeset)
    # 2. A `deleting` record naming an unrelated namespace, 3. one naming a live node's.
    created = []
    for external_id in ("team-x", f"main-{keep}"):
        body = {"state": "deleting", "provider": "k8s", "pool": "main", "type": ["ns"],
                "external_id": external_id, "state_time": time.time()}
        path = kazoo_client.create(f"{paths.NODES}/", json.dumps(body).encode(),
                                   sequence=True)
        created.append(paths.basename(path))
    refused = [tampered, *created]

    for node_id in refused:
        wait_for(lambda: kazoo_client.exists(paths.node_path(node_id)) is None, 30,
                 message=f"node {node_id}'s record to be removed")
    # The deleter reports a refusal (log line, counter) after the record is gone.
    wait_for(lambda: launcher.deleter.refused >= len(refused), 30,
             message="the deleter to report every refusal")
    # Not one DELETE reached the cluster; everything is still there.
    assert k8s_sim.counters.get("delete namespaces", 0) == 0, k8s_sim.counters
    assert {n["metadata"]["name"] for n in k8s_sim.list("namespaces")} == before
    assert zuul.get_node(keep)["state"] == "ready"  # type: ignore[index]
    # The reason was written onto each record before it went.
    reasons = {w["id"]: w.get("delete_refused") for w in written if w.get("delete_refused")}
    assert set(reasons) == set(refused)
    assert "nodepool_provider_name" in reasons[tampered]  # kube-system: no labels at all
    assert "nodepool_installation_id" in reasons[created[0]]
    assert "nodepool_node_id" in reasons[created[1]]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING
                and "Refusing to delete" in r.getMessage()]
    for name in ("kube-system", "team-x", f"main-{keep}"):
        assert len([r for r in warnings if f"Refusing to delete {name} " in r.getMessage()]) \
            == 1, name
    for node_id in refused:
        assert len([r for r in warnings if f"[node: {node_id}]" in r.getMessage()]) == 1
    keys = launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined]
    assert keys.count("nodepool.provider.k8s.delete_refused") == 3


def test_forged_ready_records_are_never_handed_out(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    """Ready, unallocated records of our provider and pool that somebody else wrote, naming
    kube-system, a namespace that does not exist, and a real node's namespace under another
    id: a request gets a fresh namespace of its own, the forged records stay as they are
    (not ours to delete), and each is reported once."""
    caplog.set_level(logging.INFO)
    launcher = launchers(LEAK_CONFIG)
    _, real = fulfilled(zuul)
    forged = forge_ready_records(kazoo_client, ["kube-system", "main-0000009999", f"main-{real}"])
    wait_for(lambda: all(launcher.engine.node_cache.get(n) is not None for n in forged),
             message="the forged records in the cache")
    for _ in range(2):
        _, node_id = fulfilled(zuul)
        node = zuul.get_node(node_id)
        assert node_id not in forged and node is not None
        assert node["connection_port"]["token"] != "forged"
        assert node["external_id"] == f"main-{node_id}"
    assert_forged_left_alone(zuul, forged, caplog, k8s_sim)


def forge_ready_records(kazoo_client: KazooClient,
                        external_ids: list[str | None]) -> dict[str, str | None]:
    """Ready, unallocated records of provider k8s, pool main, label ns written by somebody
    else, one per external id, each with a forged token and host; node id -> external id."""
    forged: dict[str, str | None] = {}
    for external_id in external_ids:
        body = {"state": "ready", "provider": "k8s", "pool": "main", "type": ["ns"],
                "external_id": external_id, "state_time": 0, "allocated_to": None,
                "connection_type": "namespace",
                "connection_port": {"namespace": external_id, "token": "forged",
                                    "host": "https://evil.example"}}
        path = kazoo_client.create(f"{paths.NODES}/", json.dumps(body).encode(),
                                   sequence=True, makepath=True)
        forged[paths.basename(path)] = external_id
    return forged


def assert_forged_left_alone(zuul: ZuulClient, forged: Iterable[str],
                             caplog: pytest.LogCaptureFixture, k8s_sim: Simulator) -> None:
    """Forged ready records stay as they are, unallocated, each reported once; the
    namespace they name (kube-system) is untouched."""
    for node_id in forged:
        record = zuul.get_node(node_id)
        assert record is not None and record["state"] == "ready" \
            and record.get("allocated_to") is None, record
        path = paths.node_path(node_id)
        assert sum(f"malformed node {path}: ready, but not handed out" in r.getMessage()
                   for r in caplog.records) == 1, node_id
    assert k8s_sim.get("namespaces", "kube-system") is not None


def sweep_after(launcher: Launcher, clock: ManualClock, seconds: float) -> None:
    """Move time on and return once the launcher finished a leak sweep at the new time."""
    clock.advance(seconds)
    due = clock.monotonic() + SWEEP_INTERVAL  # the sweep's schedule is monotonic
    launcher.cleanup.wake()
    wait_for(lambda: launcher.cleanup.leaks.next_due() >= due, message="a sweep")
    passes = launcher.cleanup.passes
    launcher.cleanup.wake()
    wait_for(lambda: launcher.cleanup.passes > passes, message="the sweeping pass to end")


def test_two_installations_never_sweep_each_other(
        launchers: LauncherFactory, zuul: ZuulClient, zk: ZkConnection, k8s_sim: Simulator,
        kazoo_client: KazooClient, tmp_path: Path) -> None:
    # A second installation: another chroot on the same ZooKeeper, same provider name.
    kazoo_client.ensure_path("/second")
    zk_b = ZkConnection(host=zk.host, port=zk.port, chroot=f"{zk.chroot}/second")
    launchers_b = LauncherFactory(zk_b)
    zuul_b = ZuulClient(zk_b.hosts)
    clock = ManualClock(start=time.time())
    settings = TEST_SETTINGS.replace(leak_sweep_interval=SWEEP_INTERVAL)
    try:
        a = launchers(LEAK_CONFIG, clock=clock, settings=settings)
        # Its launcher runs elsewhere: it pins its id in a state directory of its own.
        b = launchers_b(f"installation-id-file: {tmp_path / 'b' / 'installation-id'}\n"
                        + LEAK_CONFIG, clock=clock, settings=settings)
        assert a.config.installation_id != b.config.installation_id
        _, node_a = fulfilled(zuul)
        _, node_b = fulfilled(zuul_b)
        assert node_a == node_b  # each installation counts its node ids from zero
        ns_a = zuul.get_node(node_a)["external_id"]  # type: ignore[index]
        ns_b = zuul_b.get_node(node_b)["external_id"]  # type: ignore[index]
        # Same provider, same pool, same node id: only the installation label tells them
        # apart (the second got a fresh name as the first one's was taken).
        assert ns_a != ns_b and ns_b.startswith(f"main-{node_b}-r")
        k8s_sim.reset_counters()
        for seconds in (SWEEP_INTERVAL, SWEEP_INTERVAL, LEAK_GRACE, LEAK_GRACE):
            sweep_after(a, clock, seconds)
            sweep_after(b, clock, 0)
        assert k8s_sim.counters.get("delete namespaces", 0) == 0, k8s_sim.counters
        for name, installation in ((ns_a, a.config.installation_id),
                                   (ns_b, b.config.installation_id)):
            ns = k8s_sim.get("namespaces", name)
            assert ns is not None and ns["status"]["phase"] == "Active"
            assert ns["metadata"]["labels"]["nodepool_installation_id"] == installation
        assert a.cleanup.leaks.leaks_found == 0 and b.cleanup.leaks.leaks_found == 0
    finally:
        launchers_b.stop_all()
        zuul_b.close()


MIN_READY_CONFIG = LEAK_CONFIG.replace("  - name: ns\n", "  - name: ns\n    min-ready: 1\n", 1)


def test_forged_ready_records_are_no_min_ready_spares(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    """Ready records of our provider, pool and label that somebody else wrote (naming
    kube-system, a namespace that does not exist, none at all) counted as min-ready spares:
    min-ready never built a real one. They are no spares now; they stay as they are (not
    ours to delete) and each is reported once, and one real spare is built and kept."""
    caplog.set_level(logging.INFO)
    forged = forge_ready_records(kazoo_client, ["kube-system", "main-0000009999", None])
    launcher = launchers(MIN_READY_CONFIG)

    def real_spares() -> list[str]:
        found = []
        for node_id in kazoo_client.get_children(paths.NODES):
            node = zuul.get_node(node_id)
            if node_id not in forged and node is not None and node["state"] == "ready" \
                    and node["external_id"] == f"main-{node_id}":
                found.append(node_id)
        return found

    def settled() -> bool:
        return len(real_spares()) == 1 and not [
            r for r in kazoo_client.get_children(paths.REQUESTS) if r.startswith("900-")]

    wait_for(settled, 60, interval=0.05, message="one real min-ready spare")
    for _ in range(3):  # and min-ready, looking again, builds no other
        passes = launcher.min_ready.passes
        launcher.min_ready.wake()
        wait_for(lambda: launcher.min_ready.passes > passes, 30, message="a min-ready pass")
    assert settled(), real_spares()
    # The pool status counts spares as min-ready does (it counted the forged ones).
    wait_for(lambda: [r["targets"].get("ns") for r in
                      launcher.engine.pool_statuses.items().values()]
             == [{"wanted": 1, "spare": 1, "pool_level": 0}], 30,
             message="the pool status counting one spare")
    assert_forged_left_alone(zuul, forged, caplog, k8s_sim)
    # Zuul's request is served by the real spare.
    _, node_id = fulfilled(zuul)
    assert node_id not in forged
