"""The thread guard (nodepool_k8s/runtime/threads.py).

Aspects: a crashing body is logged with the thread's name and reported, then restarted
(RESTART), ends the daemon (STOP) or ends its thread (END); a body that returns is not
restarted; the stop event ends a RESTART guard during its backoff; a failing report does not
hide the crash; STOP without a stop callback is refused.
"""

from __future__ import annotations

import logging
import threading

import pytest

from nodepool_k8s.runtime import threads
from nodepool_k8s.runtime.stats import PROM_THREAD_CRASHES, Stats


def test_restart_after_a_crash_is_logged_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    stats = Stats()
    runs: list[int] = []
    done = threading.Event()

    def body() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise ValueError("boom")
        done.set()

    with caplog.at_level(logging.ERROR, logger="nodepool_k8s.runtime.threads"):
        thread = threads.start("t-restart", body, on_crash=threads.Crash.RESTART,
                               report=stats.thread_crashed, backoff=0)
        assert done.wait(10)
        thread.join(10)
    assert not thread.is_alive() and len(runs) == 3
    assert caplog.text.count("Thread t-restart crashed") == 2 and "ValueError: boom" in caplog.text
    assert stats.counters()[(PROM_THREAD_CRASHES, (("thread", "t-restart"),))] == 2


def test_stop_event_ends_a_restarting_guard() -> None:
    stopping = threading.Event()
    runs: list[int] = []

    def body() -> None:
        runs.append(1)
        stopping.set()
        raise RuntimeError("crash while stopping")

    thread = threads.start("t-stopping", body, on_crash=threads.Crash.RESTART,
                           stopping=stopping, backoff=3600)
    thread.join(10)
    assert not thread.is_alive() and runs == [1]


def test_stop_policy_stops_the_daemon() -> None:
    stopped = threading.Event()

    def body() -> None:
        raise KeyError("vital")

    def report(name: str) -> None:
        raise OSError("stats down")  # must not hide the crash nor skip the stop

    thread = threads.start("t-stop", body, on_crash=threads.Crash.STOP, report=report,
                           stop=stopped.set)
    assert stopped.wait(10)
    thread.join(10)
    assert not thread.is_alive()


def test_end_policy_and_normal_return_run_once() -> None:
    runs: list[str] = []
    for name, policy, fails in (("t-end", threads.Crash.END, True),
                                ("t-return", threads.Crash.RESTART, False)):
        def body(name: str = name, fails: bool = fails) -> None:
            runs.append(name)
            if fails:
                raise ValueError(name)
        thread = threads.start(name, body, on_crash=policy, backoff=0)
        thread.join(10)
        assert not thread.is_alive()
    assert runs == ["t-end", "t-return"]


def test_stop_policy_needs_a_callback() -> None:
    with pytest.raises(ValueError):
        threads.guard("t", lambda: None, on_crash=threads.Crash.STOP)


def test_a_fixed_pool_starts_all_its_threads_at_once() -> None:
    from nodepool_k8s.runtime.threads import fixed_pool

    def named() -> list[str]:
        return sorted(t.name for t in threading.enumerate() if t.name.startswith("fixed-test"))

    pool = fixed_pool(4, "fixed-test")
    try:
        assert named() == [f"fixed-test_{i}" for i in range(4)]
        gate = threading.Event()
        busy = [pool.submit(gate.wait) for _ in range(4)]
        assert len(named()) == 4  # overlapping work starts no thread
        gate.set()
        for future in busy:
            future.result(10)
    finally:
        pool.shutdown(wait=True)
    assert named() == []
