"""Quota decisions on guard versions counted from the persistent watch instead of read
(zk/guard_versions.py), against a real ZooKeeper.

Aspects: after one `exists` answer per connection, the versions are counted exactly across
this session's own bumps (at once: its event comes before its answer) and another
session's (once their events came), with the node ids consistent with them, and no guard
read; a reconnect, and a guard deleted and created again, fall back to reading it; a commit
beaten by another's retries on the count, while a count in doubt (it did not move, or a
second failure) is read for the retry, so a wrong count costs at most one more failed
commit, never a loop; two sessions deciding at once on counted versions never exceed the
limit.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Callable

import pytest

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.cache import NodeCache
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.quota_guard import GuardedWrite, QuotaGuard, commit_guarded
from nodepool_k8s.zk.txn import Txn
from tests.helpers import Signal, wait_for
from tests.zk.support import GuardReads
from tests.zk.test_guard_ids import GUARD, guarded_create, started
from tests.zk.test_persistent_watch import drop_connection


def version(zkc: ZkClient) -> int:
    stat = zkc.exists(GUARD)
    assert stat is not None
    return stat.version


def own_create(zkc: ZkClient, guard: QuotaGuard,
               meanwhile: Callable[[], object] = lambda: None) -> tuple[str, int]:
    """One node created by a decision on `guard` (as allocation makes it); (id, attempts).
    `meanwhile`: run between the first attempt's decision and its commit."""
    tries = [0]

    def attempt() -> GuardedWrite[str]:
        tries[0] += 1
        versions, _ids = guard.read_listing([GUARD])
        if tries[0] == 1:
            meanwhile()
        txn = Txn()
        node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
        node.set(provider="p", pool="main")
        index = NodeStore.add_create(txn, node)
        return GuardedWrite(versions, txn, lambda results: NodeStore.created_id(
            results[index]))

    made = commit_guarded(zkc, 5, attempt, guard)
    assert isinstance(made, str)
    return made, tries[0]


def counted(guard: QuotaGuard, made: list[str]) -> int:
    """A decision's counted version, checked against its ids: every node created by a
    commit up to that version (the n-th bump created made[n - 1]) is among them."""
    versions, ids = guard.read_listing([GUARD])
    assert set(made[:versions[GUARD]]) <= set(ids), (versions, ids)
    return versions[GUARD]


def test_versions_are_counted_across_own_and_other_sessions_bumps(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)  # the guard at version 0
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        reads = GuardReads(zkc, monkeypatch)
        made: list[str] = []
        made.append(own_create(zkc, guard)[0])  # the one read: the count's base
        assert reads.count == 1
        for turn in range(20):
            if turn % 2:
                made.append(own_create(zkc, guard)[0])
                # Our own bump's event came before our commit's answer: exact at once.
                assert counted(guard, made) == len(made) == version(other)
            else:
                made.append(guarded_create(other))
                # Another's: a version of some moment not after now, until its event came.
                assert counted(guard, made) <= len(made)
                wait_for(lambda: counted(guard, made) == len(made), 15,
                         message="the other session's bump counted")
        assert reads.count == 1
        assert guard.counted > 20
    finally:
        cache.stop()


