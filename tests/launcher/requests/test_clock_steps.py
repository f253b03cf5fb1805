"""The wall clock steps under a pool worker (chrony's `makestep`, a resumed VM, an
operator's `date -s`), one pass at a time: `ManualClock.step_wall` moves wall time alone.

A backward step stalls none of the worker's own schedules: reclaiming an idle node at
quota, the pool status's rate limit, the drift check and a circuit breaker's probe (a
paused request's retry after the cloud refused for quota and min-ready's back-off are
stepped in test_handler.py and test_min_ready.py). The cleanup worker's schedules under a
step are in tests/launcher/upkeep/test_clock_steps.py.
"""

from __future__ import annotations

import textwrap
from typing import Callable

import pytest

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import LaunchError
from nodepool_k8s.launcher.upkeep import disruption
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection
from tests.launcher.requests.support import SETTINGS, WorkerDeps
from tests.launcher.requests.test_pool_worker import idle, state, worker_for
from tests.launchers import make_config

MakeWorkerDeps = Callable[..., WorkerDeps]
HOUR = 3600.0


def test_backward_step_does_not_stall_reclaiming_at_quota(
        make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps(max_servers=1)
    worker, launches = worker_for(deps)
    spare = idle(deps, worker, launches, "other")
    deps.submit(["small"])
    worker.run_once()  # accepted, and waiting at the pool's limit
    worker.run_once()  # a pass that starts paused makes room
    assert deps.deletions == [(spare, "making room at quota")]
    deps.clock.step_wall(-HOUR)
    deps.clock.advance(SETTINGS.reclaim_interval)
    worker.run_once()
    assert len(deps.deletions) == 2


def test_backward_step_does_not_stall_the_pool_status(make_worker_deps: MakeWorkerDeps) -> None:
    deps = make_worker_deps()
    worker, launches = worker_for(deps)
    worker.run_once()
    assert worker.published_status is not None and worker.published_status["nodes"] == {}
    deps.clock.step_wall(-HOUR)
    request_id = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    assert state(deps, request_id) == model.RequestState.FULFILLED
    worker.run_once()
    assert worker.published_status["nodes"] == {}  # held back by the rate limit
    deps.clock.advance(SETTINGS.pool_status_interval + 1)
    worker.run_once()
    assert worker.published_status["nodes"] == {"ready": 1}


def test_backward_step_does_not_stall_the_drift_check(
        make_worker_deps: MakeWorkerDeps, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real = disruption.decide

    def counted(*args: object, **kw: object) -> object:
        calls.append(deps.clock.monotonic())
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(disruption, "decide", counted)
    deps = make_worker_deps()
    worker, _ = worker_for(deps)
    worker.run_once()
    assert len(calls) == 1  # the first drift check
    worker.run_once()
    assert len(calls) == 1  # nothing can drift until CHECK_INTERVAL
    deps.clock.step_wall(-HOUR)
    deps.clock.advance(disruption.CHECK_INTERVAL + 1)
    worker.run_once()
    assert len(calls) == 2  # the periodic drift check


BREAKER = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    launch-retries: 1
    pools:
      - name: main
        breaker-threshold: 1
        breaker-backoff: 60
        labels:
          - name: small
            type: namespace
            launch-delay: 0
"""


def test_backward_step_does_not_stall_a_breaker_probe(zk: ZkConnection,
                                                      zkc: ZkClient) -> None:
    deps = WorkerDeps(zkc, make_config(zk, textwrap.dedent(BREAKER)), ManualClock())
    worker, launches = worker_for(deps)
    deps.provider.fail_next(1, LaunchError("no such image", reason="ErrImagePull"))
    failed = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    assert state(deps, failed) == model.RequestState.FAILED
    worker.run_once()
    assert worker.breaker.entries().get("small", {}).get("state") == "open"
    deps.clock.step_wall(-HOUR)
    deps.clock.advance(61)  # the back-off is over
    probe = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    assert state(deps, probe) == model.RequestState.FULFILLED
