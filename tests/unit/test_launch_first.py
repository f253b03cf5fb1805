"""Launch first's signals without ZooKeeper: a launch counts from its submission to the
launch pool until its pool worker was told it returned; the listeners hear when the last
one returned and when a pool begins to wait; anything unknown answers "do not defer"; the
bound is an engine setting that 0 switches off."""

from __future__ import annotations

import threading

import pytest

from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.launcher.requests.launch import LaunchEnd, LaunchOutcome, LaunchPool
from nodepool_k8s.launcher.settings import EngineSettings
from tests.helpers import wait_for


def test_a_launch_counts_until_its_pool_worker_was_told() -> None:
    first = LaunchFirst()
    heard: list[bool] = []
    first.subscribe(lambda: heard.append(first.launching))
    pool = LaunchPool("p", 1, first)
    release = threading.Event()
    told = threading.Event()
    seen_while_told: list[bool] = []

    def done() -> None:
        seen_while_told.append(first.launching)
        told.set()

    def launch() -> LaunchOutcome:
        release.wait(30)
        return LaunchOutcome(LaunchEnd.READY)

    try:
        pool.submit(launch, done)
        pool.submit(launch, done)  # queued behind the first: counts too
        assert first.launching and first.may_defer("p")
        release.set()
        wait_for(lambda: not first.launching)
        assert told.is_set()
        # The pool worker's wake ran while the launch still counted; the listeners heard
        # once, when none was left.
        assert seen_while_told[:1] == [True] and heard == [False]
        assert not first.may_defer("p")
    finally:
        release.set()
        pool.shutdown(wait=True)


def test_a_pool_that_begins_to_wait_is_heard_and_stops_the_deferral() -> None:
    others: set[str] = set()
    first = LaunchFirst(lambda provider: provider in others)
    heard: list[str] = []
    first.subscribe(lambda: heard.append("x"))
    first.launch_queued()
    assert first.may_defer("p") and first.may_defer("q")
    first.set_waiting("pool-a", "p", True)
    first.set_waiting("pool-a", "p", True)  # still waiting: not heard again
    assert heard == ["x"] and not first.may_defer("p") and first.may_defer("q")
    first.set_waiting("pool-a", "p", False)
    assert first.may_defer("p") and heard == ["x"]
    # Another launcher's pool of that provider is paused.
    others.add("q")
    assert not first.may_defer("q")
    # Unknown: never deferred.
    assert not first.may_defer(None)
    first.launch_returned()
    assert not first.may_defer("p") and heard == ["x", "x"]


def test_the_bound_defaults_to_a_wait_and_may_be_switched_off() -> None:
    assert EngineSettings().delete_defer_max == 10.0
    assert EngineSettings.from_env(
        {"NODEPOOL_K8S_DELETE_DEFER_MAX": "0"}).delete_defer_max == 0
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_DELETE_DEFER_MAX"):
        EngineSettings.from_env({"NODEPOOL_K8S_DELETE_DEFER_MAX": "-1"})
