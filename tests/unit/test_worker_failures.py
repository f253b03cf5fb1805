"""`launcher.worker.Worker`: a pass that keeps failing the same way is logged with its
traceback once, then as one line with a count per `REPEAT_LOG_INTERVAL`; a different
failure, or one after a good pass, is logged in full again (a poisoned pass retried every
second once wrote a 37-line traceback per second)."""

from __future__ import annotations

import logging
import threading

import pytest

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, ManualClock
from nodepool_k8s.launcher import worker as worker_module
from nodepool_k8s.launcher.worker import REPEAT_LOG_INTERVAL, Worker


class Failing(Worker):
    def run_once(self) -> float | None:
        raise AssertionError("not used: the test drives _failed directly")


def _fail(worker: Failing, exc: Exception) -> None:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - as the loop catches it
        worker._failed(caught)


def test_repeated_failures_are_counted_not_dumped(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    worker = Failing("Failing", clock)
    caplog.set_level(logging.DEBUG, logger="nodepool_k8s.Failing")
    for _ in range(30):
        _fail(worker, ValueError("poison"))
        clock.advance(1.0)
    full = [r for r in caplog.records if r.exc_info]
    assert len(full) == 1 and "pass failed" in full[0].getMessage()
    assert len(caplog.records) == 1
    clock.advance(REPEAT_LOG_INTERVAL)
    _fail(worker, ValueError("poison"))
    assert len(caplog.records) == 2
    assert "still failing (30 more times" in caplog.records[-1].getMessage()
    assert caplog.records[-1].exc_info is None
    _fail(worker, KeyError("other"))  # a new failure: in full
    assert caplog.records[-1].exc_info is not None
    assert worker.failures == 32


class Scripted(Worker):
    """Fails, succeeds, fails the same way, then idles (through the real loop)."""

    def __init__(self) -> None:
        super().__init__("Scripted", SYSTEM_CLOCK)
        self.script: list[Exception | None] = [ValueError("poison"), None,
                                               ValueError("poison")]
        self.done = threading.Event()

    def run_once(self) -> float | None:
        if not self.script:
            self.done.set()
            return None
        step = self.script.pop(0)
        if step is not None:
            raise step
        self.wake()  # go on at once after the good pass
        return None


def test_a_good_pass_resets_the_memory(caplog: pytest.LogCaptureFixture,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "ERROR_BACKOFF", 0.01)
    caplog.set_level(logging.DEBUG, logger="nodepool_k8s.Scripted")
    worker = Scripted()
    worker.start()
    try:
        assert worker.done.wait(15), "the scripted passes"
    finally:
        worker.stop()
        worker.join(10)
    assert sum(1 for r in caplog.records if r.exc_info) == 2
    assert worker.failures == 2
