"""The node store: `/nodepool/nodes/<id>` records and their locks.

Owns: reading node records tolerantly (missing, empty, malformed or unknown-state znodes are
logged with their path and reported as None), creating nodes with 10-digit sequential ids,
locking them (`/nodepool/nodes/<id>/lock`, re-reading after the lock is taken), and every
node write. Writes are guarded: each one is a transaction that also checks that our lock
contender still exists, so the launcher can never write a node while someone else (Zuul)
holds its lock, and a write after session loss fails instead of clobbering.

Failure modes: `LockLost` (our contender is gone), `NoNodeError` (node deleted),
`VersionConflict` (changed behind our back, re-read), `ZkConnectionError`.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from nodepool_k8s.core import model, records
from nodepool_k8s.core.model import Node, NodeState
from nodepool_k8s.core.transition import transition
from nodepool_k8s.zk import errors, locks, multiread, paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.txn import PendingTxn, Txn

log = logging.getLogger("nodepool_k8s.zk.nodes")


def decode(node_id: str, data: bytes, version: int = -1) -> Node:
    """Decode a node znode strictly (see `records`); `records.Malformed` otherwise."""
    return records.guarded(
        lambda raw: Node.from_dict(node_id, records.decode_node(raw), version=version), data)


def parse(node_id: str, data: bytes, version: int = -1) -> Node | None:
    """Decode a node znode; None (reported once, with its path) when it is malformed."""
    try:
        return decode(node_id, data, version)
    except records.Malformed as exc:
        records.REPORTS.report("node", paths.node_path(node_id), version, exc.reason)
        return None


def encode(node: Node) -> bytes:
    return model.dumps(node.to_dict())


def raise_for(exc: errors.TxnFailed, lock_paths: set[str]) -> None:
    """Turn a failed guarded transaction into the error the caller branches on."""
    if exc.path in lock_paths and exc.kind in ("check", "delete"):
        raise errors.LockLost(f"lock contender {exc.path} is gone") from exc
    raise exc.cause from exc


class NodeStore:
    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    # -- reads ---------------------------------------------------------------------------
    def ids(self) -> list[str]:
        return [c for c in (self.zk.get_children(paths.NODES) or []) if paths.is_node_id(c)]

    def get(self, node_id: str) -> Node | None:
        found = self.zk.get(paths.node_path(node_id))
        if found is None:
            return None
        data, stat = found
        return parse(node_id, data, stat.version)

    def is_empty(self, node_id: str) -> bool:
        found = self.zk.get(paths.node_path(node_id))
        return found is not None and not found[0]

    def read_with_locks(self, ids: list[str]) -> list[tuple[str, Node | None, bool]]:
        """Fresh data and "has lock contenders" of many nodes in few round trips."""
        if not ids:
            return []
        ops: list[tuple[str, str]] = []
        for node_id in ids:
            ops += [(multiread.GET, paths.node_path(node_id)),
                    (multiread.CHILDREN, paths.node_lock_path(node_id))]
        results = self.zk.read_many(ops)
        out: list[tuple[str, Node | None, bool]] = []
        for index, node_id in enumerate(ids):
            found, children = results[2 * index], results[2 * index + 1]
            node = parse(node_id, found[0], found[1].version) if found and found[0] else None
            out.append((node_id, node, bool(locks.contenders(children or []))))
        return out

    def contenders(self, node_id: str) -> list[str]:
        return locks.contenders(self.zk.get_children(paths.node_lock_path(node_id)) or [])

    # -- locks ---------------------------------------------------------------------------
    def lock(self, node_id: str, *, blocking: bool = False,
             timeout: float | None = None) -> HeldLock | None:
        try:
            return locks.acquire(self.zk, paths.node_lock_path(node_id), blocking=blocking,
                                 timeout=timeout, makepath=False)
        except errors.NoNodeError:
            return None

    def lock_and_read(self, node_id: str, *, blocking: bool = False,
                      timeout: float | None = None) -> tuple[HeldLock, Node] | None:
        """Lock, then read fresh data; None (lock released) if locked elsewhere or gone."""
        held = self.lock(node_id, blocking=blocking, timeout=timeout)
        if held is None:
            return None
        try:
            node = self.get(node_id)
        except Exception:
            held.release()
            raise
        if node is None:
            held.release()
            return None
        return held, node

    # -- writes --------------------------------------------------------------------------
    @staticmethod
    def add_create(txn: Txn, node: Node) -> int:
        """Queue the sequential create of `node`; its id comes from the commit result."""
        return txn.create(paths.NODE_CREATE_PREFIX, encode(node), sequence=True)

    @staticmethod
    def created_id(result: str) -> str:
        return paths.basename(result)

    def lock_new(self, node: Node, new_state: NodeState,
                 state_time: float) -> HeldLock | None:
        """Lock a node we just created and move it out of `init`, in one transaction.

        Creates the lock dir and our contender and writes `new_state` atomically. Returns
        None when someone else got to the lock first (the node is then left alone).
        """
        return self.lock_new_async(node, new_state, state_time).result()

    def lock_new_async(self, node: Node, new_state: NodeState,
                       state_time: float) -> "PendingLock":
        """`lock_new`, sent now and collected later with `PendingLock.result` (possibly on
        another thread: until then `node` belongs to whoever collects it). The write is of
        a moved copy: `node` itself moves only once the transaction went through."""
        lock_dir = paths.node_lock_path(node.id)
        moved = node.copy()
        transition(moved, new_state, state_time)
        txn = Txn()
        contender = locks.add_fresh_lock(txn, lock_dir)
        data = encode(moved)
        set_idx = txn.set(paths.node_path(node.id), data, version=node.version)
        sent = txn.commit_async(self.zk)
        return PendingLock(self, node, moved, lock_dir, contender, data, set_idx, sent)

    def store(self, node: Node, held: HeldLock) -> None:
        """Write the whole node, only while we hold its lock (and at the version we read)."""
        txn = Txn()
        idx = self.add_store(txn, node, held)
        try:
            results = txn.commit(self.zk)
        except errors.TxnFailed as exc:
            raise_for(exc, {held.child_path})
        except errors.ZkConnectionError:
            self._reconcile(node)
            return
        node.version = results[idx].version

    def store_and_release(self, node: Node, held: HeldLock) -> None:
        """Write the node and release our lock in one transaction."""
        txn = Txn()
        idx = self.add_store(txn, node, held, release=True)
        try:
            results = txn.commit(self.zk)
        except errors.TxnFailed as exc:
            raise_for(exc, {held.child_path})
        except errors.ZkConnectionError:
            self._reconcile(node)  # applied: the same transaction released the lock
            held.mark_released()
            return
        node.version = results[idx].version
        held.mark_released()

    def _reconcile(self, node: Node) -> None:
        """After a lost reply to a write of `node`: adopt the write if it was applied (its
        version moved on by one and the bytes are ours), else raise ZkConnectionError.

        Without this, an applied write whose reply was lost leaves `node.version` one
        behind, and every later guarded write of the node fails with a version conflict
        for as long as we hold it (a node stuck in `building` under our own lock).
        """
        outcome = locks.reconcile_write(self.zk, paths.node_path(node.id), encode(node),
                                        node.version)
        if outcome is None:
            raise errors.ZkConnectionError(f"write of node {node.id} was not applied")
        node.version = outcome[0]

    def add_store(self, txn: Txn, node: Node, held: HeldLock | None,
                  release: bool = False) -> int:
        """Queue a guarded write of `node` (and optionally the release of its lock).

        Returns the index of the set op; after commit, copy `results[i].version` into
        `node.version` (see `apply_versions`).
        """
        if held is not None:
            if not held.valid:
                raise errors.LockLost(f"lock on node {node.id} is no longer ours")
            if not release:
                held.guard(txn)
        idx = txn.set(paths.node_path(node.id), encode(node), version=node.version)
        if held is not None and release:
            held.release_in(txn)
        return idx

    def delete(self, node: Node, held: HeldLock, attempts: int = 5) -> bool:
        """Remove a node we hold locked, with its lock, in one transaction.

        Another launcher's non-blocking lock attempt briefly adds a contender, which makes
        the lock dir non-empty: then `deleted` is written (whoever gets the lock next sees
        it and just removes the znode, as Nodepool does) and the transaction is retried.
        If contenders keep appearing, our lock is released and False returned: the node
        stays in `deleted` for the next cleanup pass. True once the znode is gone.

        Children that are no part of the protocol (anything beside `lock` under the node,
        anything but lock contenders under `lock`) would make every removal fail and keep
        the node counting against quota: they are removed with the node, as Nodepool's
        recursive delete would, and logged once.
        """
        def contended() -> None:
            if node.state != NodeState.DELETED:
                transition(node, NodeState.DELETED, time.time())
                self.store(node, held)
        return self._remove_locked(node.id, held, attempts, -1, contended)

    def _remove_locked(self, node_id: str, held: HeldLock, attempts: int, version: int,
                       contended: Callable[[], None] | None) -> bool:
        """Remove the node znode (at `version`, -1: any) and its lock dir with our lock,
        in one transaction, up to `attempts` times; see `delete` and `delete_unreadable`.
        `contended`: called when another client's contender kept the lock dir non-empty."""
        node_path, lock_dir = paths.node_path(node_id), paths.node_lock_path(node_id)
        for _ in range(attempts):
            txn = Txn()
            held.release_in(txn)
            txn.delete(lock_dir)
            txn.delete(node_path, version=version)
            try:
                txn.commit(self.zk)
                held.mark_released()
                return True
            except errors.TxnFailed as exc:
                if exc.path == held.child_path:
                    raise errors.LockLost(f"lock on node {node_id} is no longer ours") from exc
                if exc.path == node_path and isinstance(exc.cause, errors.NoNodeError):
                    held.release()
                    return True
                if not isinstance(exc.cause, errors.NotEmptyError):
                    raise exc.cause from exc
                if self._remove_strays(node_id, exc.path):
                    continue
            if contended is not None:
                contended()
        held.release()
        return False

    def _remove_strays(self, node_id: str, full: str | None) -> bool:
        """Remove what is not ours to wait for under the node znode or its lock dir (the
        one at `full`, the path the transaction found not empty); whether any was."""
        node_path, lock_dir = paths.node_path(node_id), paths.node_lock_path(node_id)
        parent = lock_dir if full == lock_dir else node_path if full == node_path else None
        if parent is None:
            return False
        children = self.zk.get_children(parent) or []
        if parent == lock_dir:
            strays = [c for c in children if not locks.is_contender(c)]
        else:
            strays = [c for c in children if c != "lock"]
        for child in strays:
            log.warning("Removing %s/%s with node %s: not part of a node's record or lock",
                        parent, child, node_id)
            try:
                self.zk.delete(f"{parent}/{child}", recursive=True)
            except errors.NoNodeError:
                pass
        return bool(strays)

    def delete_unreadable(self, node_id: str, held: HeldLock, version: int,
                          attempts: int = 5) -> bool:
        """Remove a node znode whose record cannot be decoded, with its lock dir, while we
        hold its lock; only if its data is still at `version` (what the caller judged).

        Nothing else is written: no record can be written back for it. Stray children are
        removed as in `delete`; other clients' lock contenders appearing meanwhile make
        the attempt repeat. True once the znode is gone; False (our lock released) when
        contenders kept appearing. `VersionConflict` when the record was rewritten.
        """
        return self._remove_locked(node_id, held, attempts, version, None)

    def delete_unlocked(self, node_id: str) -> None:
        """Remove a znode that holds no usable record (empty data), with its subtree."""
        try:
            self.zk.delete(paths.node_path(node_id), recursive=True)
        except errors.NoNodeError:
            pass


