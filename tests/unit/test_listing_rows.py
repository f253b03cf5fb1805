"""The slim listing path (`ZkReader.node_records` + `status.node_row_from_dict`) gives the
same rows as decoding every record into a `Node` (`nodes.parse` + `status.node_row`)."""

from __future__ import annotations

import json

import pytest

from nodepool_k8s import status
from nodepool_k8s.zk import nodes as node_codec

NOW = 1_700_000_000.0

RECORDS = [
    {"state": "ready", "state_time": NOW - 93784.5, "type": ["namespace"],
     "provider": "k8s", "pool": "main", "external_id": "ns-1", "hostname": "h",
     "connection_port": {"token": "secret", "ca_crt": "x"}, "ssh_port": {"token": "s"},
     "az": "zone", "username": "zuul", "launcher": "l", "allocated_to": "200-1",
     "hold_job": None, "comment": "c", "user_data": {"a": 1}, "driver_data": [1],
     "connection_type": "namespace", "tenant_name": "t", "resources": {"cores": 1},
     "public_ipv4": "1.2.3.4", "public_ipv6": "::1", "private_ipv4": "10.0.0.1",
     "id": "zuul-extra", "unknown": 3},
    {"state": "building", "type": "pod"},
    {"state": "in-use", "state_time": NOW + 10, "type": [], "ssh_port": 2222},
    {"state": "used", "connection_port": None, "ssh_port": 22},
    {"state": "hold", "connection_port": 22},
    {"state": "deleting", "connection_port": True},
    {"state": "failed", "type": None, "state_time": None},
    {"state": "init", "type": ("a", "b")},
]


@pytest.mark.parametrize("locked", [False, True])
@pytest.mark.parametrize("record", RECORDS)
def test_row_from_dict_matches_node_row(record: dict, locked: bool) -> None:
    data = json.loads(json.dumps(record))
    node = node_codec.parse("0000000001", json.dumps(record).encode())
    assert node is not None
    expected = status.node_row(status.NodeView(node, locked), NOW)
    assert status.node_row_from_dict("0000000001", data, locked, NOW) == expected


def test_render_table_layout() -> None:
    rows = [{"a": "x", "b": None}, {"a": "longer", "b": ["p", "q"]}]
    text = status.render_table(rows, (("A", "a"), ("Bee", "b")))
    assert text.splitlines() == [
        "+--------+-----+",
        "| A      | Bee |",
        "+--------+-----+",
        "| x      |     |",
        "| longer | p,q |",
        "+--------+-----+",
    ]
    assert status.render_table([], (("A", "a"),)).splitlines() == [
        "+---+", "| A |", "+---+", "+---+"]
