"""Two launchers on one provider: each used node is deleted by the launcher that built it,
and the other makes no attempt (the rule itself, stepped on a ManualClock, is in
tests/launcher/upkeep/test_builder_deletes.py)."""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

BUILDS = 20


def test_each_launcher_deletes_what_it_built(launchers: LauncherFactory, zuul: ZuulClient,
                                             kazoo_client: KazooClient) -> None:
    first, second = launchers(), launchers()
    for _ in range(BUILDS):
        zuul.run_build(["small"])
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 15)
    built = [launcher.providers["fake"].call_names().count("launch")  # type: ignore[attr-defined]
             for launcher in (first, second)]
    assert sum(built) == BUILDS
    # A deleter counts a node just after its record is gone: wait for the counts too (a
    # node deleted by the launcher that did not build it never lets them match).
    wait_for(lambda: [first.deleter.deleted, second.deleter.deleted] == built, 15,
             message=f"each launcher to have deleted what it built ({built})")
    assert [first.deleter.deleted, second.deleter.deleted] == built
