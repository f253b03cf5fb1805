"""Cleanup and recovery through a running launcher, where the threads together are the
point: launch retries; malformed and empty znodes; no per-node state or reference cycle
outlives the nodes; a session expiry in the middle of a launch.

The cleanup worker's own decisions (ages, holds, deletion retries and parking, orphaned
locks, the leak sweep, request-lock dirs) are stepped on a manual clock in
tests/launcher/upkeep/test_cleanup.py, and with the pool worker on the same records
(reuse, cancellation during a launch, a lost pending request reset, also one Zuul deletes
during the reset, a failed launch) in tests/launcher/upkeep/test_recovery.py.
"""

from __future__ import annotations

import gc
import threading

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import LaunchError, TemporaryError
from nodepool_k8s.launcher.requests.allocation import Allocator
from nodepool_k8s.launcher.requests.handler import RequestHandler
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory
from tests.sessions import expire_session

CONFIG = """
labels:
  - name: small
    max-ready-age: 600
  - name: slow
max-hold-age: {max_hold_age}
providers:
  - name: fake
    driver: fake
    launch-retries: 3
    leak-grace: 100
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            type: namespace
          - name: slow
            type: namespace
            launch-delay: {slow}
"""


def body(max_hold_age: int = 0, slow: float = 0.5) -> str:
    return CONFIG.format(max_hold_age=max_hold_age, slow=slow)


def fulfilled(zuul: ZuulClient, request_id: str) -> list[str]:
    result = zuul.wait(request_id, 20)
    assert result is not None and result["state"] == "fulfilled", result
    return list(result["nodes"])


def test_launch_retries_then_success(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(body())
    fake = launcher.providers["fake"]
    fake.fail_next(2, LaunchError("boom"))  # type: ignore[attr-defined]
    node_id = fulfilled(zuul, zuul.submit(["small"]))[0]
    assert fake.call_names().count("launch") == 3  # type: ignore[attr-defined]
    assert zuul.get_node(node_id)["external_id"] == f"main-{node_id}-3"  # type: ignore


def test_malformed_znodes_are_skipped(launchers: LauncherFactory, zuul: ZuulClient,
                                      kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.ensure_path(paths.REQUESTS)
    kazoo_client.create(paths.request_path("200-0000000100"), b"{not json")
    kazoo_client.create(paths.request_path("200-0000000101"), b'{"state": "weird"}')
    kazoo_client.create(paths.request_path("200-0000000102"), b"")
    kazoo_client.create(paths.node_path("0000000100"), b"{junk")
    kazoo_client.create(paths.node_path("0000000101"), b'{"state": "nope"}')
    kazoo_client.create(paths.node_path("0000000102"), b"")
    launcher = launchers(body())
    fulfilled(zuul, zuul.submit(["small"]))
    wait_for(lambda: kazoo_client.exists(paths.node_path("0000000102")) is None, 15,
             message="empty node znode removed")
    assert kazoo_client.get(paths.request_path("200-0000000100"))[0] == b"{not json"
    assert all(w.alive for w in launcher.pool_workers.values())


def test_no_per_node_state_outlives_the_nodes(launchers: LauncherFactory,
                                              zuul: ZuulClient) -> None:
    """After many builds (some deletions failing first) every per-node table of the
    engine is empty again: what a daemon keeps must not grow with the nodes it served."""
    launcher = launchers(body())
    fake = launcher.providers["fake"]
    fake.fail_next(5, TemporaryError("api down"), op="delete")  # type: ignore[attr-defined]
    for _ in range(4):
        threads = [threading.Thread(target=zuul.run_build, args=(["small"],))
                   for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    wait_for(lambda: not launcher.node_cache.ids(), 30, message="every node deleted")
    engine = launcher.engine
    wait_for(lambda: launcher.deleter.retry_entries() == 0
             and not any(w.handlers for w in launcher.pool_workers.values()), 20,
             message="deleter retries and request handlers gone")
    assert engine.node_cache._by_request == {}
    # Nodes of the last allocations are remembered until the next quota read prunes them
    # (at most one round of creations, never the history).
    assert len(engine.guard._created) <= 8
    assert engine.node_cache.malformed() == {} and engine.node_cache.empty_ids() == []
    assert fake.resource_ids() == set()  # type: ignore[attr-defined]


def test_a_served_request_leaves_no_reference_cycle(launchers: LauncherFactory,
                                                    zuul: ZuulClient) -> None:
    """A finished request's handler (its allocator, slots, locks, nodes and launch results)
    is freed when its pool worker drops it, by reference counting: a cycle through it
    would keep all of it until the collector's next full pass, which comes more rarely
    the more a long-running launcher holds (that wait was the soak's growth)."""
    launcher = launchers(body())
    zuul.run_build(["small"])  # everything that is created once is created now
    gc.collect()
    gc.disable()  # nothing collected behind the test's back: all garbage is seen below
    try:
        for _ in range(3):
            zuul.run_build(["small", "small"])
        wait_for(lambda: not launcher.node_cache.ids()
                 and not any(w.handlers for w in launcher.pool_workers.values()), 30,
                 message="every node deleted and every handler dropped")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage
                  if isinstance(o, (RequestHandler, Allocator))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert cyclic == []


def test_session_expiry_mid_launch(zk: ZkConnection, launchers: LauncherFactory,
                                   zuul: ZuulClient) -> None:
    launcher = launchers(body(slow=1.0))
    request_id = zuul.submit(["slow"])
    wait_for(lambda: launcher.node_cache.ids(), 10, message="launch started")
    first_node = launcher.node_cache.ids()[0]
    expire_session(zk, launcher.zk)
    nodes = fulfilled(zuul, request_id)
    assert nodes != [first_node]
    wait_for(lambda: zuul.get_node(first_node) is None, 20, message="abandoned node deleted")
    node = zuul.get_node(nodes[0])
    assert node is not None and node["state"] == model.NodeState.READY
    assert len(launcher.component_cache.pools()) == 1
