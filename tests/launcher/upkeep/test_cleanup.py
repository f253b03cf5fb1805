"""The cleanup worker's decisions, one pass at a time on a ManualClock (support.Upkeep):
a real ZooKeeper holds the records, the FakeProvider is the cloud, deletions run in the
test's thread.

Aspects: max-ready-age; holds (hold_expiration, max-hold-age, none); a deletion that fails
temporarily is retried and never forgotten, one the provider hands back as underway parks
the node locked until the provider's notice, a retry of a node that vanished is
forgotten, and no pass returns a deadline in the past; an orphaned lock of our own session
is released; leaked resources are deleted only after two sightings a grace period apart;
orphaned request-lock dirs go after 8 h.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.launcher.upkeep.cleanup import MIN_PASS_GAP
from nodepool_k8s.launcher.upkeep.deleter import Retry
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import CacheEvent
from tests.launcher.test_cleanup import body
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep

READY, HOLD = model.NodeState.READY, model.NodeState.HOLD


def deletes(upkeep: Upkeep) -> int:
    return int(upkeep.fake.call_names().count("delete"))


def raw(upkeep: Upkeep, node_id: str) -> dict[str, Any]:
    """The node's record as ZooKeeper holds it (every key, also unknown ones)."""
    got = upkeep.deps.zk.get(paths.node_path(node_id))
    assert got is not None
    found: dict[str, Any] = json.loads(got[0])
    return found


