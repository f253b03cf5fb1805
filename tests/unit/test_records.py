"""The strict record decoders (`nodepool_k8s.core.records` and every decoder built on it).

Aspects: each malformed kind (types, states, nesting, encoding, size, node-type count) is
`Malformed` with a reason naming the key; records Zuul 14 and Nodepool 11 write decode and
round-trip unchanged (unknown keys, huge requestor_data integers); `MalformedLog` reports
once per version and is bounded; property-based: random JSON and random bytes fed to every
decoder give a record or `Malformed`, never another exception.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import uuid
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodepool_k8s.core import records
from nodepool_k8s.core.records import Malformed, MalformedLog
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import decode_component, decode_summary

ZUUL_REQUEST = {
    "state": "requested", "state_time": 1700000000.5, "declined_by": [],
    "node_types": ["small", "large"], "nodes": [], "reuse": False,
    "requestor": "zuul.example.org", "provider": None, "relative_priority": 3,
    "event_id": "abc", "created_time": 1700000000.1, "tenant_name": "tenant-1",
    "requestor_data": {"span_info": {"trace_id": 2 ** 100}}, "id": "100-0000000001",
}
NODEPOOL_NODE = {
    "state": "ready", "state_time": 1700000000.0, "type": "small", "provider": "k8s",
    "pool": "main", "allocated_to": None,
    "resources": {"cores": 2, "ram": 1024.5, "instances": 1},
    "connection_port": {"token": "t"}, "ssh_port": 22, "host_keys": [],
    "attributes": None, "hold_expiration": None, "future_key": {"x": [1, 2]},
}


class _Stat:
    version = 3
    ephemeralOwner = 0


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


def test_good_records_decode_and_round_trip() -> None:
    request = request_codec.decode("100-0000000001", _dump(ZUUL_REQUEST), 4)
    assert request.to_dict() == ZUUL_REQUEST
    node = node_codec.decode("0000000001", _dump(NODEPOOL_NODE), 2)
    assert node.type == ["small"] and node.version == 2
    assert node.extra["future_key"] == {"x": [1, 2]}
    assert decode_summary("0000000001", _dump(NODEPOOL_NODE), _Stat()).pool == "main"


def test_a_summary_interns_the_shared_values_not_the_unique_ones() -> None:
    """The node cache's summaries share one string per provider, pool, tenant and
    launcher; a node's request and external id are its own and are not interned (each
    would be one insertion into the interpreter's table of interned strings and one
    deletion, per node: that churn doubled the table once after some thousand nodes)."""
    unique = uuid.uuid4().hex
    record = dict(NODEPOOL_NODE, allocated_to=f"100-{unique}", external_id=f"main-{unique}",
                  tenant_name="tenant-1")
    summary = decode_summary("0000000001", _dump(record), _Stat())
    assert summary.provider is sys.intern("k8s") and summary.pool is sys.intern("main")
    assert summary.tenant_name is sys.intern("tenant-1")
    assert summary.allocated_to == f"100-{unique}"
    assert summary.external_id == f"main-{unique}"
    for value in (f"100-{unique}", f"main-{unique}"):  # an equal string, a new object
        assert sys.intern(value) is value, f"{value} was interned"


@pytest.mark.parametrize("change, key", [
    ({"tenant_name": ["a"]}, "tenant_name"),
    ({"declined_by": [["x"]]}, "declined_by"),
    ({"node_types": "small"}, "node_types"),
    ({"requestor": 5}, "requestor"),
    ({"relative_priority": "1"}, "relative_priority"),
    ({"relative_priority": True}, "relative_priority"),
    ({"state_time": -1}, "state_time"),
    ({"nodes": [1]}, "nodes"),
    ({"state": ["requested"]}, "state"),
    ({"node_types": ["small"] * (records.MAX_NODE_TYPES + 1)}, "nodes"),
])
def test_malformed_requests(change: dict[str, Any], key: str) -> None:
    with pytest.raises(Malformed) as info:
        request_codec.decode("100-0000000001", _dump({**ZUUL_REQUEST, **change}))
    assert key in info.value.reason


@pytest.mark.parametrize("change, key", [
    ({"provider": ["a"]}, "provider"),
    ({"pool": {"a": 1}}, "pool"),
    ({"type": {"small": 1}}, "type"),
    ({"type": ["small", 3]}, "type"),
    ({"state": 3}, "state"),
    ({"state": "exploded"}, "state"),
    ({"allocated_to": 12}, "allocated_to"),
    ({"resources": {"cores": math.nan}}, "resources"),
    ({"resources": {"ram": -math.inf}}, "resources"),
    ({"resources": {"ram": -1}}, "resources"),
    ({"resources": [1]}, "resources"),
    ({"hold_expiration": "soon"}, "hold_expiration"),
])
def test_malformed_nodes(change: dict[str, Any], key: str) -> None:
    raw = _dump({**NODEPOOL_NODE, **change})
    for decode in (lambda: node_codec.decode("0000000001", raw),
                   lambda: decode_summary("0000000001", raw, _Stat())):
        with pytest.raises(Malformed) as info:
            decode()
        assert key in info.value.reason


@pytest.mark.parametrize("raw, reason", [
    (b"", "empty"),
    (b"[" * 200_000, "nested too deeply"),
    (b'{"a":' * 40_000, "nested too deeply"),
    (b"\xff\xfe{}", "UTF-8"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"state": "ready", "x": "' + b"y" * records.MAX_RECORD_BYTES + b'"}', "bytes"),
])
def test_malformed_bytes(raw: bytes, reason: str) -> None:
    for decode in (records.decode_node, records.decode_request):
        with pytest.raises(Malformed) as info:
            decode(raw)
        assert reason in info.value.reason


def _nested(depth: int) -> bytes:
    """A node/request record whose requestor_data makes it `depth` levels deep, built as
    text: encoding such a value needs a deeper stack than reading it does."""
    inner = depth - 1
    opening = "".join('{"k":' if level % 2 == 0 else "[" for level in range(inner - 1))
    closing = "".join("}" if level % 2 == 0 else "]" for level in reversed(range(inner - 1)))
    return ('{"state": "ready", "attributes": {"x": 1}, "requestor_data": '
            + opening + "{}" + closing + "}").encode()


@pytest.mark.parametrize("depth", [records.MAX_DEPTH + 1, 200, 982])
def test_valid_json_nested_beyond_the_limit_is_malformed(depth: int) -> None:
    # Closed, valid JSON the parser accepts, but nested so deep that writing it back (on
    # a deeper stack than the reader's) could hit the interpreter's recursion limit.
    raw = _nested(depth)
    for decode in (records.decode_node, records.decode_request, records.load_json):
        with pytest.raises(Malformed) as info:
            decode(raw)
        # The parser's own limit may come first, on this (deeper) stack.
        assert "nested" in info.value.reason


def test_records_up_to_the_depth_limit_and_wide_ones_decode() -> None:
    raw = _nested(records.MAX_DEPTH)
    decoded = records.load_json(raw)
    assert decoded == json.loads(raw)
    assert json.loads(json.dumps(decoded)) == decoded  # what is accepted can be written
    # Many brackets side by side are not depth: only nesting counts.
    wide = {"state": "ready", "attributes": {"lists": [[] for _ in range(5000)]}}
    assert records.decode_node(json.dumps(wide).encode()) == wide


HUGE = "9" * 400


@pytest.mark.parametrize("number, problem", [
    ("1e400", "1e400 is beyond the range of a float"),
    ("-1e400", "-1e400 is beyond the range of a float"),
    ("1" + "0" * 400 + ".5", "beyond the range of a float"),
    (HUGE, "an integer of 400 digits"),
    ("-" + HUGE, "an integer of 400 digits"),
    ("NaN", "NaN is not a number"),
    ("Infinity", "Infinity is not a number"),
    ("-Infinity", "-Infinity is not a number"),
])
def test_numbers_out_of_range_are_malformed_wherever_they_are(number: str,
                                                              problem: str) -> None:
    # Read as inf or a huge int, such a number stopped views (OverflowError, a non-JSON
    # `Infinity`) and the breaker wherever a record kept it, opaque keys included.
    for where, text in (
            ("created_time", f'{{"state": "ready", "created_time": {number}}}'),
            ("conditions[1].last_transition_time",
             '{"state": "ready", "conditions": [{"type": "Launched"}, '
             f'{{"type": "Ready", "last_transition_time": {number}}}]}}'),
            ("requestor_data.span_info.trace_id",
             f'{{"state": "requested", "requestor_data": {{"span_info": {{"trace_id":'
             f' {number}}}}}}}'),
            ("future_key[2]", f'{{"state": "ready", "future_key": [1, 2, {number}]}}')):
        for decode in (records.decode_node, records.decode_request, records.load_json):
            with pytest.raises(Malformed) as info:
                decode(text.encode())
            assert info.value.reason.startswith(f"{where}: "), info.value.reason
            assert problem in info.value.reason and len(info.value.reason) < 200
    with pytest.raises(Malformed) as info:
        records.load_json(number.encode())
    assert problem in info.value.reason


def test_numbers_up_to_the_bounds_decode() -> None:
    # Zuul's 128-bit trace ids and any integer of up to 308 digits, floats up to the
    # largest finite one, tiny floats (read as 0.0).
    longest = int("9" * 308)
    raw = json.dumps({"state": "ready", "a": 2 ** 128, "b": longest, "c": -longest,
                      "d": 1.7976931348623157e308, "e": -1.7e308}).encode()
    data = records.decode_node(raw + b"")
    assert data["a"] == 2 ** 128 and data["b"] == longest and data["d"] > 1e308
    assert records.load_json(b"[1e-400]") == [0.0]
    assert all(math.isfinite(float(v)) for v in data.values() if not isinstance(v, str))
    with pytest.raises(Malformed):
        records.load_json(str(longest * 10).encode())


@pytest.mark.parametrize("change, key", [
    ({"created_time": 1e300}, "created_time"),
    ({"state_time": 253402300800}, "state_time"),  # year 10000
    ({"conditions": [{"type": "Ready", "last_transition_time": -1.0}]}, "conditions"),
    ({"conditions": [{"type": "Ready", "last_transition_time": 1.7e308}]}, "conditions"),
    ({"conditions": [{"type": "Ready", "last_transition_time": "now"}]}, "conditions"),
    ({"conditions": [{"type": ["Ready"]}]}, "conditions"),
    ({"conditions": ["Ready"]}, "conditions"),
    ({"conditions": {"Ready": 1}}, "conditions"),
])
def test_times_beyond_a_date_and_odd_conditions_are_malformed(
        change: dict[str, Any], key: str) -> None:
    # Times are shown as dates and subtracted from each other (a phase's duration):
    # -1.7e308 and 1.7e308 gave an infinite duration, 1e300 no date at all.
    with pytest.raises(Malformed) as info:
        records.decode_node(_dump({**NODEPOOL_NODE, **change}))
    assert key in info.value.reason
    if key != "conditions":
        with pytest.raises(Malformed):
            records.decode_request(_dump({**ZUUL_REQUEST, **change}))


@pytest.mark.parametrize("raw, reason", [
    (b'{"id": "p", "supported_labels": 5}', "supported_labels must be a list"),
    (b'{"id": "p", "supported_labels": "small"}', "supported_labels must be a list"),
    (b'{"id": "p", "supported_labels": [["small"]]}', "supported_labels must be a list"),
    (b'{"id": "p", "supported_labels": ' + b"[" * 100 + b"]" * 100 + b"}", "nested"),
    (b'{"id": "p", "priority": 1e400}', "priority: 1e400"),
    (b'{"id": "p", "priority": "high"}', "priority must be an integer"),
    (b'{"id": "p", "paused": "no"}', "paused must be true or false"),
    (b'{"id": 5}', "id must be a string"),
    (b'{"provider_name": ["fake"]}', "provider_name must be a string"),
    (b'["pool"]', "expected a JSON object"),
])
def test_malformed_components_are_skipped_and_reported_once(
        raw: bytes, reason: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    records.REPORTS.clear()
    for _ in range(3):
        assert decode_component("pool", "evil-0000000001", raw, version=4) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        f"Skipping malformed component {paths.COMPONENTS}/pool/evil-0000000001: ")
    assert reason in lines[0]
    good = decode_component("pool", "p-1", _dump({
        "id": "p", "supported_labels": ["small"], "priority": 100, "paused": False,
        "provider_name": "fake", "name": "main", "hostname": "h", "state": "running",
        "kind": "pool", "model_api": 0, "version": "1.0", "future": [1.5]}))
    assert good is not None and good.supported_labels == {"small"}


@pytest.mark.parametrize("batch, reason", [
    ({"time": 1.0}, "expected a JSON list"),
    ([1], "expected events as objects"),
    ([{"kind": "launched"}], "time must be"),
    ([{"time": 1e300}], "time must be"),
    ([{"time": -1}], "time must be"),
    ([{"time": True}], "time must be"),
    ([{"time": 1.0, "node": 5}], "node must be a string"),
])
def test_malformed_event_batches(batch: Any, reason: str) -> None:
    with pytest.raises(Malformed) as info:
        records.check_events(batch)
    assert reason in info.value.reason
    assert records.check_events([{"time": 1.0, "kind": "x", "extra": [1]}])


def test_load_text() -> None:
    assert records.load_text(b" np-1\n", 10) == "np-1"
    for raw, reason in ((b"x" * 11, "11 bytes"), (b"\xff", "not UTF-8")):
        with pytest.raises(Malformed) as info:
            records.load_text(raw, 10)
        assert reason in info.value.reason


def test_clip_keeps_short_text_and_says_how_long_the_rest_was() -> None:
    assert records.clip("kube-system") == "kube-system"
    clipped = records.clip("a" * 200_000)
    assert len(clipped) < 120 and clipped.endswith("(200000 characters)")


def test_parse_reports_once_per_version(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    raw = _dump({"state": 3})
    for _ in range(3):
        assert node_codec.parse("0000000077", raw, version=1) is None
    assert node_codec.parse("0000000077", raw, version=2) is None
    lines = [r.getMessage() for r in caplog.records if "0000000077" in r.getMessage()]
    assert len(lines) == 2 and "/nodepool/nodes/0000000077" in lines[0]


def test_malformed_log_is_bounded_and_forgets() -> None:
    seen: list[tuple[str, str]] = []
    report = MalformedLog(logging.getLogger("test"), limit=10)
    report.add_listener(lambda what, path: seen.append((what, path)))
    for index in range(100):
        report.report("node", f"/n/{index}", 1, "bad")
    assert len(report._seen) == 10 and report.reported == 100 and len(seen) == 100
    report.report("node", "/n/99", 1, "bad")
    assert report.reported == 100
    report.forget("/n/99")
    report.report("node", "/n/99", 1, "bad")
    assert report.reported == 101


# -- property-based ----------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)
_keys = sorted(set(ZUUL_REQUEST) | set(NODEPOOL_NODE) | {"nodes", "launcher", "comment"})
# Objects with the protocol's keys and random values find far more type confusions than
# random objects, which rarely name a key the decoders read.
_records = st.dictionaries(st.sampled_from(_keys), _json, max_size=10) | \
    st.fixed_dictionaries({"state": st.sampled_from(["ready", "requested", "used", 1, None])},
                          optional={k: _json for k in _keys if k != "state"})

DECODERS: list[Callable[[bytes], Any]] = [
    records.decode_node,
    records.decode_request,
    lambda raw: node_codec.decode("0000000001", raw),
    lambda raw: request_codec.decode("100-0000000001", raw),
    lambda raw: decode_summary("0000000001", raw, _Stat()),
]


def _decodes_or_malformed(raw: bytes) -> None:
    for decode in DECODERS:
        try:
            decode(raw)
        except Malformed:
            pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records | _json)
def test_random_json_is_a_record_or_malformed(value: Any) -> None:
    _decodes_or_malformed(json.dumps(value).encode())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_are_a_record_or_malformed(raw: bytes) -> None:
    _decodes_or_malformed(raw)


@settings(max_examples=200, deadline=None)
@given(_records)
def test_accepted_records_round_trip(value: dict[str, Any]) -> None:
    raw = json.dumps(value).encode()
    try:
        node = node_codec.decode("0000000001", raw)
    except Malformed:
        return
    # What the gate accepts is strict JSON again (no NaN, no infinity).
    json.dumps(node.to_dict(), allow_nan=False)
    # Whatever the strict decoder accepts, the writer can write back and read again.
    again = node_codec.decode("0000000001", node_codec.encode(node))
    assert again.to_dict() == node.to_dict()


# -- the fast parser and the strict one agree ----------------------------------------------

def _strict_value(raw: bytes) -> tuple[str, Any]:
    """What the standard library's checked parser alone makes of `raw`."""
    try:
        return "ok", records._strict(raw)
    except Malformed as exc:
        return "malformed", exc.reason


