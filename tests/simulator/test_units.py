"""Pure helpers: patches, quantities, protobuf decoding, the timer thread."""

from __future__ import annotations

import base64
import threading

import pytest

from nodepool_k8s.dev.simulator import errors, patch, protobuf
from nodepool_k8s.dev.simulator.timers import Scheduler
from nodepool_k8s.dev.simulator.validation import parse_quantity


def test_merge_patch() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}
    result = patch.merge_patch(target, {"a": {"b": None, "d": 3}, "l": [3], "x": None})
    assert result == {"a": {"c": 2, "d": 3}, "l": [3]}
    assert target == {"a": {"b": 1, "c": 2}, "l": [1, 2], "x": 1}  # input untouched


def test_strategic_merge_patch_merges_named_lists_and_drops_directives() -> None:
    target = {"spec": {"containers": [{"name": "a", "image": "1", "command": ["x"]},
                                      {"name": "b", "image": "2"}]}}
    body = {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "spec": {"containers": [{"name": "a", "image": "9"},
                                    {"name": "b", "$patch": "delete"},
                                    {"name": "c", "image": "3"}]}}
    result = patch.apply(patch.STRATEGIC, target, body)
    assert result == {"spec": {"containers": [{"name": "a", "image": "9", "command": ["x"]},
                                              {"name": "c", "image": "3"}]}}


def test_json_patch() -> None:
    target = {"metadata": {"labels": {"a/b": "1"}}, "items": [1, 2]}
    ops = [{"op": "add", "path": "/items/-", "value": 3},
           {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
           {"op": "test", "path": "/items/0", "value": 1},
           {"op": "copy", "from": "/items/0", "path": "/first"},
           {"op": "remove", "path": "/items/1"}]
    assert patch.apply(patch.JSON_PATCH, target, ops) == {
        "metadata": {"labels": {"a/b": "2"}}, "items": [1, 3], "first": 1}
    with pytest.raises(errors.ApiError) as info:
        patch.apply(patch.JSON_PATCH, target, [{"op": "test", "path": "/items/0", "value": 9}])
    assert info.value.code == 422
    with pytest.raises(errors.ApiError) as info:
        patch.apply("application/apply-patch+yaml", target, {})
    assert info.value.code == 415


@pytest.mark.parametrize("text,value", [
    ("1", 1), (2, 2), ("500m", 0.5), ("1Gi", 2 ** 30), ("10M", 10 ** 7), ("1e3", 1000),
    ("0.5", 0.5),
])
def test_quantities(text: object, value: float) -> None:
    assert float(parse_quantity(text)) == value  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["lots", "1Xi", "", True, None])
def test_bad_quantities(text: object) -> None:
    assert parse_quantity(text) is None


def _field(number: int, payload: bytes | int | str) -> bytes:
    """A tiny protobuf encoder for the test (varint and length-delimited fields)."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            byte, n = n & 0x7F, n >> 7
            out += bytes([byte | (0x80 if n else 0)])
            if not n:
                return out
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def test_protobuf_secret_roundtrip() -> None:
    meta = _field(1, "s") + _field(2, "") + _field(3, "ns") + \
        _field(11, _field(1, "app") + _field(2, "web"))
    secret = _field(1, meta) + _field(2, _field(1, "k") + _field(2, b"\x00\xff")) + \
        _field(3, "Opaque") + _field(5, 0)
    envelope = protobuf.MAGIC + _field(1, _field(1, "v1") + _field(2, "Secret")) + \
        _field(2, secret)
    assert protobuf.decode(envelope) == {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s", "namespace": "ns", "labels": {"app": "web"}},
        "data": {"k": base64.b64encode(b"\x00\xff").decode()}, "type": "Opaque"}


def test_protobuf_refuses_unknown_kinds_and_garbage() -> None:
    pod = protobuf.MAGIC + _field(1, _field(1, "v1") + _field(2, "Pod")) + _field(2, b"")
    with pytest.raises(errors.ApiError) as info:
        protobuf.decode(pod)
    assert info.value.code == 415
    with pytest.raises(errors.ApiError) as info:
        protobuf.decode(protobuf.MAGIC + b"\x0a\xff")
    assert info.value.code == 400


def test_scheduler_runs_callbacks_in_time_order() -> None:
    scheduler = Scheduler().start()
    done = threading.Event()
    order: list[str] = []

    def late() -> None:
        order.append("late")
        done.set()

    def broken() -> None:
        raise RuntimeError("a failing step does not stop the others")
    try:
        scheduler.call_later(0.2, late)
        scheduler.call_later(0.0, lambda: order.append("now"))
        scheduler.call_later(0.05, broken)
        assert done.wait(5)
        assert order == ["now", "late"]
    finally:
        scheduler.stop()