def test_max_ready_age(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    node_id = world.node(READY)
    world.step()
    deadline = world.step(599)
    assert world.record(node_id) is not None
    # The worker is due again when the node is (600 s), not at its next full pass.
    assert deadline is not None and deadline <= world.clock.monotonic() + 1.0 + 1e-6
    world.step(2)
    assert world.record(node_id) is None


def test_hold_expiration(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    expiring = world.node(HOLD, hold_expiration=100)
    forever = world.node(HOLD)
    world.step()
    world.step(50)
    assert world.state(expiring) == HOLD
    world.step(60)
    assert world.record(expiring) is None
    world.step(10**6)
    assert world.state(forever) == HOLD


def test_max_hold_age(upkeep: MakeUpkeep) -> None:
    world = upkeep(body(max_hold_age=30))
    node_id = world.node(HOLD, hold_expiration=100)
    world.step()
    world.step(29)
    assert world.state(node_id) == HOLD
    world.step(2)
    assert world.record(node_id) is None


def test_failed_delete_is_retried(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    world.fake.fail_next(2, TemporaryError("api down"), op="delete")
    node_id = world.node()
    world.step()
    for tries in (1, 2):
        assert deletes(world) == tries
        node = world.record(node_id)
        assert node is not None and node.state == model.NodeState.DELETING
        assert not world.locked(node_id) and world.deleter.retry_entries() == 1
        world.step(world.deps.settings.delete_retry_max)
    assert world.record(node_id) is None
    assert deletes(world) == 3
    assert world.fake.resource_ids() == set()
    assert world.deleter.retry_entries() == 0


@pytest.mark.parametrize("early_notice", [False, True], ids=["notice-later", "notice-first"])
def test_deletion_underway_parks_the_node_locked(upkeep: MakeUpkeep,
                                                 early_notice: bool) -> None:
    """A deletion the provider hands back as underway parks the node: locked, `deleting`, no
    deleter thread busy with it, no retry or failure; the provider's notice finishes it. The
    notice may also overtake the hand-back (the resource went at once): then the node is
    finished as soon as the pass that parks it ends, not at the next deadline (60 s)."""
    world = upkeep(body())
    world.fake.defer_deletions(early_notice=early_notice)
    node_id, other_id = world.node(), world.node()
    deleter = world.deleter
    world.step()  # each deletion returns to the pass at once: nothing waits on it
    if early_notice:
        assert world.record(node_id) is None and world.record(other_id) is None
    else:
        assert deleter.parked() == 2
        for parked_id in (node_id, other_id):
            node = raw(world, parked_id)
            assert node["state"] == "deleting", node
            assert "delete_failures" not in node
            assert world.locked(parked_id)
            assert deleter.busy(parked_id)
        assert deleter.retry_entries() == 0
        world.fake.finish_deletions()  # the notices look again at once
        assert world.record(node_id) is None and world.record(other_id) is None
    assert deleter.deleted == 2 and deleter.parked() == 0
    assert deleter.retry_entries() == 0
    assert world.fake.resource_ids() == set()
    # Each deletion asked the provider twice: once to start, once to confirm.
    assert deletes(world) == 4


def test_a_parked_node_after_a_failed_try_sets_no_past_deadline(upkeep: MakeUpkeep) -> None:
    """A deletion that failed once and is parked on its retry keeps its back-off entry; that
    entry's past due time must not wake the cleanup worker (every MIN_PASS_GAP) while the
    node waits for the provider's notice."""
    world = upkeep(body())
    world.fake.fail_next(1, TemporaryError("api down"), op="delete")
    world.fake.defer_deletions()
    node_id = world.node()
    world.step()
    assert world.deleter.retry_entries() == 1 and world.deleter.parked() == 0
    deadline = world.step(world.deps.settings.delete_retry_max)
    deleter = world.deleter
    assert deleter.parked() == 1
    assert deleter.retry_entries() == 1  # the back-off is kept for a later failure
    now = world.clock.monotonic()
    assert deleter.next_retry() > now + 30  # the 60 s look
    assert deadline is not None and deadline > now + MIN_PASS_GAP
    world.fake.finish_deletions()
    assert world.record(node_id) is None


def test_retry_of_a_vanished_node_is_forgotten(upkeep: MakeUpkeep,
                                               kazoo_client: KazooClient) -> None:
    """A node whose deletion keeps failing is retried; once another launcher (or a hand)
    removed it, the retry table forgets it and no retry deadline remains (a table that kept
    it with a past deadline would spin the cleanup worker)."""
    world = upkeep(body())
    world.fake.fail_next(1000, TemporaryError("api down"), op="delete")
    node_id = world.node()
    world.step()
    deleter = world.deleter
    assert deleter.retry_entries() == 1 and not deleter.busy(node_id)
    kazoo_client.delete(paths.node_path(node_id), recursive=True)
    world.cleanup.on_node_event(CacheEvent.REMOVED, node_id)  # what the node cache says
    world.step()
    assert deleter.retry_entries() == 0
    assert deleter.next_retry() == float("inf")


def test_cleanup_never_returns_a_past_deadline(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    # A retry of a node that exists nowhere, due long ago (the state that made it spin).
    # Deadlines are monotonic time.
    world.deleter._retry["0000009999"] = Retry(world.clock.monotonic() - 100, 1.0)
    deadline = world.step()
    assert deadline is not None and deadline >= world.clock.monotonic() + MIN_PASS_GAP
    assert world.deleter.retry_entries() == 0


def test_orphaned_lock_of_our_own_session_is_released(upkeep: MakeUpkeep,
                                                      kazoo_client: KazooClient) -> None:
    """A lock our own session holds but no live work does (a lost commit reply, a crashed
    handler) would keep its node locked until the session ends; another session's lock on
    the same kind of node is left alone. A contender is released only when seen orphaned
    on two full passes in a row (one being taken right now is not)."""
    world = upkeep(body())
    record = json.dumps({"state": "building", "provider": "fake", "pool": "main",
                         "type": ["small"]}).encode()
    ours, theirs = paths.node_path("0000000901"), paths.node_path("0000000902")
    for path in (ours, theirs):
        kazoo_client.create(path, record, makepath=True)
    orphan = f"{ours}/lock/{'a' * 32}__lock__0000000000"
    world.deps.zk.create(orphan, b"", ephemeral=True, makepath=True)
    foreign = f"{theirs}/lock/{'b' * 32}__lock__0000000000"
    kazoo_client.create(foreign, b"", ephemeral=True, makepath=True)
    world.full_pass()
    assert world.cleanup.orphans_released == 0 and kazoo_client.exists(orphan) is not None
    world.full_pass()
    assert world.cleanup.orphans_released == 1
    assert kazoo_client.exists(orphan) is None
    assert kazoo_client.exists(foreign) is not None
    world.full_pass()
    assert world.cleanup.orphans_released == 1


def test_leak_sweep_needs_two_sightings(upkeep: MakeUpkeep) -> None:
    world = upkeep(body())
    fake = world.fake
    fake.add_resource("main-0000000999", "0000000999")
    sweeper = world.sweeper
    now = world.clock.monotonic()
    sweeper.sweep("fake", fake.list_resources(), now)
    sweeper.sweep("fake", fake.list_resources(), now + 50)
    assert "main-0000000999" in fake.resource_ids()
    sweeper.sweep("fake", fake.list_resources(), now + 101)
    assert "main-0000000999" not in fake.resource_ids()
    keys = world.deps.stats.backend.keys("incr")  # type: ignore[attr-defined]
    assert "nodepool.provider.fake.leaked.nodes" in keys
    # A resource whose node exists is not a leak.
    node_id = world.node(READY)
    for offset in (200, 400):
        sweeper.sweep("fake", fake.list_resources(), now + offset)
    assert f"main-{node_id}" in fake.resource_ids()


def test_orphan_request_lock_dirs(upkeep: MakeUpkeep, kazoo_client: KazooClient) -> None:
    """Zuul deletes a request but never its lock dir: the dir goes once 8 h old, while a
    dir whose request still exists stays."""
    world = upkeep(body())
    gone = paths.request_lock_path("200-0000000001")
    kazoo_client.ensure_path(gone)
    waiting = world.deps.submit(["small"])
    kept = paths.request_lock_path(waiting)
    kazoo_client.ensure_path(kept)
    world.full_pass()
    world.full_pass(3600)
    assert kazoo_client.exists(gone) is not None
    world.full_pass(8 * 3600)
    assert kazoo_client.exists(gone) is None
    assert kazoo_client.exists(kept) is not None
