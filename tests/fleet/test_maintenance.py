"""Maintenance windows: the cron parser, load-time validation naming the place, and a
pool worker that pauses and resumes its pool on time by the injected clock (stepped: one
pass at each moment)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.config.cron import Cron, parse_duration
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ZkClient
from tests.config.common import assert_problem, at, base, load, prefix
from tests.helpers import ZkConnection
from tests.launcher.requests.support import WorkerDeps
from tests.launcher.requests.test_pool_worker import worker_for
from tests.launchers import make_config


def ts(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_cron_searches() -> None:
    cron = Cron.parse("30 2 * * sat,sun")
    assert cron.next_after(ts("2024-06-05T12:00:00+00:00")) == ts("2024-06-08T02:30:00+00:00")
    assert cron.last_at_or_before(ts("2024-06-08T02:30:00+00:00")) == \
        ts("2024-06-08T02:30:00+00:00")
    assert cron.last_at_or_before(ts("2024-06-08T02:29:00+00:00")) == \
        ts("2024-06-02T02:30:00+00:00")
    steps = Cron.parse("*/20 9-17/4 * * *")
    assert steps.minutes == {0, 20, 40} and steps.hours == {9, 13, 17}
    # Day of month and day of week both restricted: either matches (Vixie cron).
    either = Cron.parse("0 0 1 * mon")
    assert either.next_after(ts("2024-06-01T00:00:00+00:00")) == ts("2024-06-03T00:00:00+00:00")
    # 7 is Sunday too; a schedule in a time zone follows its daylight saving time.
    assert Cron.parse("0 0 * * 7").weekdays == {0}
    berlin = Cron.parse("0 2 * * *", "Europe/Berlin")
    assert berlin.next_after(ts("2024-06-30T12:00:00+00:00")) == ts("2024-07-01T02:00:00+02:00")
    assert berlin.next_after(ts("2024-01-10T00:00:00+00:00")) == ts("2024-01-10T02:00:00+01:00")
    assert Cron.parse("0 0 30 2 *").next_after(0) is None


@pytest.mark.parametrize("text,fragment", [
    ("* * * *", "expected 5 fields"), ("60 * * * *", "minute: 60 is outside 0-59"),
    ("* * * foo *", "month: 'foo' is not a number"), ("5-1 * * * *", "runs backwards"),
    ("*/0 * * * *", "step '0'"), ("1,,2 * * * *", "empty list item"),
])
def test_cron_errors(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Cron.parse(text)


def test_durations() -> None:
    assert parse_duration(90) == 90 and parse_duration("2h") == 7200
    assert parse_duration("1h30m") == 5400 and parse_duration("1d") == 86400
    for bad in ("", "2x", 0, "h", True):
        with pytest.raises(ValueError):
            parse_duration(bad)


@pytest.mark.parametrize("window,key,fragment", [
    ({"schedule": "0 25 * * *", "duration": "1h"}, "schedule", "hour: 25 is outside"),
    ({"schedule": "0 2 * * *", "duration": "soon"}, "duration", "not a duration"),
    ({"schedule": "0 2 * * *", "duration": "1h", "timezone": "Mars/Olympus"}, "timezone",
     "unknown time zone"),
    ({"schedule": "0 2 * * *", "duration": "1h", "action": "reboot"}, "action",
     "expected one of pause, drain"),
    ({"schedule": "0 2 * * *"}, "duration", "required key is missing"),
])
def test_invalid_windows_name_the_place(window: dict[str, Any], key: str,
                                        fragment: str) -> None:
    data = base()
    at(data, "pool")["maintenance"] = [window]
    assert_problem(data, f"{prefix('pool')}.maintenance[0].{key}", fragment)


def test_window_in_force_and_next() -> None:
    data = base()
    at(data, "pool")["maintenance"] = [
        {"schedule": "0 2 * * sun", "duration": "2h", "action": "drain"},
        {"schedule": "0 1 * * *", "duration": 1800}]
    pool = load(data).providers["k8s"].pools["main"]
    sunday = ts("2024-06-09T02:30:00+00:00")
    state = maintenance.active(pool, sunday)
    assert state is not None and state.action == "drain" and state.source == "maintenance"
    assert state.time == ts("2024-06-09T02:00:00+00:00")
    assert maintenance.active(pool, ts("2024-06-09T04:00:00+00:00")) is None
    start, end, window = maintenance.next_window(pool, sunday) or (0, 0, None)
    assert (start, end) == (ts("2024-06-10T01:00:00+00:00"), ts("2024-06-10T01:30:00+00:00"))
    assert maintenance.next_change(pool, sunday) == ts("2024-06-09T04:00:00+00:00")


MAINTAINED = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        maintenance:
          - schedule: "0 23 * * *"
            duration: 1h
            action: pause
        labels:
          - name: small
            type: namespace
"""


def paused_components(client: KazooClient) -> list[bool]:
    out = []
    for name in client.get_children(paths.POOL_COMPONENTS):
        out.append(bool(json.loads(client.get(f"{paths.POOL_COMPONENTS}/{name}")[0])
                        .get("paused")))
    return out


def test_window_pauses_and_resumes_on_time(zk: ZkConnection, zkc: ZkClient,
                                           kazoo_client: KazooClient) -> None:
    """One pass of the pool worker at each moment the clock is moved to."""
    clock = ManualClock(ts("2024-06-05T22:00:00+00:00"))
    deps = WorkerDeps(zkc, make_config(zk, MAINTAINED), clock)
    worker, launches = worker_for(deps)

    def state(request_id: str) -> str | None:
        request = deps.requests.get(request_id)
        return request.state if request is not None else None

    first = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    assert state(first) == "fulfilled"
    clock.advance(3600 + 30)  # 23:00:30, inside the window
    worker.run_once()
    assert paused_components(kazoo_client) == [True]
    waiting = deps.submit(["small"])
    clock.advance(1800)  # 23:30:30, still inside: the request waits
    worker.run_once()
    assert paused_components(kazoo_client) == [True]
    request = deps.requests.get(waiting)
    assert request is not None and request.state == "requested" and not request.declined_by
    clock.advance(1800)  # 00:00:30, the window is over
    deadline = worker.run_once()
    launches.run_all()
    assert state(waiting) == "fulfilled"
    assert paused_components(kazoo_client) == [False]
    # The worker asks to be woken at the next window's start (23:00 the next day).
    assert deadline is not None
    assert deadline == pytest.approx(
        clock.monotonic() + ts("2024-06-06T23:00:00+00:00") - clock.time())