def _gate_value(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", records.load_json(raw)
    except Malformed as exc:
        return "malformed", exc.reason


def _typed(value: Any) -> Any:
    """`value` with each number's type beside it: 1 and 1.0 are equal but not the same."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    return (type(value).__name__, value)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records | _json)
def test_the_gate_reads_every_value_as_the_strict_parser_does(value: Any) -> None:
    raw = json.dumps(value).encode()
    got, want = _gate_value(raw), _strict_value(raw)
    if want[0] == "malformed":
        assert got[0] == "malformed"
    else:
        assert got[0] == "ok" and _typed(got[1]) == _typed(want[1])


@pytest.mark.parametrize("number", [
    2 ** 63 - 1, 2 ** 63, -(2 ** 63), -(2 ** 63) - 1, 2 ** 64 - 1, 2 ** 64, 10 ** 18 - 1,
    10 ** 18, 10 ** 19, -(10 ** 19), 2 ** 128 - 1, -(2 ** 127)])
def test_integers_beyond_64_bits_stay_exact_integers(number: int) -> None:
    """The fast parser reads integers beyond 64 bits as floats; such text goes to the
    strict one, so a 128-bit trace id written back is the id Zuul wrote."""
    raw = json.dumps({"state": "requested", "requestor_data": {
        "span_info": {"trace_id": number, "ids": [number, str(number)]}}}).encode()
    data = records.decode_request(raw)
    span = data["requestor_data"]["span_info"]
    assert type(span["trace_id"]) is int and span["trace_id"] == number
    assert span["ids"] == [number, str(number)]
    written = request_codec.encode(request_codec.decode("100-0000000001", raw))
    assert json.loads(written)["requestor_data"] == json.loads(raw)["requestor_data"]


@pytest.mark.parametrize("raw, value", [
    (b'{"comment": "\\ud800"}', {"comment": "\ud800"}),      # a lone surrogate escape
    (b'{"a": [1, 2.5, -0, -0.0, 1E5, 1e-5, 0.1e-400]}',
     {"a": [1, 2.5, 0, -0.0, 1e5, 1e-5, 0.0]}),
    (b' \t{"a": "caf\\u00e9", "b": "caf\xc3\xa9"}\n ', {"a": "caf\u00e9", "b": "caf\u00e9"}),
])
def test_what_only_one_parser_takes_reads_the_same(raw: bytes, value: Any) -> None:
    assert _typed(records.load_json(raw)) == _typed(value)
    assert _gate_value(raw) == _strict_value(raw)


@pytest.mark.parametrize("raw", [
    b"\xef\xbb\xbf{}", b'{"a": NaN}', b'{"a": 1e999}', b'{"a": 1} x', b'{"a": "\x01"}',
    b'"\xff"', b"[" * 65 + b"]" * 65, b"[" * 2000 + b"]" * 2000, b'{"a": ' + b"9" * 309 + b"}",
])
def test_what_the_strict_parser_refuses_is_refused_with_its_reason(raw: bytes) -> None:
    got = _gate_value(raw)
    assert got[0] == "malformed"
    if raw.count(b"[") <= records.MAX_DEPTH or raw.count(b"[") > 1000:
        assert got == _strict_value(raw)