def test_a_reconnect_reads_the_guard_again(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)
    changes = Signal().listen(cache).listen(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        reads = GuardReads(zkc, monkeypatch)
        made = [own_create(zkc, guard)[0], own_create(zkc, guard)[0]]
        assert reads.count == 1  # the second on the count
        connection = zkc.connections
        drop_connection(zkc)
        changes.until(lambda: zkc.connected and zkc.connections > connection, 60,
                      message="the reconnect")
        # Made while we were away or just after: no event of it may have come to us.
        made.append(guarded_create(other))
        assert counted(guard, made) == len(made)  # read: nothing counts on this connection
        assert reads.count == 2
        before = reads.count
        assert counted(guard, made) == len(made)
        # A busy machine may reconnect once more (a retried handshake): read again then.
        assert reads.count == before or zkc.connections > connection + 1
    finally:
        changes.close()
        cache.stop()


def test_a_guard_deleted_and_created_again_is_read_again(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = started(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        reads = GuardReads(zkc, monkeypatch)
        own_create(zkc, guard)
        own_create(zkc, guard)
        assert reads.count == 1 and version(other) == 2
        other.delete(GUARD)
        other.create(GUARD, b"")
        other.set(GUARD, b"")  # version 1: below what a count on the old base would say
        wait_for(lambda: not guard._counts.holds([GUARD]), 15,  # type: ignore[union-attr]
                 message="the deletion's event")
        assert guard.read_listing([GUARD])[0][GUARD] == 1
        # Its answer came after the creation's and the bump's events: read once more at
        # most (when they came while it was out), then counted.
        assert guard.read_listing([GUARD])[0][GUARD] == 1
        before = reads.count
        assert 2 <= before <= 3
        other.set(GUARD, b"")
        wait_for(lambda: guard.read_listing([GUARD])[0][GUARD] == 2, 15,
                 message="the bump after the re-creation counted")
        assert reads.count == before
    finally:
        cache.stop()


def test_a_commit_beaten_by_another_retries_on_the_count(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bump that beat our commit was counted before its failure came back: the retry
    takes the count, no read."""
    cache = started(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        reads = GuardReads(zkc, monkeypatch)
        own_create(zkc, guard)
        writes = zkc.writes.snapshot()[0]
        _made, attempts = own_create(zkc, guard, lambda: guarded_create(other))
        assert attempts == 2 and zkc.writes.snapshot()[0] - writes == 2
        assert reads.count == 1
        assert version(other) == 3
    finally:
        cache.stop()


@pytest.mark.parametrize("beaten", [False, True])
def test_a_wrong_count_costs_at_most_one_more_failed_commit(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch,
        beaten: bool) -> None:
    """A count one short (it never should be): its commit fails. Not moved since, it is
    read for the retry; moved (another's bump beat us too), the retry takes it, fails once
    more and then reads. Either way the next decisions count right again."""
    cache = started(zkc)
    try:
        guard = QuotaGuard(zkc, nodes=cache)
        reads = GuardReads(zkc, monkeypatch)
        own_create(zkc, guard)
        counts = guard._counts
        assert counts is not None
        counts._base[GUARD] -= 1
        writes = zkc.writes.snapshot()[0]
        _made, attempts = own_create(
            zkc, guard, (lambda: guarded_create(other)) if beaten else (lambda: None))
        assert attempts == (3 if beaten else 2)
        assert zkc.writes.snapshot()[0] - writes == attempts
        assert reads.count == 2
        expected = 3 if beaten else 2
        assert guard.read_listing([GUARD])[0][GUARD] == expected
        assert reads.count == 2  # counted again from the new base
        assert version(other) == expected
    finally:
        cache.stop()


LIMIT = 6
CREATIONS = 40


def test_two_sessions_racing_on_counted_versions_never_exceed_the_limit(
        zkc: ZkClient, other: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three deciding threads per session, and a deleter that frees a node whenever the
    limit is reached. Deletions bump the guard too here (unconditionally, so they never
    fail), which orders every change by the guard's version: the node count after each
    one, summed in that order, never passes the limit."""
    caches = [started(zkc), started(other)]
    guards = [QuotaGuard(client, nodes=cache) for client, cache in zip((zkc, other), caches)]
    reads = [GuardReads(client, monkeypatch) for client in (zkc, other)]
    changes: list[tuple[int, int]] = []  # (guard version after, +1 created / -1 deleted)
    lock = threading.Lock()
    created = [0]
    tried = [0]  # commits sent (each failed one lost on the guard)
    failures: list[BaseException] = []
    stop = threading.Event()
    room = threading.Event()  # set by each deletion

    def decide(client: ZkClient, cache: NodeCache, guard: QuotaGuard) -> None:
        def attempt() -> GuardedWrite[None] | bool:
            versions, ids = guard.read_listing([GUARD])
            if len(guard.usage(cache, lambda node: None, ids=ids)) >= LIMIT:
                return False
            with lock:
                tried[0] += 1
            txn = Txn()
            node = Node(id="", state=model.NodeState.INIT, state_time=1.0, type=["small"])
            node.set(provider="p", pool="main")
            NodeStore.add_create(txn, node)

            def committed(results: list[Any]) -> bool:
                with lock:
                    changes.append((results[-1].version, 1))
                    created[0] += 1
                return True
            return GuardedWrite(versions, txn, committed)

        try:
            while not stop.is_set():
                with lock:
                    if created[0] >= CREATIONS:
                        return
                room.clear()
                if commit_guarded(client, 50, attempt, guard) is False:
                    room.wait(0.1)  # the limit reached: until a deletion (or a look again)
        except BaseException as exc:
            failures.append(exc)

    def delete() -> None:
        rng = random.Random(7)
        try:
            while not stop.is_set():
                with lock:
                    if created[0] >= CREATIONS:
                        return
                present = other.get_children(paths.NODES) or []
                if len(present) < LIMIT:
                    stop.wait(0.001)
                    continue
                txn = Txn()
                txn.delete(paths.node_path(rng.choice(present)))
                txn.set(GUARD, b"")
                try:
                    results = txn.commit(other)
                except Exception:
                    continue  # deleted by nobody else: cannot happen; retried anyway
                with lock:
                    changes.append((results[-1].version, -1))
                room.set()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=decide, args=(client, cache, guard))
               for client, cache, guard in zip((zkc, other), caches, guards)
               for _ in range(3)]
    threads.append(threading.Thread(target=delete))
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    finally:
        stop.set()
        for cache in caches:
            cache.stop()
    assert not failures, failures
    count, highest = 0, 0
    for _version, delta in sorted(changes):
        count += delta
        highest = max(highest, count)
    assert highest <= LIMIT
    assert count == len(other.get_children(paths.NODES) or [])
    read = sum(r.count for r in reads)
    conflicts = tried[0] - created[0]
    print(f"{tried[0]} commits, {conflicts} lost on the guard, {read} guard reads, "
          f"{sum(g.counted for g in guards)} versions counted")
    # A read is a session's first, or follows a lost commit (or a read whose guard moved
    # while it was out): the decisions in between count.
    assert read <= 2 * (conflicts + 2)
