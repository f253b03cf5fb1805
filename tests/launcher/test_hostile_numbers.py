"""Records with numbers out of range, and hostile component registrations, next to ordinary
Zuul traffic (a real `nodepool-launcher` process with its web app, real ZooKeeper).

Aspects: `1e400`, 400-digit integers and `NaN` in node conditions, `created_time`, a
request's times, event times, pool status, pool state and breaker records, and pool
components whose `supported_labels` is a number, a string or nested lists: every request
is still fulfilled; `/events`, `/node-list`, `/pool-list` and `/request-list` stay strict
JSON (a parser that refuses `NaN` and `Infinity` reads them); no traceback in the log;
each culprit is logged once with its path.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import events, paths, pool_state, pool_status
from tests.helpers import ZkConnection, wait_for
from tests.launcher.test_malformed import CONFIG
from tests.launcher.util import Processes, run_builds
from tests.ops.conftest import free_port

pytestmark = pytest.mark.slow

HUGE = b"9" * 400
NODE = b'{"state": "ready", "provider": "fake", "pool": "main", "type": ["small"]'


def _node(extra: bytes) -> bytes:
    return NODE + b", " + extra + b"}"


def _condition(when: bytes) -> bytes:
    return (b'"conditions": [{"type": "Launched", "status": "True", "reason": "x",'
            b' "last_transition_time": ' + when + b"}]")


BAD_NODES = [
    _node(_condition(b"1e400")),
    _node(_condition(HUGE)),
    _node(_condition(b"NaN")),
    _node(b'"created_time": 1e400'),
    _node(b'"created_time": ' + HUGE),
    # Finite, but far apart: their difference (a phase's duration) is infinite.
    _node(b'"conditions": [{"type": "Launched", "status": "True", "reason": "x",'
          b' "last_transition_time": -1.7e308}, {"type": "Registered", "status": "True",'
          b' "reason": "x", "last_transition_time": 1.7e308}]'),
]
REQUEST = b'{"state": "requested", "node_types": ["small"], "requestor": "evil"'
BAD_REQUESTS = [
    REQUEST + b', "created_time": 1e400}',
    REQUEST + b', "state_time": ' + HUGE + b"}",
    REQUEST + b', "requestor_data": {"n": NaN}}',
]
BAD_EVENTS = [
    b'[{"time": 1e400, "kind": "launched", "node": "0000000001"}]',
    b'[{"time": ' + HUGE + b', "kind": "launched"}]',
    b'[{"time": NaN, "kind": "launched"}]',
    b'[{"time": 1e300, "kind": "launched"}]',
]
POOL = b'{"id": "evil-%d", "provider_name": "fake", "name": "main", '
BAD_COMPONENTS = [
    POOL % 1 + b'"supported_labels": 5}',
    POOL % 2 + b'"supported_labels": "small"}',
    POOL % 3 + b'"supported_labels": [[[[["small"]]]]]}',
    POOL % 4 + b'"supported_labels": ' + b"[" * 100 + b"]" * 100 + b"}",
    POOL % 5 + b'"supported_labels": ["small"], "priority": 1e400}',
]
STATUS = b'{"id": "evil", "provider": "fake", "pool": "main", '
BAD_STATUS = {
    "evil-nan": STATUS + b'"conditions": [{"type": "Validated", "status": "True",'
                         b' "reason": "x", "last_transition": NaN}]}',
    "evil-inf": STATUS + b'"launches_in_progress": 1e400}',
    "evil-huge": STATUS + b'"nodes": {"ready": ' + HUGE + b"}}",
}
BAD_STATES = {
    pool_state.target_path("fake/main"): b'{"action": "drain", "time": 1e400}',
    pool_state.target_path("fake"): b'{"action": "pause", "time": NaN}',
}
BAD_BREAKER = (b'{"small": {"state": "open", "until": 1e400, "since": NaN, "trips": '
               + b"9" * 300 + b"}}")


def _refuse(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """JSON as a strict reader (a browser's, the status page's) takes it."""
    return json.loads(text, parse_constant=_refuse)


def get_json(base: str, path: str) -> Any:
    request = urllib.request.Request(base + path, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return strict_json(response.read().decode())


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/ready", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def write_hostile(client: KazooClient) -> dict[str, list[str]]:
    """Every hostile record; returns the paths by the kind they are reported as."""
    written: dict[str, list[str]] = {"node": [], "request": [], "event batch": [],
                                     "component": [], "pool-status": [], "pool-state": [],
                                     "breaker": []}
    for data in BAD_NODES:
        written["node"].append(client.create(paths.NODE_CREATE_PREFIX, data,
                                             sequence=True, makepath=True))
    for data in BAD_REQUESTS:
        written["request"].append(client.create(paths.request_create_prefix("100"), data,
                                                sequence=True, makepath=True))
    for data in BAD_EVENTS:
        written["event batch"].append(client.create(f"{events.EVENTS}/{events.PREFIX}",
                                                    data, sequence=True, makepath=True))
    for data in BAD_COMPONENTS:
        # Ephemeral, like a live launcher's: those are the ones every pool pass reads.
        written["component"].append(client.create(
            f"{paths.COMPONENTS}/pool/evil-", data, sequence=True, ephemeral=True,
            makepath=True))
    for name, data in BAD_STATUS.items():
        written["pool-status"].append(client.create(pool_status.status_path(name), data,
                                                    makepath=True))
    for path, data in BAD_STATES.items():
        written["pool-state"].append(client.create(path, data, makepath=True))
    written["breaker"].append(client.create(pool_status.breaker_path("fake", "main"),
                                            BAD_BREAKER, makepath=True))
    return written


def test_out_of_range_numbers_and_hostile_components_stop_nothing(
        processes: Processes, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    written = write_hostile(kazoo_client)
    port = free_port()
    proc = processes.start(CONFIG, web_port=port)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ready(base), 30, interval=0.1, message="the launcher serving")
    with ZuulClient(zk.hosts) as zuul:
        run_builds(zuul, "small", 5, processes.logs)

    # The launcher's own events are listed (batched: they come within seconds), read many
    # times: the culprits are still logged once.
    wait_for(lambda: any(e.get("kind") == "launched" for e in get_json(base, "/events")),
             30, interval=0.2, message="the launches in /events")
    assert all(e["time"] < 1e300 for e in get_json(base, "/events"))
    rows = get_json(base, "/node-list")
    malformed = {r["id"] for r in rows if r["state"] == "malformed"}
    assert malformed == {paths.basename(p) for p in written["node"]}
    requests = get_json(base, "/request-list")
    assert {r["id"] for r in requests if r["state"] == "malformed"} == {
        paths.basename(p) for p in written["request"]}
    pools = get_json(base, "/pool-list")
    assert [(p["provider"], p["pool"]) for p in pools] == [("fake", "main")]
    for row in rows:
        if row["state"] != "malformed":
            get_json(base, f"/node/{row['id']}")
    with urllib.request.urlopen(base + "/metrics", timeout=30) as response:
        assert response.status == 200

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    log = (processes.tmp / "launcher-0.log").read_text(errors="replace")
    assert "Traceback" not in log and "pass failed" not in log
    for kind, found in written.items():
        for path in found:
            assert log.count(f"Skipping malformed {kind} {path}:") == 1, (kind, path, log)
