"""Our own pool records as someone else may have written them: the circuit-breaker record.

Aspects: an unusable label entry is dropped when read (that label's breaker starts afresh)
and reported once with its path; the next update rewrites the record without it; a record
that is no JSON object at all is replaced by the update.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import records
from nodepool_k8s.zk import pool_status
from nodepool_k8s.zk.client import ZkClient

GOOD = {"state": "open", "failures": 3, "trips": 1, "until": 1e9, "since": 1.0,
        "config": "abc", "reason": "ImagePullBackOff", "message": "m"}
BAD: dict[str, Any] = {
    "a-string": "x",
    "a-list": [1],
    "failures-text": {**GOOD, "failures": "many"},
    "failures-bool": {**GOOD, "failures": True},
    "until-text": {**GOOD, "until": "soon"},
    "state-unknown": {**GOOD, "state": "half-open"},
    "config-number": {**GOOD, "config": 5},
}


@pytest.fixture(autouse=True)
def fresh_reports() -> None:
    records.REPORTS.clear()


def test_unusable_entries_are_dropped_and_reported_once(
        caplog: pytest.LogCaptureFixture) -> None:
    raw = json.dumps({"good": GOOD, **BAD}).encode()
    with caplog.at_level(logging.WARNING, logger="nodepool_k8s.core.records"):
        for _ in range(3):
            assert pool_status.decode_breakers("fake.main", raw, None) == {"good": GOOD}
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == len(BAD)
    for label in BAD:
        assert sum(f"{pool_status.POOL_BREAKERS}/fake.main (label {label})" in m
                   for m in messages) == 1


def test_update_rewrites_the_record_without_unusable_entries(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    path = pool_status.breaker_path("fake", "main")
    kazoo_client.create(path, json.dumps({"good": GOOD, **BAD}).encode(), makepath=True)

    def touch(data: dict[str, Any]) -> bool:
        assert set(data) == {"good"}
        data["other"] = {"state": "closed", "failures": 1, "trips": 0, "config": "x"}
        return True

    pool_status.update_breaker(zkc, "fake", "main", touch)
    stored = json.loads(kazoo_client.get(path)[0])
    assert set(stored) == {"good", "other"}


@pytest.mark.parametrize("raw", [
    b"[1, 2]", b"{not json", b'{"a":' * 5000,
    # A 400-digit integer: an OverflowError from every update stopped the pool's breaker
    # bookkeeping for good.
    b'{"small": {"state": "open", "until": ' + b"9" * 400 + b"}}",
])
def test_update_replaces_a_record_that_is_no_object(
        zkc: ZkClient, kazoo_client: KazooClient, raw: bytes) -> None:
    path = pool_status.breaker_path("fake", "main")
    kazoo_client.create(path, raw, makepath=True)

    def count(data: dict[str, Any]) -> bool:
        data["small"] = {"failures": 1}
        return True

    pool_status.update_breaker(zkc, "fake", "main", count)
    assert json.loads(kazoo_client.get(path)[0]) == {"small": {"failures": 1}}


GOOD_STATUS = {"model": 1, "id": "h-PoolWorker.fake-main-1", "hostname": "h",
               "provider": "fake", "pool": "main", "priority": 100, "labels": ["small"],
               "nodes": {"ready": 2}, "launches_in_progress": 0, "requests_queued": 1,
               "requests_handled": 0, "usage": [{"scope": "pool", "resource": "instances",
                                                 "used": 2, "limit": 5}],
               "targets": {}, "suspended": {}, "capacity": {},
               "conditions": [{"type": "Quota", "status": "True", "reason": "Ok"}]}


@pytest.mark.parametrize("change", [
    {"suspended": 5}, {"nodes": "x"}, {"nodes": {"ready": "2"}}, {"conditions": [1]},
    {"conditions": {"type": "Quota"}}, {"usage": "all"}, {"requests_queued": "1"},
    {"labels": "small"}, {"provider": ["fake"]},
    {"conditions": [{"type": "Quota", "last_transition": 1e300}]},
    {"conditions": [{"type": "Quota", "last_transition": -1.0}]},
    {"conditions": [{"type": "Quota", "reason": 5}]},
])
def test_pool_status_fields_its_readers_use_are_checked(change: dict[str, Any]) -> None:
    """One such record made /metrics and /pool-list answer 500 on every request (with a
    traceback each) and `nodepool pool-list` crash."""
    assert pool_status.decode_pool_status(
        "x", json.dumps(GOOD_STATUS).encode(), None) == GOOD_STATUS
    with pytest.raises(records.Malformed) as info:
        pool_status.decode_pool_status("x", json.dumps({**GOOD_STATUS, **change}).encode(),
                                       None)
    assert next(iter(change)) in info.value.reason


@pytest.mark.parametrize("number", [b"NaN", b"1e400", b"-Infinity", b"9" * 400])
def test_pool_status_numbers_out_of_range_are_malformed(number: bytes) -> None:
    """A NaN in a condition reached /pool-list as the non-JSON `NaN`: the status page
    stopped refreshing."""
    raw = json.dumps({**GOOD_STATUS, "conditions": [
        {"type": "Quota", "status": "True", "reason": "Ok", "last_transition": 0}]}).encode()
    for old in (b'"last_transition": 0', b'"requests_queued": 1'):
        key = old.split(b":")[0].strip(b'"').decode()
        with pytest.raises(records.Malformed) as info:
            pool_status.decode_pool_status("x", raw.replace(old, old[:-1] + number), None)
        assert key in info.value.reason


def test_the_cli_listing_leaves_malformed_status_out_and_says_so_once(
        zkc: ZkClient, kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    good = pool_status.status_path("good")
    bad = pool_status.status_path("bad")
    kazoo_client.create(good, json.dumps(GOOD_STATUS).encode(), makepath=True)
    kazoo_client.create(bad, json.dumps({**GOOD_STATUS, "suspended": 5}).encode())
    with caplog.at_level(logging.WARNING, logger="nodepool_k8s.core.records"):
        for _ in range(2):
            found = pool_status.read_all(zkc, pool_status.POOL_STATUS,
                                         pool_status.decode_pool_status)
            assert list(found) == ["good"]
    assert [r.getMessage() for r in caplog.records] == [
        f"Skipping malformed record {bad}: suspended must be an object"]
