"""ZooKeeper writes per node, measured two ways: the launcher's own counter and the
server's transaction id (every write request, a multi included, and every failed write
takes one zxid). The budget is 8 launcher writes per single-node request end to end
(accept, create, lock+building, external id, fulfil, and lock, deleting, removal), plus
the event log's share: successful launches and deletions are written in batches (about
0.1 write per node), well within the one extra write per node that conditions and events
may cost (conditions themselves ride along with the writes above)."""

from __future__ import annotations

import re

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zookeeper import four_letter
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory

BUILDS = 20
ZUUL_WRITES_PER_BUILD = 6  # submit, lock node, delete request, in-use, used, unlock
BUDGET = 8
EVENT_LOG_SHARE = 0.5


def zxid(zk: ZkConnection) -> int:
    match = re.search(r"Zxid: (0x[0-9a-f]+)", four_letter(zk.port, "srvr"))
    assert match
    return int(match.group(1), 16)


def test_writes_per_node(launchers: LauncherFactory, zuul: ZuulClient, zk: ZkConnection,
                         kazoo_client: KazooClient) -> None:
    launcher = launchers()
    zuul.run_build(["small"])  # warm up: guard znodes, lock roots
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 15)
    before, before_zxid = launcher.zk.writes.snapshot(), zxid(zk)
    for _ in range(BUILDS):
        zuul.run_build(["small"])
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 15)
    after, after_zxid = launcher.zk.writes.snapshot(), zxid(zk)
    requests = (after[0] - before[0]) / BUILDS
    ops = (after[1] - before[1]) / BUILDS
    server = (after_zxid - before_zxid - BUILDS * ZUUL_WRITES_PER_BUILD) / BUILDS
    print(f"launcher ZooKeeper writes per single-node request: {requests:.2f} write requests "
          f"({ops:.2f} operations); server transactions not from Zuul: {server:.2f}")
    assert requests <= BUDGET + EVENT_LOG_SHARE
    assert server <= BUDGET + EVENT_LOG_SHARE
