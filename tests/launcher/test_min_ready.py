"""min-ready through whole launchers: spare ready nodes appear, are reused and
replenished, and are never duplicated when two launchers serve the label. The request
format, the decline at capacity and the back-off are stepped on their own in
tests/launcher/requests/, the finishing step next to the cleanup worker in
tests/launcher/upkeep/."""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.core import model
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import wait_for
from tests.launchers import LauncherFactory
from tests.launcher.util import NodeCounter

MIN_READY = """
labels:
  - name: small
    min-ready: {count}
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: {max_servers}
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
"""


def spares(client: KazooClient) -> list[str]:
    out = []
    for child in client.get_children(paths.NODES):
        try:
            body = json.loads(client.get(paths.node_path(child))[0])
        except Exception:
            continue
        if body["state"] == model.NodeState.READY and not body["allocated_to"] \
                and body["type"] == ["small"]:
            out.append(child)
    return out


def min_ready_requests(client: KazooClient) -> list[str]:
    return [r for r in client.get_children(paths.REQUESTS) if r.startswith("900-")]


def settle(launcher: Launcher, client: KazooClient, count: int) -> None:
    """Wait until there are `count` spares and no min-ready request, and it stays so
    while the min-ready worker makes more passes."""
    def done() -> bool:
        return len(spares(client)) == count and not min_ready_requests(client)

    def stable() -> bool:
        if not done():
            return False
        for _ in range(3):
            passes = launcher.min_ready.passes
            launcher.min_ready.wake()
            wait_for(lambda: launcher.min_ready.passes > passes, 10)
        return done()

    try:
        wait_for(stable, 30, interval=0.05, message=f"{count} spares, no min-ready request")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; spares {spares(client)}, min-ready requests "
                             f"{min_ready_requests(client)}") from None


def test_min_ready_creates_and_replenishes(launchers: LauncherFactory, zuul: ZuulClient,
                                           kazoo_client: KazooClient) -> None:
    launcher = launchers(MIN_READY.format(count=2, max_servers=10))
    settle(launcher, kazoo_client, 2)
    before = set(spares(kazoo_client))
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    assert body["nodes"][0] in before  # a spare was reused, not launched
    settle(launcher, kazoo_client, 2)
    assert set(spares(kazoo_client)) != before
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)


def test_two_launchers_no_duplicates(launchers: LauncherFactory,
                                     kazoo_client: KazooClient) -> None:
    counter = NodeCounter(kazoo_client)
    body = MIN_READY.format(count=3, max_servers=10)
    first = launchers(body)
    second = launchers(body)
    settle(first, kazoo_client, 3)
    settle(second, kazoo_client, 3)
    assert counter.max_labels["small"] == 3
    assert first.min_ready.created + second.min_ready.created == 3


POOL_MIN_READY = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    pools:
      - name: b
        priority: 1
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
      - name: a
        priority: 2
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
            min-ready: 2
"""


def pool_spares(client: KazooClient, pool: str) -> int:
    count = 0
    for child in client.get_children(paths.NODES):
        try:
            body = json.loads(client.get(paths.node_path(child))[0])
        except NoNodeError:
            continue
        if body["state"] == model.NodeState.READY and not body["allocated_to"] \
                and body.get("pool") == pool:
            count += 1
    return count


def test_pool_min_ready_builds_spares_in_that_pool_only(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """Pool `a`'s `min-ready: 2` keeps two spares there, although the preferred pool `b`
    serves the label too (it skips pool a's requests, never declines them); two launchers
    create no duplicates; pool a's AtTarget reads TargetMet 2/2."""
    counter = NodeCounter(kazoo_client)
    first = launchers(POOL_MIN_READY)
    second = launchers(POOL_MIN_READY)
    settle(first, kazoo_client, 2)
    settle(second, kazoo_client, 2)
    assert pool_spares(kazoo_client, "a") == 2 and pool_spares(kazoo_client, "b") == 0
    assert counter.max_labels["small"] == 2
    assert first.min_ready.created + second.min_ready.created == 2

    def at_target(launcher: Launcher) -> bool:
        records = [r for r in launcher.engine.pool_statuses.items().values()
                   if r.get("pool") == "a"]
        return len(records) == 2 and all(
            c["reason"] == "TargetMet" and "small 2/2" in c["message"]
            for r in records for c in r["conditions"] if c["type"] == "AtTarget") \
            and all(r["targets"]["small"] == {"wanted": 2, "spare": 2, "pool_level": 1}
                    for r in records)
    wait_for(lambda: at_target(first), 15, message="pool a AtTarget TargetMet 2/2")

    # A build takes a spare of pool b's label... served by the preferred pool b (no spare
    # there), while pool a keeps its two.
    _, nodes = zuul.run_build(["small"])
    node = zuul.get_node(nodes[0])
    assert node is not None and node["pool"] == "b"
    settle(first, kazoo_client, 2)
    assert pool_spares(kazoo_client, "a") == 2 and pool_spares(kazoo_client, "b") == 0
