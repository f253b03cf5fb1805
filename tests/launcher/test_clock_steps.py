"""The wall clock steps under a running launcher (chrony's `makestep`, a resumed VM, an
operator's `date -s`): `ManualClock.step_wall` moves wall time alone.

Aspects, each through the real engine (ZooKeeper, the fake driver):
- a backward step stalls nothing that runs on this launcher's own schedule: the cleanup
  worker's full pass (a lost request is reset), a failed deletion's retry, another look
  at a deletion handed back as underway, the leak sweep,
  an empty node znode's removal, an orphaned request-lock dir's removal, reclaiming an
  idle node at quota, the pool status's rate limit, the drift check, and a circuit
  breaker's probe (a paused request's retry after the cloud refused for quota and
  min-ready's back-off are stepped on their own in tests/launcher/requests/);
- ages of records are judged from when this launcher first saw them: a backward step does
  not keep a node past its `max-ready-age`, and a forward step of a day expires no held
  node early and sweeps no young resource as leaked; the table of ages is pruned with
  the nodes.

Each test fails on the code before `audit/clock` (where these schedules and ages were on
wall time); the tests never sleep, they wait for a condition with a deadline.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.core.errors import LaunchError, TemporaryError
from nodepool_k8s.launcher.upkeep import drift
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.worker import Worker
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for
from tests.launcher.test_cleanup import body, fulfilled, hold, idle_node
from tests.launcher.test_quota import LIMITED
from tests.launchers import TEST_SETTINGS, LauncherFactory

HOUR = 3600.0
DAY = 86400.0


def manual() -> ManualClock:
    return ManualClock(start=time.time())


def woken(worker: Worker, predicate: Callable[[], object], message: str) -> None:
    """Wait for `predicate`, waking `worker` on every look (its own wake-up may be far
    off on the manual clock)."""
    def check() -> object:
        found = predicate()
        if not found:
            worker.wake()
        return found
    wait_for(check, 15, message=message)


def a_pass(worker: Worker) -> None:
    """Return once a pass of `worker` that began after this call has ended."""
    target = worker.passes + 2
    woken(worker, lambda: worker.passes >= target, "a later pass")


def cleanup_pass(launcher: Launcher) -> None:
    a_pass(launcher.cleanup)


# -- the cleanup worker's own schedules ---------------------------------------------------

def test_backward_step_does_not_stall_the_full_cleanup_pass(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """A lost request is reset only by a full pass (no event announces it)."""
    clock = manual()
    launcher = launchers(body(), clock=clock)
    cleanup_pass(launcher)
    clock.step_wall(-HOUR)
    clock.advance(TEST_SETTINGS.cleanup_interval + 1)
    # A launcher died after accepting this request: pending, nobody holds its lock.
    raw = json.loads(zuul.request_body(["small"]))
    raw.update(state="pending", declined_by=[], nodes=[], reuse=True)
    path = kazoo_client.create(f"{paths.REQUESTS}/200-", json.dumps(raw).encode(),
                               sequence=True, makepath=True)
    launcher.cleanup.wake()
    assert fulfilled(zuul, paths.basename(path))


def test_backward_step_does_not_stall_a_deletion_retry(launchers: LauncherFactory,
                                                       zuul: ZuulClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    fake = launcher.providers["fake"]
    fake.fail_next(1, TemporaryError("api down"), op="delete")  # type: ignore[attr-defined]
    _, [node_id] = zuul.run_build(["small"])
    wait_for(lambda: launcher.deleter.retry_entries() == 1
             and not launcher.deleter.busy(node_id), 15, message="a deletion to retry")
    clock.step_wall(-HOUR)
    clock.advance(TEST_SETTINGS.delete_retry + 1)
    launcher.cleanup.wake()
    wait_for(lambda: zuul.get_node(node_id) is None, 15, message="the retried deletion")


def test_backward_step_does_not_stall_a_parked_deletion(launchers: LauncherFactory,
                                                        zuul: ZuulClient) -> None:
    """A deletion handed back as underway is asked about again at the provider's deadline
    when its notice never comes."""
    clock = manual()
    launcher = launchers(body(), clock=clock)
    fake = launcher.providers["fake"]
    fake.defer_deletions()  # type: ignore[attr-defined]
    _, [node_id] = zuul.run_build(["small"])
    wait_for(lambda: launcher.deleter.parked() == 1, 15, message="the deletion parked")
    asked = fake.call_names().count("delete")  # type: ignore[attr-defined]
    clock.step_wall(-HOUR)
    clock.advance(61)  # the fake names 60 s
    woken(launcher.cleanup,
          lambda: fake.call_names().count("delete") > asked,  # type: ignore[attr-defined]
          "the provider asked again")
    fake.finish_deletions()  # type: ignore[attr-defined]
    wait_for(lambda: zuul.get_node(node_id) is None, 15, message="the node deleted")


def with_leak(launchers: LauncherFactory, node_id: str) -> tuple[ManualClock, Launcher, Any]:
    """A launcher on a manual clock sweeping every 10 s, whose fake cloud holds a resource
    of node `node_id` that has no node record (a leak)."""
    clock = manual()
    launcher = launchers(body(), clock=clock,
                         settings=TEST_SETTINGS.replace(leak_sweep_interval=10.0))
    fake = launcher.providers["fake"]
    fake.add_resource(f"main-{node_id}", node_id)  # type: ignore[attr-defined]
    return clock, launcher, fake


def test_backward_step_does_not_stall_the_leak_sweep(launchers: LauncherFactory) -> None:
    clock, launcher, fake = with_leak(launchers, "0000000999")
    lists = fake.call_names().count("list")  # type: ignore[attr-defined]
    clock.advance(10)
    launcher.cleanup.wake()
    wait_for(lambda: fake.call_names().count("list") > lists,  # type: ignore[attr-defined]
             message="the first sighting")
    clock.step_wall(-HOUR)
    clock.advance(101)  # leak-grace is 100
    launcher.cleanup.wake()
    wait_for(lambda: "main-0000000999" not in fake.resource_ids(),  # type: ignore[attr-defined]
             15, message="the leak deleted")


def test_backward_step_does_not_stall_empty_node_removal(
        launchers: LauncherFactory, kazoo_client: KazooClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    kazoo_client.create(paths.node_path("0000000700"), b"", makepath=True)
    wait_for(lambda: "0000000700" in launcher.node_cache.empty_ids(), 10)
    cleanup_pass(launcher)
    clock.step_wall(-HOUR)
    clock.advance(TEST_SETTINGS.empty_node_age + 1)
    launcher.cleanup.wake()
    wait_for(lambda: kazoo_client.exists(paths.node_path("0000000700")) is None, 15,
             message="the empty node znode removed")


def test_backward_step_does_not_stall_lock_dir_removal(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    request_id, _ = zuul.run_build(["small"])
    launcher.cleanup.request_full_pass()
    cleanup_pass(launcher)
    clock.step_wall(-HOUR)
    clock.advance(TEST_SETTINGS.lock_dir_max_age + 1)
    launcher.cleanup.request_full_pass()
    wait_for(lambda: kazoo_client.exists(paths.request_lock_path(request_id)) is None, 15,
             message="the orphaned lock dir removed")


# -- ages of records ----------------------------------------------------------------------

def test_backward_step_does_not_keep_a_node_past_max_ready_age(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    node_id = idle_node(zuul)
    cleanup_pass(launcher)
    clock.step_wall(-HOUR)
    clock.advance(601)  # max-ready-age is 600
    launcher.cleanup.wake()  # a timed wake-up: no full pass is asked for
    wait_for(lambda: zuul.get_node(node_id) is None, 15, message="the expired node deleted")


def test_forward_step_does_not_expire_a_held_node_early(launchers: LauncherFactory,
                                                        zuul: ZuulClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    node_id = hold(zuul, 100)
    wait_for(lambda: getattr(launcher.node_cache.get(node_id), "state", None) == "hold", 10)
    cleanup_pass(launcher)
    clock.step_wall(DAY)
    launcher.cleanup.request_full_pass()
    cleanup_pass(launcher)
    assert (zuul.get_node(node_id) or {}).get("state") == "hold"
    assert launcher.deleter.deleted == 0
    clock.advance(101)
    launcher.cleanup.request_full_pass()
    wait_for(lambda: zuul.get_node(node_id) is None, 15, message="the hold expired")


def test_forward_step_does_not_sweep_a_young_resource(launchers: LauncherFactory) -> None:
    clock, launcher, fake = with_leak(launchers, "0000000998")

    def sweep(seconds: float) -> None:
        lists = fake.call_names().count("list")  # type: ignore[attr-defined]
        clock.advance(seconds)
        launcher.cleanup.wake()
        wait_for(lambda: fake.call_names().count("list") > lists,  # type: ignore
                 message="a sweep")
        cleanup_pass(launcher)

    sweep(10)  # first sighting
    clock.step_wall(DAY)
    sweep(10)  # second sighting: seen for 10 s, created 10 s ago (not a day)
    assert "main-0000000998" in fake.resource_ids()  # type: ignore[attr-defined]
    assert launcher.deleter.leaks_deleted == 0
    sweep(100)  # leak-grace over
    wait_for(lambda: "main-0000000998" not in fake.resource_ids(),  # type: ignore
             15, message="the leak deleted once its grace is over")


# -- the pool worker and min-ready --------------------------------------------------------


def test_backward_step_does_not_stall_reclaiming_at_quota(launchers: LauncherFactory,
                                                          zuul: ZuulClient) -> None:
    clock = manual()
    launchers(LIMITED.format(provider_max=1, pool_max=1), clock=clock)
    other = idle_node(zuul, "other")
    small = idle_node(zuul, "small")  # reclaims the idle `other` node on the way
    assert zuul.get_node(other) is None
    clock.step_wall(-HOUR)
    # The provider is full with the idle `small` node: it must be reclaimed again.
    assert fulfilled(zuul, zuul.submit(["other"])) != [small]
    assert zuul.get_node(small) is None


def test_backward_step_does_not_stall_the_pool_status(launchers: LauncherFactory,
                                                      zuul: ZuulClient) -> None:
    clock = manual()
    launcher = launchers(body(), clock=clock)
    worker = next(iter(launcher.pool_workers.values()))
    wait_for(lambda: worker.published_status is not None, 10, message="a first status")
    a_pass(worker)
    clock.step_wall(-HOUR)
    fulfilled(zuul, zuul.submit(["small"]))
    # On a busy machine the pass that the first interval allows may run before the worker
    # has seen the new node, and the next publication needs another interval: allow a few,
    # still far less together than the hour a wall-clock schedule would stall for.
    extra = {"intervals": 0, "after_pass": worker.passes}

    def published() -> bool:
        if (worker.published_status or {}).get("nodes") == {"ready": 1}:
            return True
        if extra["intervals"] < 5 and worker.passes > extra["after_pass"]:
            clock.advance(TEST_SETTINGS.pool_status_interval + 1)
            extra["intervals"] += 1
            extra["after_pass"] = worker.passes + 1
        return False
    clock.advance(TEST_SETTINGS.pool_status_interval + 1)
    woken(worker, published, "the new node count published")
    assert 5 * (TEST_SETTINGS.pool_status_interval + 1) < HOUR


def test_backward_step_does_not_stall_the_drift_check(
        launchers: LauncherFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real = drift.replace_drifted

    def counted(*args: object, **kw: object) -> tuple[int, int]:
        calls.append(time.monotonic())
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(drift, "replace_drifted", counted)
    clock = manual()
    launcher = launchers(body(), clock=clock)
    worker = next(iter(launcher.pool_workers.values()))
    wait_for(lambda: calls, 10, message="the first drift check")
    checks = len(calls)
    clock.step_wall(-HOUR)
    clock.advance(drift.CHECK_INTERVAL + 1)
    woken(worker, lambda: len(calls) > checks, "the periodic drift check")


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
"""


