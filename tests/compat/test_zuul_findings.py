"""Regressions for incompatibilities found by tools/compat (real Zuul 14.3.0 / Nodepool 11).

No Zuul or Nodepool is needed: each test states, with our Zuul-like client or raw kazoo,
the exact thing the real code tripped over (see doc/compatibility.md, "Findings"):

- Zuul's executor iterates `host_keys` of every inventory node (kubectl pods) and copies
  `node_properties` into Ansible variables: both must be written as a list / dict, never
  null (Nodepool writes `[]` and `{}`). null crashed the build with a TypeError.
- A min-ready request another launcher created before its pools registered (Nodepool does
  this at every start) must not be declined: we would be the only registered pool, so the
  decline failed it at once.
- A paused request (pool at max-servers) must resume as soon as the node of a cancelled
  request is released unlocked and ready: the cache reports the node's data change and its
  unlock as separate events, and only the data change woke the pool worker, so the paused
  request could wait for an unrelated event (up to a minute).
"""

from __future__ import annotations

import json
import time
import uuid

from kazoo.client import KazooClient

from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory

PODS = """
labels:
  - name: pod
  - name: ns
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        labels:
          - name: pod
            type: pod
            cpu: 1
          - name: ns
            type: namespace
"""

SLOW = """
labels:
  - name: slow
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 1
        labels:
          - name: slow
            launch-delay: 1.0
"""


def test_node_defaults_are_nodepools_list_and_dict() -> None:
    first, second = Node(id="1"), Node(id="2")
    assert first.to_dict()["host_keys"] == [] and first.to_dict()["node_properties"] == {}
    first.host_keys.append("ssh-ed25519 AAAA")
    assert second.host_keys == [], "defaults must not be shared between nodes"
    parsed = Node.from_dict("3", {"state": "ready"})
    assert parsed.host_keys == [] and parsed.node_properties == {}
    # What someone else wrote is kept as written.
    assert Node.from_dict("4", {"state": "ready", "host_keys": ["k"]}).host_keys == ["k"]


def test_written_nodes_carry_host_keys_list_and_node_properties_dict(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    launchers(PODS)
    request_id = zuul.submit(["pod", "ns"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    for node_id in body["nodes"]:
        data, _ = kazoo_client.get(paths.node_path(node_id))
        node = json.loads(data)
        # Zuul's executor: `for key in getattr(node, 'host_keys', []): ...`
        assert isinstance(node["host_keys"], list), node["host_keys"]
        for _key in node["host_keys"]:
            pass
        assert node["node_properties"] == {}
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)


def test_paused_request_resumes_when_a_cancelled_requests_node_is_released(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(SLOW)
    first = zuul.submit(["slow"])
    wait_for(lambda: (zuul.get_request(first) or {}).get("state") == "pending", 10,
             message="first request pending")
    second = zuul.submit(["slow"])
    wait_for(lambda: (zuul.get_request(second) or {}).get("state") == "pending", 10,
             message="second request accepted and paused at max-servers: 1")
    zuul.cancel(first)  # while its node is still launching
    # The first node's launch ends after ~1 s; the second request reuses (or replaces) it
    # right away. Without the wake-up it waited for the next full cleanup pass (5 s here).
    body = zuul.wait(second, timeout=4.5)
    assert body is not None and body["state"] == "fulfilled"
    nodeset = zuul.accept(second)
    zuul.use(nodeset)
    zuul.release(nodeset)


FOREIGN = """
labels:
  - name: ours
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        labels:
          - name: ours
"""


def _min_ready_body(label: str) -> bytes:
    """A min-ready request as Nodepool 11 writes it (its NodeRequest.toDict keys)."""
    return json.dumps({
        "state": "requested", "state_time": time.time(), "declined_by": [],
        "node_types": [label], "nodes": [], "reuse": False,
        "requestor": "NodePool:min-ready", "requestor_data": None, "provider": None,
        "relative_priority": 0, "event_id": uuid.uuid4().hex, "created_time": None,
        "tenant_name": None}).encode("utf8")


def _register_pool(client: KazooClient, labels: list[str]) -> str:
    """A pool component as Nodepool registers it (ephemeral, in its own session)."""
    pool_id = f"other-PoolWorker.np-main-{uuid.uuid4().hex}"
    client.create(f"{paths.POOL_COMPONENTS}/otherhost", json.dumps({
        "hostname": "otherhost", "kind": "pool", "model_api": 0, "state": "running",
        "version": "11.0.0", "id": pool_id, "name": "main", "provider_name": "np",
        "supported_labels": labels, "priority": 100, "paused": False}, sort_keys=True
    ).encode("utf8"), ephemeral=True, sequence=True, makepath=True)
    return pool_id


def _request(client: KazooClient, request_id: str) -> dict:
    data, _ = client.get(paths.request_path(request_id))
    return json.loads(data)


def test_min_ready_request_of_a_launcher_still_starting_is_not_failed(
        launchers: LauncherFactory, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """Nodepool creates min-ready requests before its pools register; we must not fail them."""
    launcher = launchers(FOREIGN)
    ours = {w.id for w in launcher.pool_workers.values()}
    starting = KazooClient(hosts=zk.hosts)
    started = KazooClient(hosts=zk.hosts)
    starting.start(timeout=15)
    started.start(timeout=15)
    try:
        early = paths.basename(starting.create(f"{paths.REQUESTS}/900-",
                                               _min_ready_body("foreign"), ephemeral=True,
                                               sequence=True, makepath=True))
        # A launcher whose pool is registered: its min-ready request is declined normally.
        other_pool = _register_pool(started, ["elsewhere"])
        wait_for(lambda: any(p.id == other_pool for p in launcher.engine.registered_pools()),
                 10, message="the other pool in our registry cache")
        normal = paths.basename(started.create(f"{paths.REQUESTS}/900-",
                                               _min_ready_body("unserved"), ephemeral=True,
                                               sequence=True, makepath=True))
        wait_for(lambda: set(_request(kazoo_client, normal)["declined_by"]) == ours, 10,
                 message="our pool to decline the registered launcher's request")
        assert _request(kazoo_client, normal)["state"] == "requested"  # theirs remains
        # `early` sorts before `normal` (same priority, lower sequence), so the pass that
        # declined `normal` has already looked at it.
        body = _request(kazoo_client, early)
        assert body["state"] == "requested" and body["declined_by"] == [], body
        # Its creator's pool comes up and serves the label: still left to it.
        _register_pool(starting, ["foreign"])
        # A later request from the registered launcher is a barrier: once ours declined it,
        # our pool has walked the requests again, `early` first.
        barrier = paths.basename(started.create(f"{paths.REQUESTS}/900-",
                                                _min_ready_body("unserved"), ephemeral=True,
                                                sequence=True, makepath=True))
        wait_for(lambda: set(_request(kazoo_client, barrier)["declined_by"]) == ours, 10,
                 message="our pool to decline the barrier request")
        assert _request(kazoo_client, early)["declined_by"] == []
    finally:
        for client in (starting, started):
            client.stop()
            client.close()
    # Their sessions ended: the ephemeral requests went with them.
    wait_for(lambda: not kazoo_client.get_children(paths.REQUESTS), 10,
             message="ephemeral requests gone with their sessions")
