"""Exclusive locks in the kazoo `Lock` recipe format, as Zuul and Nodepool take them.

Owns: acquiring and releasing a lock dir's contender znode, and telling contenders no
session will release (persistent ones, `not_ephemeral`). The wire format is the recipe's:
an ephemeral sequential child `<uuid4hex>__lock__<seq10>` under the lock dir; the contender
with the lowest sequence holds the lock; a waiter watches its predecessor only. Interoperates
with `kazoo.recipe.lock.Lock` (used by Zuul) in both directions.

Why not kazoo's `Lock` object itself: the launcher needs the contender path to guard writes
in transactions ("only if my contender still exists") and to release a lock in the same
transaction as the final write, and it must never recreate a deleted node's znode through
`ensure_path` of `<node>/lock` (kazoo's recipe does that, leaving empty node znodes).

Failure modes: `acquire` returns None when the lock is held by someone else (non-blocking),
not obtained in time, or its lock dir vanished again as soon as it was created (a request's
taker removes the dir when it closes the request); it raises `NoNodeError` when the lock's
parent znode is gone (for node locks: the node was deleted) and `ZkConnectionError` /
`ZkSessionLost` when ZooKeeper is unreachable (its own contender is then removed on a
best-effort basis).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field

from nodepool_k8s.zk import errors, multiread, paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.txn import Txn

log = logging.getLogger("nodepool_k8s.zk.locks")

_CONTENDER = re.compile(r"__lock__(-?\d{10})$")
# Any contender of kazoo's lock recipes (exclusive and write: __lock__, read: __rlock__).
_ANY_CONTENDER = re.compile(r"__r?lock__-?\d{10}$")


@dataclass(eq=False)
class HeldLock:
    """A lock we hold: the lock dir, our contender name and the session epoch it lives in.

    Every instance registers itself (weakly) as live work of this process; the orphan
    self-check (`orphaned_contenders`) releases contenders of our session that no live
    `HeldLock` stands for.
    """

    zk: ZkClient
    path: str
    node: str
    epoch: int
    released: bool = field(default=False)

    def __post_init__(self) -> None:
        _LIVE.add(self)
        _BY_PATH[self.child_path] = self

    @property
    def child_path(self) -> str:
        return f"{self.path}/{self.node}"

    @property
    def valid(self) -> bool:
        """False once released or when the session that created it has expired."""
        return not self.released and self.zk.epoch == self.epoch

    def guard(self, txn: Txn) -> None:
        """Make `txn` fail unless our contender still exists (we still hold the lock)."""
        txn.check(self.child_path)

    def release_in(self, txn: Txn) -> None:
        """Release as part of `txn`; call `mark_released` after it committed."""
        txn.delete(self.child_path)

    def remove_dir_in(self, txn: Txn) -> None:
        """Queue deleting the lock dir itself, after `release_in`: optional, so another
        contender in it (or the dir gone already) leaves it and the rest still commits."""
        txn.delete(self.path, optional=True)

    def mark_released(self) -> None:
        self.released = True

    def release(self) -> None:
        """Delete our contender. Idempotent; a lock of an expired session is already gone."""
        if self.released:
            return
        self.released = True
        if self.zk.epoch != self.epoch:
            return
        try:
            self.zk.delete(self.child_path)
        except errors.NoNodeError:
            pass
        except (errors.ZkConnectionError, errors.ZkSessionLost) as exc:
            # If the session survives, the contender would stay: retry once connected.
            log.warning("could not release lock %s (%s); retrying", self.child_path, exc)
            if self.zk.wait_connected(self.zk.settings.timeout) and self.zk.epoch == self.epoch:
                try:
                    self.zk.delete(self.child_path)
                except errors.NoNodeError:
                    pass


def add_fresh_lock(txn: Txn, path: str) -> str:
    """Queue creating lock dir `path` together with our contender in it.

    Valid only as part of a transaction: if the dir does not exist yet, nobody else can be
    contending, so the transaction takes the lock and does its other writes atomically (one
    write instead of a create, a get_children and the writes). The contender is named like
    the first one kazoo's recipe would create (`<uuid>__lock__0000000000`). If the dir
    already exists the transaction fails with NodeExistsError on `path`: use `acquire`.
    Returns the contender's name.
    """
    node = f"{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}{0:010d}"
    txn.create(path, b"")
    txn.create(f"{path}/{node}", b"", ephemeral=True)
    return node


def reconcile_write(zk: ZkClient, path: str, data: bytes, old_version: int,
                    contender: str | None = None) -> tuple[int, bool] | None:
    """After a connection loss on a commit that wrote `data` to `path` (at `old_version`):
    was it applied? Returns (new version, our contender still exists) when it was, None
    when it was not. Raises ZkConnectionError while ZooKeeper stays unreachable.

    A lost reply leaves a transaction's outcome unknown; treating it as "not applied" would
    orphan what it created (a lock held by our own live session, a node in `building`).
    The write is recognised by the version it produced and the exact bytes.
    """
    if not zk.wait_connected(zk.settings.timeout):
        raise errors.ZkConnectionError(f"cannot tell whether the write of {path} applied")
    found = zk.get(path)
    if found is None or found[1].version != old_version + 1 or found[0] != data:
        return None
    held = contender is not None and zk.exists(contender) is not None
    return found[1].version, held


def adopt_fresh_lock(zk: ZkClient, path: str, data: bytes, old_version: int, lock_dir: str,
                     contender: str, *, released: bool = False
                     ) -> tuple[int, HeldLock] | None:
    """After a lost reply to a transaction that wrote `data` to `path` and took a fresh
    lock (`add_fresh_lock`; given back in the same transaction when `released`): (the new
    version, the lock) if it was applied, None if not. LockLost when it was applied but
    our contender is gone since (the session that held it ended)."""
    outcome = reconcile_write(zk, path, data, old_version,
                              None if released else f"{lock_dir}/{contender}")
    if outcome is None:
        return None
    version, ours = outcome
    if not released and not ours:
        raise errors.LockLost(f"lock {lock_dir} lost after the commit that took it")
    return version, HeldLock(zk, lock_dir, contender, zk.epoch, released=released)


_LIVE: "weakref.WeakSet[HeldLock]" = weakref.WeakSet()
_BY_PATH: "weakref.WeakValueDictionary[str, HeldLock]" = weakref.WeakValueDictionary()


def held_here(zk: ZkClient, contender_path: str) -> bool:
    """Whether the contender at `contender_path` is a lock `zk`'s own live work holds
    (not released, still referenced); quick, reads no ZooKeeper."""
    held = _BY_PATH.get(contender_path)
    return held is not None and held.zk is zk and not held.released


def live_contenders() -> set[str]:
    """Contender paths held by live work of this process (not released, still referenced)."""
    return {held.child_path for held in list(_LIVE) if not held.released}


def orphaned_contenders(zk: ZkClient, lock_dirs: list[str]) -> list[str]:
    """Contenders under `lock_dirs` that our own session owns but no live work holds.

    Such a lock can never be released by anyone (the session is alive, the work that took
    it is gone), so what it guards would stay locked forever.
    """
    session = zk.session_id
    if session is None:
        return []
    live = live_contenders()
    candidates = [path for lock_dir, names in contenders_of(zk, lock_dirs).items()
                  for name in names if (path := f"{lock_dir}/{name}") not in live]
    return [path for path, owner in owners(zk, candidates).items() if owner == session]


def contenders_of(zk: ZkClient, lock_dirs: list[str]) -> dict[str, list[str]]:
    """The lock contenders (`contenders`) under each of `lock_dirs` that has any, read in
    few round trips (a missing dir has none)."""
    results = zk.read_many([(multiread.CHILDREN, d) for d in lock_dirs]) if lock_dirs else []
    found = {d: contenders(children or []) for d, children in zip(lock_dirs, results)}
    return {d: names for d, names in found.items() if names}


def owners(zk: ZkClient, contender_paths: list[str]) -> dict[str, int]:
    """Each of `contender_paths` that still exists -> the session owning it (its
    ephemeralOwner; 0 for a persistent znode), read in few round trips."""
    results = zk.read_many([(multiread.GET, p) for p in contender_paths]) \
        if contender_paths else []
    return {path: found[1].ephemeralOwner
            for path, found in zip(contender_paths, results) if found is not None}


def not_ephemeral(zk: ZkClient, contender_paths: list[str]) -> list[str]:
    """Those of `contender_paths` that are persistent znodes.

    A lock contender is meant to be ephemeral (kazoo's recipe, Zuul's, Nodepool's and
    ours), so that it goes when its session ends; a persistent one (left by a tool or a
    hand edit) is released by no session, and what it locks stays locked for ever. A
    contender gone meanwhile is not returned."""
    return [path for path, owner in owners(zk, contender_paths).items() if not owner]


def contenders(children: list[str]) -> list[str]:
    """Lock contender names, lowest sequence (the holder) first."""
    found = [(m.group(1), c) for c in children if (m := _CONTENDER.search(c))]
    return [c for _, c in sorted(found)]


def is_contender(name: str) -> bool:
    """Whether a lock dir's child is some client's lock contender (ours to wait for)."""
    return _ANY_CONTENDER.search(name) is not None


def _predecessor(children: list[str], own: str) -> str | None:
    own_seq = paths.lock_sequence(own)
    lower = [(m.group(1), c) for c in children
             if (m := _CONTENDER.search(c)) and m.group(1) < own_seq]
    return max(lower)[1] if lower else None


def acquire(zk: ZkClient, path: str, *, blocking: bool = False, timeout: float | None = None,
            makepath: bool = True, identifier: str = "") -> HeldLock | None:
    """Take the lock at `path`; None if not obtained (held elsewhere / timed out).

    `makepath=False` (node locks) refuses to create missing parents: a deleted node then
    raises NoNodeError instead of being resurrected as an empty znode.
    """
    prefix = uuid.uuid4().hex + paths.LOCK_NODE_NAME
    data = identifier.encode("utf8")
    node = _create_contender(zk, path, prefix, data, makepath)
    if node is None:
        return None
    # The session counter after the create: read before it, a session change in between
    # would make `release()` skip deleting a contender that our new session owns.
    held = HeldLock(zk, path, node, zk.epoch)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            children = zk.get_children(path) or []
            if node not in children:
                raise errors.LockLost(f"own lock contender {path}/{node} vanished")
            pred = _predecessor(children, node)
            if pred is None:
                return held
            if not blocking:
                break
            woke = threading.Event()
            if zk.watch_exists(f"{path}/{pred}", lambda _e: woke.set()) is None:
                continue
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            if not woke.wait(remaining) and deadline is not None \
                    and time.monotonic() >= deadline:
                break
    except BaseException:
        held.release()
        raise
    held.release()
    return None


def _create_contender(zk: ZkClient, path: str, prefix: str, data: bytes,
                      makepath: bool) -> str | None:
    """Our contender's name; None when the lock dir went again right after we created it
    (its owner removed it: a request closed by its taker, a node being deleted), which is
    a lost race, not an error: what it locked is not to be worked on."""
    for _ in range(2):
        try:
            created = zk.create(f"{path}/{prefix}", data, ephemeral=True, sequence=True)
            return paths.basename(created)
        except errors.NoNodeError:
            if not makepath:
                # Create only the lock dir itself; its parent must exist.
                try:
                    zk.create(path, b"")
                except errors.NodeExistsError:
                    pass
            else:
                zk.ensure_path(path)
        except errors.ZkConnectionError:
            # The create may have succeeded without us hearing back: find it by prefix.
            if not zk.wait_connected(zk.settings.timeout):
                raise
            for child in zk.get_children(path) or []:
                if child.startswith(prefix):
                    return child
            raise
    log.debug("lock dir %s vanished twice while we contended: not locked", path)
    return None
