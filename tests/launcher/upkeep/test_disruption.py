"""Spares removed by their pool (launcher/upkeep/disruption.py), one pool pass at a time on
a ManualClock with a real ZooKeeper, the fake provider and the inline deleter.

Aspects: surplus beyond the min-ready target goes after `surplus-delay`, oldest first,
never below the target (outstanding min-ready requests counted), never a locked, held or
in-use node, also after min-ready is lowered; `max-age` (label, pool default, global label)
replaces old spares, counted from creation; disruption budgets cap each reason, count
nodes being deleted, and apply only inside their cron window; the `drift-budget`
shorthand's window confines drift replacement to it; a drain keeps to its budget; every
removal leaves an event and a counter by reason; the pool's AtTarget condition reads
UnderTarget, OverTarget, TargetMet and Draining. Pure budget arithmetic is unit-tested.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import textwrap
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.config.model import DisruptionBudget
from nodepool_k8s.core import model
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.launcher.upkeep import disruption
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.runtime.stats import PROM_SPARES_REMOVED, RecordingBackend
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.pool_state import DRAIN, PAUSE, PoolState
from nodepool_k8s.zk.requests import min_ready_request
from tests.helpers import ZkConnection
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launcher.upkeep.support import Upkeep
from tests.launchers import make_config

HOUR = 3600.0


def body(*, min_ready: int = 0, small: str = "", big: str = "", pool: str = "",
         small_pool: str = "") -> str:
    """The launcher config: labels `small` (global `min-ready`) and `big`, each with extra
    global keys (`small`, `big`), in pool `main` of provider `fake` with extra pool keys
    (`pool`) and extra keys of its `small` label (`small_pool`); YAML lines, `\n`-joined."""
    def keys(text: str, indent: int) -> str:
        lines = textwrap.dedent(text).strip().splitlines()
        return "".join(f"{' ' * indent}{line}\n" for line in lines)
    return ("labels:\n"
            f"  - name: small\n    min-ready: {min_ready}\n" + keys(small, 4)
            + "  - name: big\n" + keys(big, 4)
            + "providers:\n  - name: fake\n    driver: fake\n    pools:\n"
            "      - name: main\n        max-servers: 20\n" + keys(pool, 8)
            + "        labels:\n          - name: small\n            type: namespace\n"
            + keys(small_pool, 12)
            + "          - name: big\n            type: namespace\n")


def spare(world: Upkeep, label: str = "small", *, ready_for: float = 0.0,
          created_ago: float | None = None, config_hash: str | None = None) -> str:
    """A ready, unallocated node of pool main, ready for `ready_for` seconds."""
    node_id = world.node(model.NodeState.READY, label,
                         state_time=world.clock.time() - ready_for)
    if created_ago is not None or config_hash is not None:
        node = world.record(node_id)
        assert node is not None
        if created_ago is not None:
            node.set(created_time=world.clock.time() - created_ago)
        if config_hash is not None:
            node.extra[model.CONFIG_HASH] = config_hash
        world.deps.zk.set(paths.node_path(node_id), node_codec.encode(node))
    return node_id


def present(world: Upkeep, *node_ids: str) -> list[str]:
    return [n for n in node_ids if world.state(n) is not None]


def events(world: Upkeep, kind: str) -> list[dict[str, Any]]:
    world.deps.events.flush()
    return [e for e in zk_events.read_events(world.deps.zk) if e["kind"] == kind]


def removed_count(world: Upkeep, reason: str) -> float:
    return sum(v for (name, labels), v in world.deps.stats.counters().items()
               if name == PROM_SPARES_REMOVED and ("reason", reason) in labels)


def test_surplus_goes_after_the_delay_oldest_first_never_below_target(
        upkeep: MakeUpkeep, kazoo_client: KazooClient) -> None:
    world = upkeep(body(min_ready=2, pool="surplus-delay: 300"))
    worker, _ = world.pool_worker()
    oldest, older, newer, newest = (spare(world, ready_for=age) for age in (400, 300, 200, 100))
    locked = spare(world, ready_for=900)  # oldest of all, but someone holds its lock
    in_use = world.node(model.NodeState.IN_USE, state_time=world.clock.time() - 900)
    held = world.node(model.NodeState.HOLD, state_time=world.clock.time() - 900)
    other = spare(world, "big", ready_for=50)  # a label without a target: all surplus
    lock = Lock(kazoo_client, paths.node_lock_path(locked))
    assert lock.acquire(timeout=10)
    try:
        due = worker.run_once()
        assert world.deps.deletions == []  # over target, but not for surplus-delay yet
        assert due is not None and due <= world.clock.monotonic() + 300
        world.clock.advance(299)
        worker.run_once()
        assert world.deps.deletions == []
        world.clock.advance(1)
        worker.run_once()
        # The default surplus budget: one node at a time (the inline deleter finishes it).
        assert present(world, oldest, older, newer, newest) == [older, newer, newest]
        for _ in range(5):
            worker.run_once()
        # Two of `small` stay (its min-ready); `big` has no target, so its spare goes too.
        assert present(world, oldest, older, newer, newest, other) == [newer, newest]
        assert present(world, locked, in_use, held) == [locked, in_use, held]
    finally:
        lock.release()
    assert [e["node"] for e in events(world, zk_events.SURPLUS_REMOVED)] \
        == [oldest, older, other]
    assert removed_count(world, "surplus") == 3
    backend = world.deps.stats.backend
    assert isinstance(backend, RecordingBackend)
    assert backend.keys("incr").count(
        "nodepool.provider.fake.pool.main.spares_removed.surplus") == 3


TWO_POOLS = """
labels:
  - name: small
    min-ready: 2
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
      - name: other
        labels:
          - name: small
            type: namespace
