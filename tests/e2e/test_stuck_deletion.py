"""A job cannot make its node outlive deletion, end to end: Zuul-like client → ZooKeeper →
launcher → official client → simulated cluster (finalizers and pod grace periods honoured).

Aspects: a ConfigMap with a finalizer that the job (its own token) leaves behind holds the
namespace Terminating only until `terminating-grace`: the node is reported stuck (condition,
event, metric), the finalizer is removed in that namespace only, and namespace and node go;
a clear-up that fails is logged once and retried until it works; a pod with a huge
termination grace period is deleted with at most `max-pod-grace`; a leaked namespace that
hangs Terminating does not hold a deleter thread (the only one), so other deletions go on.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.runtime.stats import PROM_DELETE_STUCK
from nodepool_k8s.dev.testing.zuul_client import NodeSet, ZuulClient
from nodepool_k8s.zk import events as zk_events
from tests.e2e.test_ownership import record_stores
from tests.e2e.util import admin_api, node_api, ns_config, remove_node
from tests.helpers import in_use, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory

FINALIZER = "example.com/never-removed"


def config(grace: float = 1) -> str:
    return ns_config("api-backoff: [0.01]", f"terminating-grace: {grace}", "max-pod-grace: 1",
                     "leak-grace: 0")


def held_config_map(name: str = "held") -> dict[str, Any]:
    return {"metadata": {"name": name, "finalizers": [FINALIZER]}}


def job_node(zuul: ZuulClient) -> tuple[str, NodeSet]:
    """A fulfilled ns node, accepted and in use: (node id, the node set)."""
    nodeset = in_use(zuul, ["ns"])
    return nodeset.nodes[0].id, nodeset


def foreign_stuck_namespace(sim: Simulator) -> dict[str, Any]:
    """A namespace nobody of ours owns, Terminating with the same finalizer'd object:
    the launcher must leave it alone. Returns the held object as settled."""
    admin = admin_api(sim)
    admin.create_namespace({"metadata": {"name": "team-y"}})
    admin.create_namespaced_config_map("team-y", held_config_map())
    admin.delete_namespace("team-y")
    wait_for(lambda: any(c.get("type") == "NamespaceFinalizersRemaining" for c in (
        (sim.get("namespaces", "team-y") or {}).get("status") or {}).get("conditions") or []),
        message="the foreign namespace to be held by its finalizer")
    held = sim.get("configmaps", "held", "team-y")
    assert held is not None and held["metadata"].get("deletionTimestamp")
    return held


def assert_untouched(sim: Simulator, before: dict[str, Any]) -> None:
    after = sim.get("configmaps", "held", "team-y")
    assert after is not None and after["metadata"]["finalizers"] == [FINALIZER]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert sim.get("namespaces", "team-y") is not None


def gone(zuul: ZuulClient, sim: Simulator, node_id: str, timeout: float = 30) -> None:
    wait_for(lambda: sim.get("namespaces", f"main-{node_id}") is None, timeout,
             message="the node's namespace to go")
    wait_for(lambda: zuul.get_node(node_id) is None, timeout, message="the node to go")


def stuck_signals(launcher: Launcher, node_id: str) -> tuple[list[dict[str, Any]], int, float]:
    """(delete-stuck events of the node, statsd increments, Prometheus count)."""
    events = [e for e in zk_events.read_events(launcher.zk)
              if e["kind"] == zk_events.DELETE_STUCK and e.get("node") == node_id]
    keys = launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined]
    prom = sum(v for (name, _), v in launcher.engine.stats.counters().items()
               if name == PROM_DELETE_STUCK)
    return events, keys.count("nodepool.provider.k8s.delete_stuck"), prom


def test_a_job_finalizer_is_cleared_in_its_namespace_only(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    launcher = launchers(config())
    written = record_stores(launcher, monkeypatch)
    node_id, nodeset = job_node(zuul)
    namespace = f"main-{node_id}"
    # The job, with the node's own token, leaves an object only it could finish.
    job = node_api(nodeset.nodes[0].data["connection_port"])
    job.create_namespaced_config_map(namespace, held_config_map())
    foreign = foreign_stuck_namespace(k8s_sim)

    zuul.release(nodeset)
    gone(zuul, k8s_sim, node_id)

    assert_untouched(k8s_sim, foreign)
    # Shown before it was cleared: the condition on the record, the event, the metric.
    stuck = [c for w in written if w["id"] == node_id
             for c in w.get(cond.KEY) or [] if c.get("reason") == "DeletionStuck"]
    assert stuck and stuck[0]["type"] == cond.DELETING and stuck[0]["status"] == cond.FALSE
    assert f"namespace {namespace} Terminating" in stuck[0]["message"]
    assert FINALIZER in stuck[0]["message"]
    events, statsd, prom = stuck_signals(launcher, node_id)
    assert len(events) == 1 and events[0]["external_id"] == namespace
    assert (statsd, prom) == (1, 1)
    cleared = [r for r in caplog.records if r.levelno == logging.WARNING
               and "removed the finalizers" in r.getMessage()]
    assert len(cleared) == 1
    message = cleared[0].getMessage()
    assert f"[node: {node_id}] namespace {namespace}" in message
    assert FINALIZER in message and "configmaps held" in message


def test_a_failing_clear_up_is_logged_once_and_retried(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    launcher = launchers(config())
    node_id, nodeset = job_node(zuul)
    namespace = f"main-{node_id}"
    node_api(nodeset.nodes[0].data["connection_port"]).create_namespaced_config_map(
        namespace, held_config_map())
    k8s_sim.fail_next("patch", "configmaps", count=10 ** 6, code=403)
    zuul.release(nodeset)

    def failed_tries() -> int:
        return k8s_sim.counters.get("patch configmaps", 0)
    wait_for(lambda: failed_tries() >= 3, 30, message="clear-ups tried again")
    # While it is stuck: the record says so, and so do the event log and the metrics.
    node = zuul.get_node(node_id)
    assert node is not None and node["state"] == "deleting"
    reasons = {c["type"]: c["reason"] for c in node.get(cond.KEY) or []}
    assert reasons[cond.DELETING] in ("DeletionStuck", "DeleteFailed")
    events, statsd, prom = stuck_signals(launcher, node_id)
    assert len(events) == 1 and (statsd, prom) == (1, 1)
    failures = [r for r in caplog.records if r.levelno >= logging.WARNING
                and "clearing" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert f"[node: {node_id}] namespace {namespace} stays Terminating; clearing it failed" \
        in failures[0].getMessage()

    k8s_sim.clear_faults()
    gone(zuul, k8s_sim, node_id)
    assert len(stuck_signals(launcher, node_id)[0]) == 1  # reported once per deletion


def test_a_pod_cannot_hold_its_namespace_with_its_grace_period(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator) -> None:
    k8s_sim.set_faults(ignore_sigterm=True)  # the container takes its whole grace period
    launchers(config())
    node_id, nodeset = job_node(zuul)
    namespace = f"main-{node_id}"
    job = node_api(nodeset.nodes[0].data["connection_port"])
    job.create_namespaced_pod(namespace, {
        "metadata": {"name": "stubborn"},
        "spec": {"terminationGracePeriodSeconds": 10 ** 9,
                 "containers": [{"name": "main", "image": "busybox"}]}})
    zuul.release(nodeset)
    wait_for(lambda: (k8s_sim.get("pods", "stubborn", namespace) or {}).get(
        "metadata", {}).get("deletionGracePeriodSeconds") == 1, 30,
        message="the pod deleted again with max-pod-grace")
    gone(zuul, k8s_sim, node_id)
    assert k8s_sim.counters.get("delete pods", 0) >= 1


def test_a_hanging_leak_does_not_hold_a_deleter_thread(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    settings = TEST_SETTINGS.replace(delete_workers=1, leak_sweep_interval=0.2)
    launcher = launchers(config(grace=3600), settings=settings)
    hanging, _ = job_node(zuul)
    others = [job_node(zuul)[0] for _ in range(2)]
    admin_api(k8s_sim).create_namespaced_config_map(f"main-{hanging}", held_config_map())

    remove_node(kazoo_client, hanging)
    wait_for(lambda: ((k8s_sim.get("namespaces", f"main-{hanging}") or {}).get(
        "status") or {}).get("phase") == "Terminating", 30,
        message="the leaked namespace deleted and hanging")
    for node_id in others:
        remove_node(kazoo_client, node_id)
    for node_id in others:
        wait_for(lambda: k8s_sim.get("namespaces", f"main-{node_id}") is None, 30,
                 message=f"leak {node_id} deleted by the only deleter thread")
    wait_for(lambda: launcher.deleter.leaks_deleted == 2, message="the deleter's count")
    assert k8s_sim.get("namespaces", f"main-{hanging}") is not None  # still held
    assert launcher.deleter.parked() == 1  # by no thread
