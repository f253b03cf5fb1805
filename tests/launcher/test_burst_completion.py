"""Completion is not starved by a busy pool worker (issue 15).

Aspects: a request whose launch returned is fulfilled by the launch thread itself, while
its pool worker is still inside a pass (in a burst, the pass that accepts a long queue);
a request whose launches have not all returned is left to the pool worker.
"""

from __future__ import annotations

import threading

from nodepool_k8s.driver.base import LaunchSpec
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.launchers import LauncherFactory


class HeldWorker:
    """Holds the pool worker inside its next pass until released."""

    def __init__(self, worker: object) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        original = worker.run_once  # type: ignore[attr-defined]

        def held_pass() -> float | None:
            if not self.release.is_set():
                self.inside.set()
                self.release.wait(60)
            return original()  # type: ignore[no-any-return]

        worker.run_once = held_pass  # type: ignore[attr-defined]
        worker.wake()  # type: ignore[attr-defined]


def test_ready_node_fulfils_its_request_while_the_pool_worker_is_busy(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers()
    started, finish = threading.Event(), threading.Event()

    def slow_launch(spec: LaunchSpec) -> None:
        started.set()
        assert finish.wait(60)

    launcher.providers["fake"].on_launch = slow_launch  # type: ignore[attr-defined]
    request_id = zuul.submit(["small"])
    assert started.wait(30), "the launch did not start"
    worker = next(iter(launcher.pool_workers.values()))
    held = HeldWorker(worker)
    try:
        assert held.inside.wait(30), "the pool worker did not start a pass"
        finish.set()  # the launch returns while the worker is held inside its pass
        body = zuul.wait(request_id, timeout=30)
        assert body is not None and body["state"] == "fulfilled"
        assert not held.release.is_set()  # fulfilled without the pool worker
    finally:
        held.release.set()
        finish.set()


def test_multi_node_request_waits_for_every_launch(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers()
    first_started, finish_second = threading.Event(), threading.Event()
    launches: list[str] = []
    lock = threading.Lock()

    def launch(spec: LaunchSpec) -> None:
        with lock:
            launches.append(spec.node_id)
            second = len(launches) == 2
        if second:
            assert finish_second.wait(60)
        else:
            first_started.set()

    launcher.providers["fake"].on_launch = launch  # type: ignore[attr-defined]
    request_id = zuul.submit(["small", "small"])
    assert first_started.wait(30)
    # One launch returned, the other has not: the request stays pending...
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] in ("requested", "pending")
    finish_second.set()
    body = zuul.wait(request_id, timeout=30)
    # ...and is fulfilled with both nodes once the second returns.
    assert body is not None and body["state"] == "fulfilled"
    assert sorted(body["nodes"]) == sorted(launches)
