"""`together.Together`: a launch step's independent requests go out at once; the step ends
when every one of them has ended and raises the first failure in order."""

from __future__ import annotations

import threading
from typing import Iterator

import pytest

from nodepool_k8s.core.errors import LaunchCancelled, TemporaryError
from nodepool_k8s.driver.kubernetes.together import Together


@pytest.fixture
def together() -> Iterator[Together]:
    group = Together(4, "test-together")
    yield group
    group.stop()


def test_the_requests_of_a_step_go_out_at_once(together: Together) -> None:
    # Each request waits for the other two: one after the other, the first would time out.
    everyone = threading.Barrier(3, timeout=30)
    ran: list[str] = []

    def request(name: str) -> None:
        everyone.wait()
        ran.append(name)
    together.run([lambda: request("quota"), lambda: request("sa"), lambda: request("role")])
    assert sorted(ran) == ["quota", "role", "sa"]


def test_the_first_failure_in_order_is_raised_once_every_request_ended(
        together: Together) -> None:
    release = threading.Event()
    ended: list[str] = []

    def first() -> None:
        release.wait(30)
        ended.append("first")
        raise TemporaryError("first failed")

    def second() -> None:
        ended.append("second")
        raise TemporaryError("second failed")

    def third() -> None:
        try:
            release.set()  # the first ends only after this one ran
        finally:
            ended.append("third")
    with pytest.raises(TemporaryError, match="first failed"):
        together.run([first, second, third])
    assert sorted(ended) == ["first", "second", "third"]


def test_without_workers_they_go_one_after_the_other_and_stop_at_a_failure() -> None:
    group = Together(0, "test-inline")
    ran: list[str] = []

    def fails() -> None:
        ran.append("fails")
        raise TemporaryError("no")
    with pytest.raises(TemporaryError):
        group.run([lambda: ran.append("a"), fails, lambda: ran.append("never")])
    assert ran == ["a", "fails"]


def test_a_step_not_sent_at_once_goes_one_after_the_other_on_the_callers_thread(
        together: Together) -> None:
    threads: list[str] = []
    together.run([lambda: threads.append(threading.current_thread().name)] * 3,
                 at_once=False)
    assert threads == [threading.current_thread().name] * 3 and together.together == 0


def test_a_stopped_group_sends_nothing_more(together: Together) -> None:
    together.stop()
    ran: list[str] = []
    with pytest.raises(LaunchCancelled):
        together.run([lambda: ran.append("a"), lambda: ran.append("b")])
    assert ran == []
    together.run([lambda: ran.append("alone")])  # one request: the caller's own thread
    assert ran == ["alone"]