class PendingLock:
    """A sent `lock_new` transaction (see `NodeStore.lock_new_async`): `moved` is the copy
    of `node` it writes; `node` takes the same transition once the write is ours."""

    def __init__(self, store: NodeStore, node: Node, moved: Node, lock_dir: str,
                 contender: str, data: bytes, set_idx: int, sent: PendingTxn) -> None:
        self.store = store
        self.node = node
        self._moved = moved
        self._lock_dir = lock_dir
        self._contender = contender
        self._data = data
        self._set_idx = set_idx
        self._sent = sent

    def _publish(self, version: int) -> None:
        """The write went through: `node` as written, at its new version."""
        moved, node = self._moved, self.node
        assert moved.state_time is not None  # set by `lock_new_async`
        transition(node, moved.state, moved.state_time)
        node.version = version

    def result(self) -> HeldLock | None:
        """Our lock on the node (now in its new state), or None when someone else got to
        the lock first; raises as `Txn.commit` does when neither could be established (the
        node then unchanged)."""
        store, node, zk = self.store, self.node, self.store.zk
        try:
            results = self._sent.result()
        except errors.ZkConnectionError:
            # Ambiguous: the transaction may have been applied. Adopt it if it was.
            adopted = locks.adopt_fresh_lock(zk, paths.node_path(node.id), self._data,
                                             node.version, self._lock_dir, self._contender)
            if adopted is None:
                raise
            version, adopted_lock = adopted
            self._publish(version)
            return adopted_lock
        except errors.TxnFailed as exc:
            if isinstance(exc.cause, errors.NodeExistsError):
                # Someone is contending already: fall back to an ordinary attempt.
                held = store.lock(node.id)
                if held is None:
                    return None
                try:
                    store.store(self._moved, held)
                except Exception:
                    held.release()
                    raise
                self._publish(self._moved.version)
                return held
            raise exc.cause from exc
        self._publish(results[self._set_idx].version)
        return HeldLock(zk, self._lock_dir, self._contender, zk.epoch)
