"""Pool-state entries (`/nodepool_k8s/pool-state/<target>`) are decoded strictly.

Aspects: a well-formed entry decodes (missing optional fields default, the target is
unquoted); every field read is type- and range-checked, and anything wrong (an action
that is not one of ours, a `reason`/`by` that is not a string, a `time` that is not a
finite number of seconds within 1970 .. year 9999) raises `records.Malformed`, never
another error, so the CLI and the launchers can always skip it.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from nodepool_k8s.core import records
from nodepool_k8s.zk import pool_state
from nodepool_k8s.zk.pool_state import PoolState, decode


def _raw(**fields: Any) -> bytes:
    return json.dumps({"action": "pause", **fields}).encode()


def test_well_formed_entry() -> None:
    raw = _raw(reason="upgrade", by="ops@host", time=1700000000.5)
    assert decode("fake%2Fmain", raw) == PoolState(
        target="fake/main", action="pause", reason="upgrade", by="ops@host",
        time=1700000000.5)


def test_optional_fields_default() -> None:
    assert decode("fake", b'{"action": "drain"}') == PoolState(target="fake", action="drain")
    state = decode("fake", _raw(reason=None, by=None, time=None))
    assert (state.reason, state.by, state.time) == ("", "", 0.0)


def test_time_bounds_are_accepted_and_representable() -> None:
    for when in (0, 1, pool_state.MAX_TIME):
        state = decode("fake", _raw(time=when))
        assert isinstance(state.time, float)
        dt.datetime.fromtimestamp(state.time, dt.timezone.utc)  # what pool-state shows


@pytest.mark.parametrize("raw,reason", [
    (_raw(time="yesterday"), "time must be"),  # was ValueError from float()
    (_raw(time=1e300), "time must be"),  # was OverflowError when shown as a date
    (_raw(time=10 ** 400), "time: an integer of 401 digits"),  # too big for a float
    (_raw(time=pool_state.MAX_TIME + 1), "time must be"),
    (_raw(time=-1), "time must be"),
    (_raw(time=True), "time must be"),
    (_raw(time=[1]), "time must be"),
    (_raw(time={}), "time must be"),
    (b'{"action": "pause", "time": NaN}', "time: NaN is not a number"),
    (b'{"action": "pause", "time": Infinity}', "time: Infinity is not a number"),
    (b'{"action": "pause", "time": -Infinity}', "time: -Infinity is not a number"),
    (_raw(reason=5), "reason must be a string"),
    (_raw(reason=["a"]), "reason must be a string"),
    (_raw(reason=False), "reason must be a string"),
    (_raw(by={"user": "x"}), "by must be a string"),
    (_raw(by=0), "by must be a string"),
    (json.dumps({"action": ["pause"]}).encode(), "expected an action"),
    (json.dumps({"action": {"pause": 1}}).encode(), "expected an action"),
    (json.dumps({"action": "stop"}).encode(), "expected an action"),
    (b'{"reason": "no action"}', "expected an action"),
    (b'["pause"]', "expected a JSON object"),
    (b"not json", "not JSON"),
    (b"", "empty znode data"),
])
def test_malformed_entries(raw: bytes, reason: str) -> None:
    with pytest.raises(records.Malformed) as info:
        decode("fake", raw)
    assert info.value.reason.startswith(reason), info.value.reason
    assert len(info.value.reason) < 200  # a short line for the log and the CLI warning
