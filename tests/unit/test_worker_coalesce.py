"""`launcher.worker.Worker`: wakes that arrive during a worker's `coalesce` gap after a pass
are served by one next pass, not one pass each (the cleanup and min-ready workers react to
every node change; in a burst that was five to seven passes per node, issue 15)."""

from __future__ import annotations

import threading

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK
from nodepool_k8s.launcher.worker import Worker


class Counting(Worker):
    def __init__(self, coalesce: float) -> None:
        super().__init__("Counting", SYSTEM_CLOCK, coalesce=coalesce)
        self.count = 0
        self.ran = threading.Event()

    def run_once(self) -> float | None:
        self.count += 1
        self.ran.set()
        return None


def test_wakes_during_the_gap_make_one_pass() -> None:
    worker = Counting(coalesce=2.0)
    worker.start()
    try:
        assert worker.ran.wait(15), "the first pass"
        worker.ran.clear()
        for _ in range(100):  # a burst of node events, all inside the gap
            worker.wake()
        assert worker.ran.wait(15), "the pass after the gap"
    finally:
        worker.stop()  # interrupts the next gap at once
        worker.join(10)
    assert not worker.alive
    assert worker.count == 2


def test_without_a_gap_a_wake_runs_the_next_pass_at_once() -> None:
    worker = Counting(coalesce=0.0)
    worker.start()
    try:
        assert worker.ran.wait(15), "the first pass"
        worker.ran.clear()
        worker.wake()
        assert worker.ran.wait(15), "the woken pass"
    finally:
        worker.stop()
        worker.join(10)
    assert worker.count >= 2
