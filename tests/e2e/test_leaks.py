"""The leak sweeper against the simulated cluster, driven by the launcher's own cleanup worker.

Aspects: a namespace whose node znode was deleted behind the launcher's back (with kazoo) is
deleted only once it has been seen leaked on two sweeps at least `leak-grace` apart, and
`nodepool.provider.<p>.leaked.nodes` is counted; the namespace of a live node, a namespace
labelled for another provider and an unlabelled namespace that merely looks like ours are
never touched. Time is a ManualClock, so sweeps happen exactly when the test moves it.
"""

from __future__ import annotations

import time

from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.util import (LEAK_CONFIG, LEAK_GRACE, SWEEP_INTERVAL, admin_api, our_namespaces,
                            remove_node)
from tests.helpers import wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory


def sweep_after(launcher: Launcher, clock: ManualClock, seconds: float) -> None:
    """Move time on and return once the cleanup worker has finished a leak sweep at the new
    time (its next sweep is then due one interval later)."""
    clock.advance(seconds)
    due = clock.monotonic() + SWEEP_INTERVAL  # the sweep's schedule is monotonic
    launcher.cleanup.wake()
    wait_for(lambda: launcher.cleanup.leaks.next_due() >= due, message="a sweep")
    passes = launcher.cleanup.passes
    launcher.cleanup.wake()  # a later pass completes only after the sweeping one
    wait_for(lambda: launcher.cleanup.passes > passes, message="the sweeping pass to end")


def fulfilled_node(zuul: ZuulClient) -> str:
    request_id = zuul.submit(["ns"])
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    return str(body["nodes"][0])


def test_leaked_namespace_swept_after_two_sightings_and_grace(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    clock = ManualClock(start=time.time())
    launcher = launchers(LEAK_CONFIG, clock=clock,
                         settings=TEST_SETTINGS.replace(leak_sweep_interval=SWEEP_INTERVAL))
    keep, victim = fulfilled_node(zuul), fulfilled_node(zuul)
    leaked = f"main-{victim}"
    core = admin_api(k8s_sim)
    foreign = core.create_namespace({"metadata": {"name": "other-0000000123", "labels": {
        "nodepool_provider_name": "other", "nodepool_node_id": "0000000123",
        "nodepool_pool_name": "other", "nodepool_node_label": "ns"}}})
    lookalike = core.create_namespace({"metadata": {"name": "main-0000000999"}})
    assert our_namespaces(k8s_sim) == sorted([f"main-{keep}", leaked])

    # The node vanishes behind the launcher's back (an operator's kazoo, a bug, a restore).
    remove_node(kazoo_client, victim)
    wait_for(lambda: launcher.node_cache.get(victim) is None, message="the cache to see it")
    key = f"leak:k8s:{leaked}"

    def untouched() -> None:
        assert k8s_sim.get("namespaces", leaked)["status"]["phase"] == "Active"  # type: ignore
        assert not launcher.deleter.busy(key) and launcher.deleter.leaks_deleted == 0
        assert k8s_sim.counters.get("delete namespaces", 0) == 0

    sweep_after(launcher, clock, SWEEP_INTERVAL)  # first sighting
    untouched()
    sweep_after(launcher, clock, SWEEP_INTERVAL)  # second sighting, grace not yet over
    untouched()
    sweep_after(launcher, clock, LEAK_GRACE)  # seen again, grace over: deleted
    wait_for(lambda: k8s_sim.get("namespaces", leaked) is None, 15,
             message="the leaked namespace deleted")
    wait_for(lambda: launcher.deleter.leaks_deleted == 1, message="the deleter's count")
    keys = launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined]
    assert keys.count("nodepool.provider.k8s.leaked.nodes") == 1
    assert k8s_sim.counters["delete namespaces"] == 1

    # Nothing else was touched, and more sweeps do not change that.
    sweep_after(launcher, clock, LEAK_GRACE + SWEEP_INTERVAL)
    sweep_after(launcher, clock, LEAK_GRACE + SWEEP_INTERVAL)
    assert our_namespaces(k8s_sim) == [f"main-{keep}"]
    assert zuul.get_node(keep)["state"] == "ready"  # type: ignore[index]
    for original in (foreign, lookalike):
        now = k8s_sim.get("namespaces", original.metadata.name)
        assert now is not None and now["status"]["phase"] == "Active"
        assert now["metadata"]["resourceVersion"] == original.metadata.resource_version
    assert k8s_sim.counters["delete namespaces"] == 1
    assert launcher.deleter.leaks_deleted == 1
