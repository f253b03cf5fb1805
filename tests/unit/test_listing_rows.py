"""Listing rows: every odd-but-valid node record decodes into a `Node` (the one decoder) and
renders as a row (the one row builder) with secrets redacted; `model.Node` has a typed
attribute for every field (no catch-all), and unknown keys round-trip; tables render."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nodepool_k8s.core import model
from nodepool_k8s.views import listing
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
def test_rows_of_decoded_records(record: dict, locked: bool) -> None:
    node = node_codec.parse("0000000001", json.dumps(record).encode())
    assert node is not None
    row = listing.node_row(listing.NodeView(node, locked), NOW)
    assert row["id"] == "0000000001" and row["state"] == record["state"]
    assert row["locked"] == ("locked" if locked else "unlocked")
    port = row["connection_port"]
    assert port is None or isinstance(port, int) or port == listing.REDACTED
    assert "secret" not in json.dumps(row)
    types = record.get("type")
    assert row["label"] == ([types] if isinstance(types, str) else list(types or []))


def test_node_has_a_typed_attribute_per_field_and_no_catch_all() -> None:
    node = model.Node.from_dict("0000000001", RECORDS[0])
    assert not hasattr(model.Node, "__getattr__")
    slots = {f.name for f in dataclasses.fields(model.Node)}
    for key in model._NODE_DEFAULTS:
        if key in model.SLOT_FIELDS:  # a typed slot
            assert key in slots and key not in node.fields, key
        else:
            assert isinstance(getattr(model.Node, key), model._Field), key
            assert getattr(node, key) == node.fields[key]
        assert getattr(node, key) == node.to_dict()[key], key
    assert list(node.to_dict())[:3] == ["id", "unknown", "cloud"]  # extra, then Nodepool's order
    with pytest.raises(AttributeError):
        getattr(node, "providr")
    with pytest.raises(AttributeError):
        node.providr = "x"  # type: ignore[attr-defined]  # slotted: no new attributes
    node.provider = "other"
    node.set(hostname="h2")  # typed setter of a `fields` field
    assert node.to_dict()["provider"] == "other" and node.fields["hostname"] == "h2"
    assert node.to_dict()["unknown"] == 3 and node.to_dict()["id"] == "zuul-extra"


def test_cache_summary_is_the_same_record_type_kept_small() -> None:
    """The node cache keeps `model.Node` summaries: the decision fields only, slotted, and
    never written back (reading a field it does not keep fails loudly)."""
    record = dict(RECORDS[0], config_hash="abc", conditions=[{"type": "Ready"}])
    whole = model.Node.from_dict("0000000001", record, version=3)
    summary = model.Node.from_dict("0000000001", record, version=3, summary=True)
    assert type(summary) is type(whole) is model.Node and summary.summary
    assert not hasattr(summary, "__dict__")  # slotted
    for key in model.SUMMARY_FIELDS:
        assert getattr(summary, key) == getattr(whole, key), key
    assert (summary.state, summary.state_time, summary.type, summary.version) == \
        (whole.state, whole.state_time, whole.type, whole.version)
    assert summary.label == "namespace" and summary.config_hash == "abc" == whole.config_hash
    assert not summary.extra and summary.conditions == []
    assert not summary.fields
    with pytest.raises(model.SummaryError):
        summary.extra["x"] = 1  # read-only, shared
    with pytest.raises(model.SummaryError):
        summary.hostname
    with pytest.raises(model.SummaryError):
        summary.to_dict()
    assert whole.to_dict()["unknown"] == 3  # the whole record still round-trips
    bare = model.Node.from_dict("0000000002", {"state": "ready"}, summary=True)
    assert bare.provider is None and bare.fields == {} and bare.config_hash is None
    with pytest.raises(model.SummaryError):
        bare.fields["hostname"] = "h"  # read-only, shared


def test_render_table_layout() -> None:
    rows = [{"a": "x", "b": None}, {"a": "longer", "b": ["p", "q"]}]
    text = listing.render_table(rows, (("A", "a"), ("Bee", "b")))
    assert text.splitlines() == [
        "+--------+-----+",
        "| A      | Bee |",
        "+--------+-----+",
        "| x      |     |",
        "| longer | p,q |",
        "+--------+-----+",
    ]
    assert listing.render_table([], (("A", "a"),)).splitlines() == [
        "+---+", "| A |", "+---+", "+---+"]


def test_one_long_cell_does_not_widen_every_row() -> None:
    """Each row is padded to its column's widest cell: a 50 KB hold reason on one node of
    2,000 made `nodepool list --detail` and the web app's text node list 96 MiB."""
    rows = [{"id": f"{i:010d}", "comment": "short"} for i in range(2000)]
    rows[7]["comment"] = "x" * 50_000
    table = listing.render_table(rows, [("ID", "id"), ("Comment", "comment")])
    lines = table.splitlines()
    assert len(lines) == 2000 + 4
    assert max(map(len, lines)) <= listing.MAX_CELL + 20
    assert ("x" * (listing.MAX_CELL - 3) + "...") in lines[7 + 3]
    # Cells that fit are untouched.
    assert "| 0000000000 | short " in lines[3]


@pytest.mark.parametrize("value, shown", [
    (1_795_906_337.25, "2026-11-28T22:52:17Z"),
    (0, "1970-01-01T00:00:00Z"),
    (-1.5, "1969-12-31T23:59:58Z"),
    # Rounded to the microsecond first, as datetime rounds: the next second.
    (1_795_906_336.9999996, "2026-11-28T22:52:17Z"),
    (253_402_300_799, "9999-12-31T23:59:59Z"),
    (253_402_300_799.9999996, None),  # rounds into year 10000
    (-62_135_596_801, None),
    (1e300, None), (float("nan"), None), (float("inf"), None),
    (True, None), ("1795906337", None), (None, None), ([1], None),
])
def test_token_expiry_shows_a_date_or_nothing(value: object, shown: str | None) -> None:
    assert listing.token_expiry(value) == shown
