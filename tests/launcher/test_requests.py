"""Request handling end to end, with a client that behaves exactly like Zuul.

Aspects: a single-label build from submission to deletion of the used node; every node key
Zuul reads; multi-label requests keep `node_types` order (duplicates too); unknown labels
fail; provider preference and pool priority (the order of the work, by priority prefix,
relative priority as Zuul revised it and sequence, is stepped pass by pass in
tests/launcher/requests/test_pool_worker.py); requestor_data survives byte-for-value; no
znode is ever created under a request; stats for launches.
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import BIG_SPAN_ID, BIG_TRACE_ID, ZuulClient
from tests.helpers import replaced, wait_for
from tests.launcher.util import concurrent_builds
from tests.launchers import LauncherFactory

ATTRS = """
labels:
  - name: small
  - name: large
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 10
        node-attributes:
          executor-zone: zone-a
        labels:
          - name: small
            type: namespace
          - name: large
            type: pod
            cpu: 2
            memory: 1024
"""


def test_single_label_lifecycle(launchers: LauncherFactory, zuul: ZuulClient,
                                kazoo_client: KazooClient) -> None:
    launcher = launchers(ATTRS)
    request_id = zuul.submit(["small"], tenant_name="tenant-1")
    submitted = zuul.get_request(request_id)
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    assert body["requestor_data"] == submitted["requestor_data"]
    assert body["requestor_data"]["span_info"]["trace_id"] == BIG_TRACE_ID
    assert body["requestor_data"]["span_info"]["span_id"] == BIG_SPAN_ID
    assert body["declined_by"] == [] and body["reuse"] is True
    assert len(body["nodes"]) == 1
    node = zuul.get_node(body["nodes"][0])
    assert node is not None
    pool_ids = [c.id for c in launcher.component_cache.pools()]
    assert node["state"] == "ready" and node["type"] == ["small"]
    assert node["provider"] == "fake" and node["pool"] == "main"
    assert node["launcher"] in pool_ids
    assert node["allocated_to"] == request_id and node["tenant_name"] == "tenant-1"
    assert node["requestor"] == zuul.system_id
    assert node["attributes"] == {"executor-zone": "zone-a"}
    assert node["resources"] == {"instances": 1, "cores": 0, "ram": 0}
    assert node["connection_type"] == "namespace" and node["external_id"] == f"main-{node_id(body)}"
    conn = node["connection_port"]
    assert {"host", "skiptls", "token", "user", "namespace"} <= set(conn)
    assert node["ssh_port"] == conn
    assert not kazoo_client.get_children(paths.node_lock_path(body["nodes"][0]))
    # cversion counts every child ever created or deleted under the request znode: 0 means
    # the launcher never created one, however short-lived (a watch could miss it).
    stat = kazoo_client.exists(paths.request_path(request_id))
    assert stat is not None and stat.cversion == 0
    nodeset = zuul.accept(request_id)
    assert zuul.get_request(request_id) is None
    zuul.use(nodeset)
    in_use = zuul.get_node(nodeset.nodes[0].id)
    assert in_use is not None and in_use["state"] == "in-use" and in_use["id"] == node_id(body)
    zuul.release(nodeset)
    wait_for(lambda: zuul.get_node(nodeset.nodes[0].id) is None, 15, message="node deleted")
    assert launcher.providers["fake"].resource_ids() == set()  # type: ignore[attr-defined]
    timings = launcher.engine.stats.backend.keys("timing")  # type: ignore[attr-defined]
    assert "nodepool.launch.ready" in timings
    assert "nodepool.launch.provider.fake.ready" in timings
    assert f"nodepool.launch.requestor.{zuul.system_id}.ready" in timings


def node_id(body: dict) -> str:  # type: ignore[type-arg]
    return str(body["nodes"][0])


def test_multi_label_order_kept(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(ATTRS)
    types = ["large", "small", "large", "small", "small"]
    request_id = zuul.submit(types)
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    assert len(body["nodes"]) == len(set(body["nodes"])) == 5
    for label, nid in zip(types, body["nodes"]):
        node = zuul.get_node(nid)
        assert node is not None and node["type"] == [label]
        assert node["connection_type"] == ("kubectl" if label == "large" else "namespace")
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)


def test_unknown_label_fails(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(ATTRS)
    request_id = zuul.submit(["small", "no-such-label"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "failed" and body["nodes"] == []
    assert body["declined_by"] == [c.id for c in launcher.component_cache.pools()]
    assert launcher.node_cache.ids() == []


TWO_PROVIDERS = """
labels:
  - name: small
providers:
  - name: fake-a
    driver: fake
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
  - name: fake-b
    driver: fake
    priority: {b_priority}
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
"""


def test_provider_preference(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(TWO_PROVIDERS.format(b_priority=100))
    for wanted in ("fake-b", "fake-a", "fake-b"):
        request_id = zuul.submit(["small"], provider=wanted)
        body = zuul.wait(request_id)
        assert body is not None and body["state"] == "fulfilled"
        node = zuul.get_node(body["nodes"][0])
        assert node is not None and node["provider"] == wanted
        zuul.cancel(request_id)


def test_pool_priority(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(TWO_PROVIDERS.format(b_priority=10))
    for _ in range(3):
        request_id = zuul.submit(["small"])
        body = zuul.wait(request_id)
        assert body is not None and body["state"] == "fulfilled"
        node = zuul.get_node(body["nodes"][0])
        assert node is not None and node["provider"] == "fake-b"
        zuul.cancel(request_id)


def test_many_concurrent_builds(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(replaced(ATTRS, "max-servers: 10", "max-servers: 4"))
    # Every one of the 12 builds fulfilled, none still running.
    assert not concurrent_builds(zuul, ["small", "large"], 12)
    provider = launcher.providers["fake"]
    # 12 builds of two nodes each, and never more than max-servers in the cloud at once
    # (the fake cloud counts exactly; a watcher sampling ZooKeeper could miss an excess).
    assert provider.call_names().count("launch") == 24  # type: ignore[attr-defined]
    assert 2 <= provider.peak_resources() <= 4  # type: ignore[attr-defined]
    wait_for(lambda: not provider.resource_ids(), 15,  # type: ignore[attr-defined]
             message="every namespace removed")


def test_zuul_written_keys_preserved_on_every_write(launchers: LauncherFactory,
                                                    zuul: ZuulClient) -> None:
    launchers(ATTRS)
    # What Zuul wrote, not a read after the create: a launcher may have written
    # `pending` (with its own keys) before such a read.
    written = zuul.request_body(["small"], provider=None, event_id="evt-1")
    request_id = paths.basename(zuul.submit_async(written).get(timeout=10))
    before = json.loads(written)
    body = zuul.wait(request_id)
    assert body is not None
    for key, value in before.items():
        if key not in ("state", "state_time"):
            assert body[key] == value, key
