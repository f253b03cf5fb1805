"""Writes whose reply was lost (a ZooKeeper failover between commit and answer).

Aspects: a node write that was applied while the launcher did not hear back leaves the
node one version ahead of what the launcher believes; the request is still fulfilled (the
final write adopts the newer version of the node it holds locked) instead of failing every
pass forever with "bad version" and leaving the node `building` under our own lock; a
launch completion wakes its pool worker only once the outcome is visible (woken earlier,
the worker saw the launch still running and slept until some unrelated event); a node
lock lost before the final write does not wedge the pool.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.driver.base import LaunchSpec
from nodepool_k8s.launcher.requests.launch import LaunchEnd, LaunchOutcome, LaunchPool
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.txn import Txn
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection
from tests.launcher.upkeep.support import make_upkeep
from tests.launchers import LauncherFactory, small_pool


def test_node_written_behind_our_back_under_our_lock_is_still_fulfilled(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    launcher = launchers()
    bumped: list[str] = []

    def applied_but_unanswered(spec: LaunchSpec) -> None:
        # What a lost reply to the external-id write leaves behind: ZooKeeper has the
        # write (version + 1, the same bytes), the launcher still holds the old version.
        path = paths.node_path(spec.node_id)
        data, _ = kazoo_client.get(path)
        kazoo_client.set(path, data)
        bumped.append(spec.node_id)

    launcher.providers["fake"].on_launch = applied_but_unanswered  # type: ignore[attr-defined]
    caplog.set_level(logging.WARNING)
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id, timeout=30)
    assert body is not None and body["state"] == "fulfilled"
    assert body["nodes"] == bumped
    node = zuul.get_node(bumped[0])
    assert node is not None and node["state"] == "ready"
    assert node["allocated_to"] == request_id and node["connection_port"]["token"]
    assert not kazoo_client.get_children(paths.node_lock_path(bumped[0]))
    assert any("changed under our lock" in r.getMessage() for r in caplog.records)


def test_launch_completion_wakes_after_the_outcome_is_visible() -> None:
    pool = LaunchPool("p", 2)
    seen: list[bool] = []
    woke = threading.Event()
    futures: list[object] = []

    def wake() -> None:
        # The worker woken here looks at the future: it must already be done.
        seen.append(bool(futures) and futures[0].done())  # type: ignore[attr-defined]
        woke.set()

    release = threading.Event()

    def run() -> LaunchOutcome:
        release.wait(10)
        return LaunchOutcome(LaunchEnd.READY)

    futures.append(pool.submit(run, wake))
    release.set()
    assert woke.wait(10)
    assert seen == [True]
    pool.shutdown()


ONE_SERVER = small_pool(1)


def test_no_node_is_created_for_a_request_whose_lock_vanished(
        zk: ZkConnection, zkc: ZkClient, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """What a launcher whose session expired mid-pass sees: its request lock is gone. The
    node-create transaction checks the lock, so no node is created for a request that
    another launcher may already serve; the request is reset and served once. (Stepped:
    the pool worker and the cleanup worker one pass at a time.)"""
    world = make_upkeep(zk, zkc, ONE_SERVER)
    worker, launches = world.pool_worker()
    first = zuul.submit(["small"])
    worker.run_once()
    launches.run_all()
    body = zuul.get_request(first)
    assert body is not None and body["state"] == "fulfilled"
    first_node = int(body["nodes"][0])
    second = zuul.submit(["small"])
    worker.run_once()
    # Paused at quota, locked by the launcher.
    assert (zuul.get_request(second) or {}).get("state") == "pending" and worker.paused
    lock_dir = paths.request_lock_path(second)
    for contender in kazoo_client.get_children(lock_dir):
        kazoo_client.delete(f"{lock_dir}/{contender}")
    nodeset = zuul.accept(first)
    zuul.use(nodeset)
    zuul.release(nodeset)
    for _ in range(3):  # the used node deleted, the request reset and served again
        world.full_pass()
        worker.run_once()
        launches.run_all()
    body = zuul.get_request(second)
    assert body is not None and body["state"] == "fulfilled"
    # Exactly one node was created for it: none while its lock was gone.
    assert body["nodes"] == [f"{first_node + 1:010d}"]


def test_node_lock_lost_before_the_final_write_does_not_wedge_the_pool(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    """A node lock the final write needs that is no longer ours (here: released while
    its launch runs, as after an ambiguous commit) made every pass of the pool worker
    fail at that handler ("lock on node ... is no longer ours; retrying") and the pool
    served nothing more. The handler gives up instead: the request is reset as lost and
    served again, and the next request is served too."""
    launcher = launchers()
    fake = launcher.providers["fake"]
    launching = threading.Event()
    go_on = threading.Event()

    def hold(spec: LaunchSpec) -> None:
        if not go_on.is_set():
            launching.set()
            go_on.wait(15)

    fake.on_launch = hold  # type: ignore[attr-defined]
    request_id = zuul.submit(["small"])
    assert launching.wait(15)
    worker = next(iter(launcher.pool_workers.values()))
    handler = worker.handlers[request_id]
    job = handler.slots[0].job
    assert job is not None and job.lock is not None
    job.lock.release()
    go_on.set()
    body = zuul.wait(request_id, timeout=30)
    assert body is not None and body["state"] == "fulfilled"
    other = zuul.submit(["small"])
    body = zuul.wait(other, timeout=30)
    assert body is not None and body["state"] == "fulfilled"


def test_a_final_write_applied_whose_reply_was_lost_is_adopted(
        zk: ZkConnection, zkc: ZkClient, zuul: ZuulClient, kazoo_client: KazooClient,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The transaction that fulfils a request was applied, but its reply was lost (a
    failover between commit and answer). The handler reads the request back, finds what it
    wrote and is done: one `fulfilled` write, no second one over a lock it no longer
    holds, no error on the next passes. (Stepped, as above.)"""
    world = make_upkeep(zk, zkc, ONE_SERVER)
    worker, launches = world.pool_worker()
    request_id = zuul.submit(["small"])
    request_path = paths.request_path(request_id)
    original = Txn.commit
    lost: list[int] = []

    def reply_lost(self: Txn, client: ZkClient) -> list[Any]:
        results = original(self, client)
        closing = any(op.kind == "set" and op.path == request_path
                      and b'"fulfilled"' in op.data for op in self.ops)
        if closing and not lost:
            lost.append(kazoo_client.exists(request_path).version)
            raise errors.ZkConnectionError("connection lost before the answer")
        return results

    monkeypatch.setattr(Txn, "commit", reply_lost)
    caplog.set_level(logging.INFO)
    worker.run_once()
    launches.run_all()
    for _ in range(2):
        worker.run_once()
        launches.run_all()
    assert lost, "the final write was not sent"
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] == "fulfilled" and len(body["nodes"]) == 1
    # Written once: the version the lost reply would have told is still the request's.
    assert kazoo_client.exists(request_path).version == lost[0]
    assert any("applied although its reply was lost" in r.getMessage()
               for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert request_id not in worker.handlers