"""


def test_pools_agree_on_the_surplus_of_a_global_target(upkeep: MakeUpkeep) -> None:
    """Each pool removes only its own spares, but both walk the label's spares of every
    pool the same way: together they leave the global target, not each of them."""
    world = upkeep(TWO_POOLS)
    main, _ = world.pool_worker("main")
    other, _ = world.pool_worker("other")
    in_main = [spare(world, ready_for=age) for age in (40, 30)]
    in_other = [spare(world, ready_for=age) for age in (20, 10)]
    for node_id in in_other:
        node = world.record(node_id)
        assert node is not None
        node.set(pool="other")
        world.deps.zk.set(paths.node_path(node_id), node_codec.encode(node))
    for worker in (main, other):
        worker.run_once()
    world.clock.advance(300)
    for _ in range(3):
        for worker in (other, main):
            worker.run_once()
    assert present(world, *in_main, *in_other) == in_other


def test_lowered_min_ready_and_outstanding_requests(upkeep: MakeUpkeep,
                                                    zk: ZkConnection) -> None:
    world = upkeep(body(min_ready=4))
    worker, _ = world.pool_worker()
    nodes = [spare(world, ready_for=age) for age in (40, 30, 20, 10)]
    world.clock.advance(1000)
    worker.run_once()
    assert present(world, *nodes) == nodes  # at target
    # min-ready lowered to 2 while a min-ready request for one more is outstanding: it
    # counts, so three of the four go, the oldest first.
    world.deps.config = make_config(zk, body(min_ready=2))
    request = min_ready_request("small", world.clock.time())
    world.deps.zk.create(f"{paths.REQUESTS}/{model.MIN_READY_PRIORITY}-",
                         request_codec.encode(request), sequence=True)
    worker.run_once()
    assert present(world, *nodes) == nodes  # surplus-delay runs from now
    world.clock.advance(300)
    for _ in range(4):
        worker.run_once()
    assert present(world, *nodes) == nodes[3:]


def test_max_age_replaces_old_spares_within_the_expiry_budget(upkeep: MakeUpkeep) -> None:
    world = upkeep(body(pool="surplus-delay: 0\ndefault-label-max-age: 7200",
                        small_pool="max-age: 600", big="max-age: 60"))
    worker, _ = world.pool_worker()
    # `small` (label max-age 600): created 700 s ago, though ready for only 100 s.
    old_small = spare(world, ready_for=100, created_ago=700)
    young_small = spare(world, ready_for=100, created_ago=300)
    # `big` (the pool's default 7200 beats the global label's 60).
    big = spare(world, "big", ready_for=3000, created_ago=3000)
    in_use = world.node(model.NodeState.IN_USE, state_time=world.clock.time() - 9999)
    due = worker.run_once()
    assert present(world, old_small, young_small, big, in_use) == [young_small, big, in_use]
    assert due is not None and due <= world.clock.monotonic() + 300  # young_small's expiry
    # A pass that does not look (nothing new is due) still names the expiry's time.
    pool = world.deps.config.pool_config("fake", "main")
    assert pool is not None
    expiry = worker.disruptor.next_due
    assert expiry is not None and worker.disruptor.run(world.deps, pool, None) == expiry
    world.clock.advance(300)
    worker.run_once()
    assert present(world, young_small, big, in_use) == [big, in_use]
    [first, second] = events(world, zk_events.SPARE_EXPIRED)
    assert (first["node"], second["node"]) == (old_small, young_small)
    assert removed_count(world, "expiry") == 2
    # The node's own deletion reason says why (the `deleted` event carries it).
    deleted = {e["node"]: e["message"] for e in events(world, zk_events.DELETED)}
    assert "max-age" in deleted[old_small]


def test_max_ready_age_keeps_to_the_expiry_budget(upkeep: MakeUpkeep) -> None:
    world = upkeep(body(small="max-ready-age: 600", pool="""
        surplus-delay: 0
        disruption-budgets:
          - nodes: 2
            reasons: [expiry]
        """))
    nodes = [spare(world, ready_for=age) for age in (700, 800, 900)]
    world.full_pass()
    # The cleanup worker expires them, oldest first, two at a time.
    assert present(world, *nodes) == nodes[:1]
    due = world.step()
    assert due is not None and due <= world.clock.monotonic() + disruption.RETRY_INTERVAL
    world.step(disruption.RETRY_INTERVAL)
    assert present(world, *nodes) == []
    assert [e["node"] for e in events(world, zk_events.SPARE_EXPIRED)] == nodes[::-1]
    assert removed_count(world, "expiry") == 3


def test_budgets_count_deletions_under_way_and_keep_to_their_window(
        upkeep: MakeUpkeep) -> None:
    # 10:00 UTC, inside the 09:00-17:00 window that allows no expiry at all.
    start = dt.datetime(2026, 6, 1, 10, 0, tzinfo=dt.timezone.utc).timestamp()
    world = upkeep(body(pool="""
        surplus-delay: 0
        default-label-max-age: 600
        disruption-budgets:
          - nodes: 2
            reasons: [expiry]
          - nodes: 0
            reasons: [expiry, drift]
            schedule: "0 9 * * *"
            duration: 8h
        """), clock=ManualClock(start=start))
    worker, _ = world.pool_worker()
    nodes = [spare(world, ready_for=age, created_ago=age) for age in (4000, 3000, 2000, 1000)]
    worker.run_once()
    assert present(world, *nodes) == nodes  # working hours: warm capacity stays
    world.clock.advance(7 * HOUR + 60)  # 17:01
    world.fake.fail_next(2, TemporaryError("slow cloud"), op="delete")
    worker.run_once()
    # Two at once (the budget); their deletions failed, so they stay `deleting`.
    assert [world.state(n) for n in nodes] == [model.NodeState.DELETING] * 2 \
        + [model.NodeState.READY] * 2
    worker.run_once()
    assert [world.state(n) for n in nodes[2:]] == [model.NodeState.READY] * 2
    world.full_pass(3600)  # the cleanup finishes the two being deleted
    worker.run_once()
    assert present(world, *nodes) == []


def test_drift_budget_window_confines_replacement_to_it(upkeep: MakeUpkeep) -> None:
    start = dt.datetime(2026, 6, 1, 1, 0, tzinfo=dt.timezone.utc).timestamp()
    world = upkeep(body(pool="""
        surplus-delay: 0
        drift-budget:
          max-nodes: 1
          schedule: "0 2 * * *"
          duration: 1h
        """), clock=ManualClock(start=start))
    worker, _ = world.pool_worker()
    drifted = [spare(world, ready_for=age, config_hash="0" * 16) for age in (20, 10)]
    worker.run_once()
    assert present(world, *drifted) == drifted  # 01:00: outside the window
    world.clock.advance(HOUR)  # 02:00
    worker.run_once()
    assert present(world, *drifted) == drifted[1:]  # one at a time
    worker.run_once()
    assert present(world, *drifted) == []
    assert [e["node"] for e in events(world, zk_events.SPARE_DRIFTED)] == drifted


def test_a_drain_keeps_to_its_budget(upkeep: MakeUpkeep) -> None:
    world = upkeep(body(pool="""
        disruption-budgets:
          - nodes: 1
            reasons: [drain]
        """))
    worker, _ = world.pool_worker()
    nodes = [spare(world, ready_for=age) for age in (30, 20, 10)]
    in_use = world.node(model.NodeState.IN_USE)
    world.deps.pool_states.states.append(PoolState(target="fake/main", action=DRAIN))
    worker.run_once()
    assert present(world, *nodes) == nodes[1:]
    worker.run_once()
    worker.run_once()
    assert present(world, *nodes, in_use) == [in_use]
    assert len(events(world, zk_events.SPARE_DRAINED)) == 3


def test_a_drain_after_a_pause_and_spares_that_turn_up_go_at_once(upkeep: MakeUpkeep) -> None:
    """A pass looks at the spares on every change of the pause or drain in force, and on
    every pass while the pool is drained, not only every CHECK_INTERVAL."""
    world = upkeep(body())
    worker, _ = world.pool_worker()
    first = spare(world, ready_for=30)
    worker.run_once()  # a look: nothing to remove (surplus-delay not over)
    world.deps.pool_states.states.append(PoolState(target="fake/main", action=PAUSE))
    worker.run_once()
    assert present(world, first) == [first]
    world.deps.pool_states.states[:] = [PoolState(target="fake/main", action=DRAIN)]
    worker.run_once()  # the same second: the drain is acted on at once
    assert present(world, first) == []
    late = spare(world)  # a launch that was in flight ends
    worker.run_once()
    assert present(world, late) == []


def _at_target(worker: Any) -> tuple[str, str]:
    status = worker.published_status
    assert status is not None
    [found] = [c for c in status["conditions"] if c["type"] == "AtTarget"]
    return found["status"], found["reason"]


def test_at_target_reads_under_over_met_and_draining(upkeep: MakeUpkeep) -> None:
    world = upkeep(body(pool="surplus-delay: 300", small_pool="min-ready: 2"))
    worker, _ = world.pool_worker()
    first = spare(world)
    worker.run_once()
    assert _at_target(worker) == ("False", "UnderTarget")
    spare(world)
    spare(world)
    # New spares of other launchers are looked for every CHECK_INTERVAL: surplus-delay
    # runs from the first look that finds the label over its target.
    world.clock.advance(disruption.CHECK_INTERVAL)
    worker.run_once()
    assert _at_target(worker) == ("True", "OverTarget")
    world.clock.advance(299)
    worker.run_once()
    assert _at_target(worker) == ("True", "OverTarget")
    world.clock.advance(1)
    worker.run_once()  # the surplus goes (the oldest)
    assert world.state(first) is None
    worker.run_once()
    assert _at_target(worker) == ("True", "TargetMet")
    world.deps.pool_states.states.append(PoolState(target="fake/main", action=DRAIN,
                                                   reason="upgrade", by="ops"))
    worker.run_once()
    assert _at_target(worker) == ("Unknown", "Draining")


# -- pure budget arithmetic -------------------------------------------------------------------

def _node(node_id: str) -> model.Node:
    return model.Node(id=node_id, state=model.NodeState.READY, state_time=time.time())


def test_decide_takes_reasons_in_order_within_each_budget() -> None:
    a, b, c, d = (_node(i) for i in "abcd")
    now = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc).timestamp()
    # Defaults: drain unlimited, expiry/drift/surplus one at a time.
    chosen = disruption.decide({"surplus": [a], "drain": [b, c], "expiry": [d]}, (), 10, 0,
                               now)
    assert [(r, n.id) for r, n in chosen] == [("drain", "b"), ("drain", "c")]
    assert [n.id for _, n in disruption.decide({"surplus": [a, b]}, (), 10, 0, now)] == ["a"]
    # A budget for every reason: 20 % of 10 nodes, one of them being deleted already.
    share = DisruptionBudget(max_percent=20)
    chosen = disruption.decide({"expiry": [a, b], "surplus": [c]}, (share,), 10, 1, now)
    assert [n.id for _, n in chosen] == ["a"]
    # A node listed for two reasons goes once, for the first in order.
    chosen = disruption.decide({"drift": [a], "expiry": [a]},
                               (DisruptionBudget(max_nodes=5),), 10, 0, now)
    assert [(r, n.id) for r, n in chosen] == [("expiry", "a")]
    # Outside its window a budget does not apply (the reason's default does)...
    night = DisruptionBudget(reasons=("surplus",), max_nodes=3, schedule="0 0 * * *",
                             duration=HOUR)
    assert disruption.room("surplus", (night,), 10, 0, now) == 1
    assert disruption.room("surplus", (night,), 10, 0, now - 12 * HOUR + 60) == 3
    # ... unless it says what it allows outside (the drift-budget shorthand: nothing).
    closed = dataclasses.replace(night, outside_window=0)
    assert disruption.room("surplus", (closed,), 10, 0, now) == 0
    assert disruption.room("drain", (), 10, 99, now) is None
