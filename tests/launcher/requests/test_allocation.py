"""Allocation on its own: the quota check, the guarded create and the reuse of ready
nodes, against a real ZooKeeper with read-through caches (no watch, no thread)."""

from __future__ import annotations

import logging

from nodepool_k8s.core import model
from nodepool_k8s.launcher.requests.allocation import Allocator, Slot, SlotState, create_batch
from nodepool_k8s.zk import paths
from tests.launcher.requests.conftest import MakeDeps
from tests.launcher.requests.support import Deps, InlineLaunches
from tests.launcher.requests.test_handler import handler_for

LOG = logging.LoggerAdapter(logging.getLogger("tests.allocation"), {})


def allocator_for(deps: Deps, labels: list[str]) -> tuple[Allocator, list[Slot]]:
    request, lock = deps.accept(deps.submit(labels))
    allocator = Allocator(deps, deps.ref, deps.provider,  # type: ignore[arg-type]
                          request, lock, LOG)
    return allocator, [Slot(i, label) for i, label in enumerate(labels)]


def configs(deps: Deps):  # type: ignore[no-untyped-def]
    provider_cfg = deps.config.providers["fake"]
    return provider_cfg, provider_cfg.pools["main"]


def guard_version(deps: Deps) -> int | None:
    stat = deps.zk.exists(paths.provider_guard_path("fake"))
    return stat.version if stat is not None else None


def test_creates_init_nodes_for_its_slots_in_one_guarded_write(make_deps: MakeDeps) -> None:
    deps = make_deps()
    allocator, slots = allocator_for(deps, ["small", "small"])

    verdict = allocator.create(slots, *configs(deps))

    assert verdict
    assert guard_version(deps) == 1  # created by the read, bumped once by the create
    for slot in slots:
        assert slot.node is not None and slot.state is SlotState.NEED
        stored = deps.nodes.get(slot.node.id)
        assert stored is not None and stored.state == model.NodeState.INIT
        assert stored.allocated_to == allocator.request.id
        assert not deps.node_cache.is_locked(slot.node.id)


def test_over_the_pool_limit_creates_nothing(make_deps: MakeDeps) -> None:
    deps = make_deps(max_servers=1)
    allocator, slots = allocator_for(deps, ["small", "small"])

    verdict = allocator.create(slots, *configs(deps))

    assert not verdict and verdict.scope == "pool"
    assert deps.nodes.ids() == []
    assert all(slot.node is None for slot in slots)


def test_a_batch_creates_the_leading_requests_that_fit_together(make_deps: MakeDeps) -> None:
    deps = make_deps(max_servers=3)
    batch = [allocator_for(deps, ["small"]), allocator_for(deps, ["small", "small"]),
             allocator_for(deps, ["small"])]

    served = create_batch(deps, batch, *configs(deps))  # type: ignore[arg-type]

    assert served == 2  # 1 + 2 nodes fit max-servers 3; the third request's does not
    assert guard_version(deps) == 1
    assert len(deps.nodes.ids()) == 3
    assert batch[2][1][0].node is None


def test_reuses_a_ready_unallocated_node_of_the_pool(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    first, _ = handler_for(deps, ["small"], launches)
    first.advance()
    launches.run_all()
    [node_id] = deps.nodes.ids()
    got = deps.nodes.lock_and_read(node_id)
    assert got is not None
    lock, node = got
    node.set(allocated_to=None)  # its request went away: a spare
    deps.nodes.store_and_release(node, lock)

    allocator, slots = allocator_for(deps, ["small"])
    allocator.reuse(slots)

    [slot] = slots
    assert slot.state is SlotState.READY and slot.reused
    assert slot.node is not None and slot.node.id == node_id
    assert slot.lock is not None and slot.lock.valid
    stored = deps.nodes.get(node_id)
    assert stored is not None and stored.allocated_to == allocator.request.id
