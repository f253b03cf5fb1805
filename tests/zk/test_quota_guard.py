"""The remembered guard listing (`QuotaGuard.known_listing`) against a real ZooKeeper.

Aspects: after a guarded commit, the next decision may start from the versions and listing
that commit left (no read); a write by anyone else to the guard makes a decision taken on
it fail with a conflict, and the retry reads afresh and sees the other launcher's nodes;
ids of nodes deleted since are dropped from the remembered listing once found gone; a new
session forgets it; a node this process created and that was gone before the cache showed
it is neither counted nor remembered past `CREATED_TRUST`.
"""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from nodepool_k8s.core import model, quota
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.quota_guard import (CREATED_TRUST, GuardedWrite, QuotaGuard,
                                         commit_guarded)
from nodepool_k8s.zk.txn import Txn

GUARD = paths.provider_guard_path("p")


class NoCache:
    def get(self, node_id: str) -> quota.NodeUsage | None:
        return None

    def unusable(self, node_id: str) -> bool:
        return False


def create_nodes(zkc: ZkClient, guard: QuotaGuard, count: int, *,
                 use_known: bool) -> tuple[list[str], int]:
    """One guarded create of `count` nodes; (ids, attempts made)."""
    zkc.ensure_path(paths.NODES)
    made = [0]

    def attempt() -> GuardedWrite[list[str]]:
        made[0] += 1
        known = guard.known_listing([GUARD]) if use_known and made[0] == 1 else None
        versions, ids = known if known is not None else guard.read_listing([GUARD])
        txn = Txn()
        nodes = [Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
                 for _ in range(count)]
        for node in nodes:
            node.set(provider="p", pool="main")
        indexes = [NodeStore.add_create(txn, n) for n in nodes]

        def committed(results: list[Any]) -> list[str]:
            created = [NodeStore.created_id(results[i]) for i in indexes]
            guard.remember(versions, ids, created)
            return created
        return GuardedWrite(versions, txn, committed)

    created = commit_guarded(zkc, 3, attempt)
    assert isinstance(created, list)
    return created, made[0]


def test_remembered_listing_is_what_a_read_would_return(zkc: ZkClient) -> None:
    guard = QuotaGuard(zkc)
    assert guard.known_listing([GUARD]) is None
    first, _ = create_nodes(zkc, guard, 2, use_known=False)
    second, attempts = create_nodes(zkc, guard, 1, use_known=True)
    assert attempts == 1
    known = guard.known_listing([GUARD])
    assert known is not None
    versions, ids = guard.read_listing([GUARD])
    assert known[0] == versions and sorted(known[1]) == sorted(ids) == sorted(first + second)
    assert guard.known_listing([GUARD, paths.tenant_guard_path("t")]) is None


def test_a_write_by_another_launcher_forces_a_fresh_read(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    guard = QuotaGuard(zkc)
    create_nodes(zkc, guard, 1, use_known=False)
    # Another launcher's guarded create: its node, and the guard bumped.
    other = kazoo_client.create(paths.NODES + "/", b'{"state": "init"}', sequence=True)
    kazoo_client.set(GUARD, b"")
    mine, attempts = create_nodes(zkc, guard, 1, use_known=True)
    assert attempts == 2  # the remembered versions conflicted; the retry read afresh
    known = guard.known_listing([GUARD])
    assert known is not None and paths.basename(other) in known[1]
    versions, ids = guard.read_listing([GUARD])
    assert known[0] == versions and sorted(known[1]) == sorted(ids)
    assert set(mine) <= set(ids)


def test_deleted_nodes_leave_the_remembered_listing(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    guard = QuotaGuard(zkc)
    created, _ = create_nodes(zkc, guard, 3, use_known=False)
    kazoo_client.delete(paths.node_path(created[0]))
    known = guard.known_listing([GUARD])
    assert known is not None and created[0] in known[1]
    records = guard.usage(NoCache(), lambda node: None, ids=known[1])
    assert len(records) == 2
    after = guard.known_listing([GUARD])
    assert after is not None and sorted(after[1]) == sorted(created[1:])


def test_a_deleted_node_found_gone_during_a_decision_stays_out(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """The decision that finds a node gone still holds the listing it started from; its
    commit must not put the gone id back (the listing would grow by every node ever
    deleted, and every decision would read them all again)."""
    guard = QuotaGuard(zkc)
    created, _ = create_nodes(zkc, guard, 2, use_known=False)
    kazoo_client.delete(paths.node_path(created[0]))
    for _ in range(3):
        made: list[str] = []

        def attempt() -> GuardedWrite[list[str]]:
            known = guard.known_listing([GUARD])
            assert known is not None
            versions, ids = known
            guard.usage(NoCache(), lambda node: None, ids=ids)  # finds created[0] gone
            txn = Txn()
            node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
            index = NodeStore.add_create(txn, node)

            def committed(results: list[Any]) -> list[str]:
                made.append(NodeStore.created_id(results[index]))
                guard.remember(versions, ids, made)
                return made
            return GuardedWrite(versions, txn, committed)

        commit_guarded(zkc, 3, attempt)
        known = guard.known_listing([GUARD])
        assert known is not None and created[0] not in known[1]
    versions, ids = guard.read_listing([GUARD])
    assert sorted(known[1]) == sorted(ids) and len(ids) == 4


def test_a_new_session_forgets_the_remembered_listing(zkc: ZkClient) -> None:
    guard = QuotaGuard(zkc)
    create_nodes(zkc, guard, 1, use_known=False)
    assert guard.known_listing([GUARD]) is not None
    zkc._epoch += 1  # what a LOST session does (a new session follows)
    assert guard.known_listing([GUARD]) is None


def test_a_created_node_gone_before_the_cache_showed_it_is_not_kept(
        zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """A node this process created is priced from its own record only until the cache
    shows it or CREATED_TRUST passes: one created, used and deleted between two decisions
    (the cache never showed it to a decision) is neither counted nor kept for ever."""
    clock = ManualClock()
    guard = QuotaGuard(zkc, clock)
    for _ in range(50):
        created, _ = create_nodes(zkc, guard, 1, use_known=True)
        node = Node(id=created[0], state=model.NodeState.INIT, state_time=1.0, type=["small"])
        node.set(provider="p", pool="main")
        guard.note_created([node], created)
        kazoo_client.delete(paths.node_path(created[0]))
        clock.advance(CREATED_TRUST / 10)
        known = guard.known_listing([GUARD])
        assert known is not None
        guard.usage(NoCache(), lambda node: None, ids=known[1])
    # At most the nodes of the last CREATED_TRUST seconds are held.
    assert guard.created_pending() <= 11
    known = guard.known_listing([GUARD])
    assert known is not None and len(known[1]) <= 11
    clock.advance(CREATED_TRUST + 1)
    known = guard.known_listing([GUARD])
    assert known is not None
    assert guard.usage(NoCache(), lambda node: None, ids=known[1]) == []
    assert guard.created_pending() == 0
    after = guard.known_listing([GUARD])
    assert after is not None and after[1] == []
