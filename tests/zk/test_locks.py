"""Locks in kazoo's recipe format: interoperation with kazoo's `Lock` (what Zuul uses) in
both directions, contender naming, timeouts, never resurrecting a deleted node, release."""

from __future__ import annotations

import re
import threading

from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

import pytest

from nodepool_k8s.zk import errors, locks
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.txn import Txn


def test_contender_format_and_kazoo_interop(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path("/nodepool/nodes/0000000001")
    held = locks.acquire(zkc, "/nodepool/nodes/0000000001/lock", makepath=False)
    assert held is not None
    children = kazoo_client.get_children("/nodepool/nodes/0000000001/lock")
    assert len(children) == 1 and re.fullmatch(r"[0-9a-f]{32}__lock__\d{10}", children[0])
    zuul_lock = Lock(kazoo_client, "/nodepool/nodes/0000000001/lock")
    assert not zuul_lock.acquire(blocking=False)
    held.release()
    assert zuul_lock.acquire(blocking=False)
    assert locks.acquire(zkc, "/nodepool/nodes/0000000001/lock") is None
    zuul_lock.release()
    assert kazoo_client.get_children("/nodepool/nodes/0000000001/lock") == []


def test_blocking_acquire_waits_for_release(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    zuul_lock = Lock(kazoo_client, "/nodepool/requests-lock/200-0000000001")
    assert zuul_lock.acquire()
    assert locks.acquire(zkc, "/nodepool/requests-lock/200-0000000001", blocking=True,
                         timeout=0.2) is None
    got: list[locks.HeldLock | None] = []
    waiter = threading.Thread(target=lambda: got.append(locks.acquire(
        zkc, "/nodepool/requests-lock/200-0000000001", blocking=True, timeout=10)))
    waiter.start()
    zuul_lock.release()
    waiter.join(15)
    assert got and got[0] is not None and got[0].valid
    # The timed-out attempt left no contender behind.
    assert len(kazoo_client.get_children("/nodepool/requests-lock/200-0000000001")) == 1


def test_node_lock_never_recreates_a_deleted_node(zkc: ZkClient,
                                                  kazoo_client: KazooClient) -> None:
    kazoo_client.ensure_path("/nodepool/nodes")
    with pytest.raises(errors.NoNodeError):
        locks.acquire(zkc, "/nodepool/nodes/0000000042/lock", makepath=False)
    assert NodeStore(zkc).lock("0000000042") is None
    assert kazoo_client.exists("/nodepool/nodes/0000000042") is None


def test_guard_and_release_in_transaction(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    kazoo_client.create("/x", b"1")
    held = locks.acquire(zkc, "/x-lock")
    assert held is not None
    txn = Txn()
    held.guard(txn)
    txn.set("/x", b"2")
    txn.commit(zkc)
    txn = Txn()
    txn.set("/x", b"3")
    held.release_in(txn)
    txn.commit(zkc)
    held.mark_released()
    assert kazoo_client.get("/x")[0] == b"3"
    assert kazoo_client.get_children("/x-lock") == []
    assert not held.valid
    held.release()  # idempotent


def test_contenders_sorted_by_sequence() -> None:
    names = ["b" * 32 + "__lock__0000000003", "a" * 32 + "__lock__0000000001", "junk"]
    assert locks.contenders(names) == [names[1], names[0]]


def test_reconcile_an_ambiguous_commit(zkc: ZkClient, kazoo_client: KazooClient) -> None:
    """After a lost reply, a write is recognised as applied by the version it produced and
    its exact bytes, and the lock as ours by our contender; anything else is not applied."""
    kazoo_client.create("/nodepool/requests-lock/100-1", b"", makepath=True)
    kazoo_client.create("/nodepool/requests/100-1", b"old", makepath=True)
    contender = "/nodepool/requests-lock/100-1/abc__lock__0000000000"
    # Applied (version 0 -> 1, our bytes) with our contender: adopt the lock.
    txn = Txn()
    txn.set("/nodepool/requests/100-1", b"ours", version=0)
    txn.create(contender, b"", ephemeral=True)
    txn.commit(zkc)
    assert locks.reconcile_write(zkc, "/nodepool/requests/100-1", b"ours", 0,
                                 contender) == (1, True)
    # Applied, but the contender is gone (session changed since): not ours.
    kazoo_client.delete(contender)
    assert locks.reconcile_write(zkc, "/nodepool/requests/100-1", b"ours", 0,
                                 contender) == (1, False)
    # Not applied: other bytes, or another version.
    assert locks.reconcile_write(zkc, "/nodepool/requests/100-1", b"mine", 0) is None
    kazoo_client.set("/nodepool/requests/100-1", b"ours")
    assert locks.reconcile_write(zkc, "/nodepool/requests/100-1", b"ours", 0) is None
    assert locks.reconcile_write(zkc, "/nodepool/requests/100-2", b"ours", 0) is None
