"""Malformed records written by "something else" next to ordinary Zuul traffic.

Aspects: a real `nodepool-launcher` process serves every ordinary request while requests
and nodes of every malformed kind (wrong types, deep nesting, bad encoding, too large, too
many node types; nodes of its own provider included) sit in ZooKeeper; each bad znode is
logged once with its path, never with a traceback; `nodepool list` and `request-list`
exit 0 and show them as malformed; SIGTERM still stops the daemon; the malformed znodes
are left alone (not "cleaned up", not counted).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.zk import paths, pool_status
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import Processes, run_builds

pytestmark = pytest.mark.slow

NODEPOOL = Path(sys.executable).with_name("nodepool")

CONFIG = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    max-servers: 20
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
"""


def _with_nested(record: dict[str, Any], key: str, depth: int) -> bytes:
    """`record` plus `key` holding objects nested `depth` deep, built as text (encoding
    such a value needs a deeper stack than reading it does)."""
    nested = '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)
    return (json.dumps(record)[:-1] + f', "{key}": {nested}}}').encode()


GOOD_REQUEST = {"state": "requested", "node_types": ["small"], "requestor": "zuul",
                "relative_priority": 0, "reuse": True, "tenant_name": "t"}

BAD_REQUESTS: dict[str, bytes] = {
    "tenant_name list": json.dumps({**GOOD_REQUEST, "tenant_name": ["a"]}).encode(),
    "declined_by lists": json.dumps({**GOOD_REQUEST, "declined_by": [["x"]]}).encode(),
    "node_types string": json.dumps({**GOOD_REQUEST, "node_types": "small"}).encode(),
    "requestor int": json.dumps({**GOOD_REQUEST, "requestor": 5}).encode(),
    "relative_priority str": json.dumps({**GOOD_REQUEST, "relative_priority": "1"}).encode(),
    "5000 node types": json.dumps({**GOOD_REQUEST, "node_types": ["small"] * 5000}).encode(),
    "deep nesting": b"[" * 200_000,
    # Valid JSON the parser reads, nested deeper than a record may be: once accepted, such
    # a request could fail to be written back (the encoder runs on a deeper stack: at
    # about 980 levels it did) and wedged its pool.
    "requestor_data nested 500 deep": _with_nested(GOOD_REQUEST, "requestor_data", 499),
    "not utf-8": b'{"state": "requested", "node_types": ["\xff"]}',
    "too large": json.dumps({**GOOD_REQUEST, "requestor_data": "x" * 300_000}).encode(),
    "unknown state": json.dumps({**GOOD_REQUEST, "state": "sleeping"}).encode(),
}

OURS = {"state": "ready", "provider": "fake", "pool": "main", "type": ["small"]}
BAD_NODES: dict[str, bytes] = {
    "provider list": json.dumps({**OURS, "provider": ["fake"]}).encode(),
    "pool mapping": json.dumps({**OURS, "pool": {"main": 1}}).encode(),
    "type mapping": json.dumps({**OURS, "type": {"small": 1}}).encode(),
    "state number": json.dumps({**OURS, "state": 3}).encode(),
    "allocated_to int": json.dumps({**OURS, "allocated_to": 12}).encode(),
    "resources NaN": b'{"state": "used", "provider": "fake", "resources": {"cores": NaN}}',
    "resources -inf": b'{"state": "ready", "provider": "fake", "resources": {"ram": -Infinity}}',
    "deep nesting": b"{\"a\":" * 100_000,
    "attributes nested 500 deep": _with_nested(OURS, "attributes", 499),
    "not utf-8": b"\xc3\x28",
}


def write_malformed(client: KazooClient, priority: str = "100") -> tuple[list[str], list[str]]:
    """Write every bad record; returns (request paths, node paths)."""
    request_paths, node_paths = [], []
    for data in BAD_REQUESTS.values():
        request_paths.append(client.create(paths.request_create_prefix(priority), data,
                                           sequence=True, makepath=True))
    for data in BAD_NODES.values():
        node_paths.append(client.create(paths.NODE_CREATE_PREFIX, data, sequence=True,
                                        makepath=True))
    return request_paths, node_paths