def test_backward_step_does_not_stall_a_breaker_probe(launchers: LauncherFactory,
                                                      zuul: ZuulClient) -> None:
    clock = manual()
    launcher = launchers(BREAKER, clock=clock)
    fake = launcher.providers["fake"]
    fake.fail_next(1, LaunchError("no such image", reason="ErrImagePull"))  # type: ignore
    failed = zuul.wait(zuul.submit(["small"]))
    assert failed is not None and failed["state"] == "failed"
    worker = next(iter(launcher.pool_workers.values()))
    wait_for(lambda: worker.breaker.entries().get("small", {}).get("state") == "open", 10,
             message="the label suspended")
    clock.step_wall(-HOUR)
    clock.advance(61)  # the back-off is over
    launcher.wake_all()
    assert fulfilled(zuul, zuul.submit(["small"]))  # the probe


def test_age_tables_do_not_outlive_their_nodes(launchers: LauncherFactory,
                                               zuul: ZuulClient) -> None:
    """The step-proof ages are one entry per node: gone with the node."""
    launcher = launchers(body())
    for _ in range(3):
        zuul.run_build(["small"])
    wait_for(lambda: not launcher.node_cache.ids(), 20, message="every node deleted")
    launcher.cleanup.request_full_pass()
    woken(launcher.cleanup, lambda: len(launcher.cleanup._node_ages) == 0,
          "the ages of deleted nodes forgotten")