def nodepool(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [str(NODEPOOL)] if NODEPOOL.exists() else [
        sys.executable, "-m", "nodepool_k8s.cmd.nodepoolcmd"]
    return subprocess.run(command + ["-c", str(config), *args], capture_output=True,
                          text=True, timeout=60)


def test_ordinary_traffic_is_served_beside_malformed_records(
        processes: Processes, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    # Some records exist before the launcher starts (its first sync), more arrive later.
    early_requests, early_nodes = write_malformed(kazoo_client, "100")
    proc = processes.start(CONFIG)
    with ZuulClient(zk.hosts) as zuul:
        late_requests, late_nodes = write_malformed(kazoo_client, "100")
        run_builds(zuul, "small", 10, processes.logs)

    config = processes.tmp / "nodepool-0.yaml"
    listing = nodepool(config, "list", "--json")
    assert listing.returncode == 0, listing.stderr
    rows = json.loads(listing.stdout)
    malformed_ids = {r["id"] for r in rows if r["state"] == "malformed"}
    assert malformed_ids == {paths.basename(p) for p in early_nodes + late_nodes}
    assert all(r["malformed"] for r in rows if r["state"] == "malformed")
    requests = nodepool(config, "request-list")
    assert requests.returncode == 0, requests.stderr
    assert requests.stdout.count("malformed") == 2 * len(BAD_REQUESTS)
    for output in (listing, requests):
        assert "Traceback" not in output.stdout + output.stderr

    # The malformed znodes are untouched: not deleted, not rewritten.
    for path in early_requests + late_requests + early_nodes + late_nodes:
        assert kazoo_client.exists(path) is not None

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    log = (processes.tmp / "launcher-0.log").read_text(errors="replace")
    assert "Traceback" not in log
    # Each bad znode is reported once, with its path.
    for path in early_requests + late_requests + early_nodes + late_nodes:
        assert log.count(f"Skipping malformed {_kind(path)} {path}:") == 1, path


def _kind(path: str) -> str:
    return "node" if path.startswith(paths.NODES + "/") else "request"


def test_cleanup_and_min_ready_pass_malformed_nodes(
        processes: Processes, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """min-ready keeps its spare and cleanup deletes a used node although malformed nodes
    of the same provider sit in every pass."""
    write_malformed(kazoo_client)
    proc = processes.start(CONFIG.replace("  - name: small\nproviders",
                                          "  - name: small\n    min-ready: 1\nproviders", 1))

    def spares() -> list[str]:
        out = []
        for child in kazoo_client.get_children(paths.NODES):
            try:
                data = json.loads(kazoo_client.get(paths.node_path(child))[0])
            except (ValueError, RecursionError):  # the malformed ones
                continue
            except NoNodeError:  # deleted since the listing (the used node)
                continue
            if isinstance(data, dict) and data.get("state") == "ready" \
                    and data.get("provider") == "fake" and data.get("pool") == "main" \
                    and data.get("allocated_to") is None and "launcher" in data \
                    and data.get("type") == ["small"]:
                out.append(child)
        return out
    wait_for(lambda: len(spares()) == 1, 30, message="min-ready spare built")
    with ZuulClient(zk.hosts) as zuul:
        zuul.run_build(["small"], timeout=60)
    wait_for(lambda: len(spares()) == 1, 30, message="spare replaced after use")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_garbage_in_our_own_tree_stops_no_pool(
        processes: Processes, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """Our own records as anybody with write access may leave them: label entries of the
    pool's circuit-breaker record of the wrong type (each used to fail every pass of the
    pool worker, restarts included) and a component registration nested too deep."""
    breaker = pool_status.breaker_path("fake", "main")
    kazoo_client.create(breaker, json.dumps({
        "small": "x", "other": {"failures": "many", "state": "open"}}).encode(),
        makepath=True)
    component = kazoo_client.create(f"{paths.COMPONENTS}/launcher/evil-", _with_nested(
        {"hostname": "h"}, "deep", 500), makepath=True, sequence=True)
    proc = processes.start(CONFIG)
    with ZuulClient(zk.hosts) as zuul:
        for _ in range(3):
            zuul.run_build(["small"], timeout=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    log = (processes.tmp / "launcher-0.log").read_text(errors="replace")
    assert "Traceback" not in log and "pass failed" not in log
    for label in ("small", "other"):
        assert log.count(f"Skipping malformed breaker entry {breaker} (label {label})") == 1
    assert log.count(f"Skipping malformed component {component}: JSON nested") == 1
