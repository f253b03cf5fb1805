"""ZooKeeper operations only an operator tool performs: a bounded connect and lock breaking.

Owns: `connect` (one ZooKeeper session for a short-lived command: unlike the launcher, which
retries forever, it gives up after a deadline) and `break_lock` (take a lock away from its
current holder, for `nodepool delete --force`). The launcher never calls either.

Breaking a lock deletes the contender znodes ahead of ours, in the kazoo `Lock` recipe
format that Zuul and our launcher use. The former holder is not told: a launcher notices
(every one of its node writes checks that its contender still exists, so it fails with
`LockLost` instead of writing); Zuul does not check and notices only when it next writes
the node. Callers must therefore re-read the object under the broken lock and only then
decide what to write.

Failure modes: `connect` raises `ZkConnectionError` when no session could be established
before the deadline and `ZkAuthError` when ZooKeeper refuses the configured credentials
(`zookeeper-auth`, `zookeeper-tls`) or they cannot use the tree; `break_lock` raises
`NoNodeError` when the lock's parent (the node) is gone, `LockNotAcquired` when contenders
keep reappearing, and `ZkConnectionError`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from dataclasses import dataclass

from nodepool_k8s.core.errors import LockNotAcquired
from nodepool_k8s.zk import errors, locks, paths
from nodepool_k8s.zk.client import ZkClient, ZkSettings
from nodepool_k8s.zk.locks import HeldLock

log = logging.getLogger("nodepool_k8s.zk.admin")

BREAK_ROUNDS = 5


def connect(settings: ZkSettings, timeout: float) -> ZkClient:
    """A started client, or `ZkConnectionError` once `timeout` seconds have passed."""
    # One connect attempt may use the whole budget; the stop event ends the retry loop of
    # `ZkClient.start` (which the launcher runs without a deadline).
    bounded = dataclasses.replace(settings, connect_attempt_timeout=timeout)
    client = ZkClient(bounded)
    give_up = threading.Event()
    timer = threading.Timer(timeout, give_up.set)
    timer.daemon = True
    timer.start()
    try:
        connected = client.start(give_up)
    finally:
        timer.cancel()
    if not connected:
        client.stop()
        raise errors.ZkConnectionError(
            f"cannot connect to ZooKeeper at {settings.hosts} within {timeout:g}s")
    return client


@dataclass(frozen=True)
class BrokenLock:
    """The lock we now hold, and the contenders we removed to get it."""

    held: HeldLock
    removed: tuple[str, ...]


def break_lock(zk: ZkClient, path: str, identifier: str = "") -> BrokenLock:
    """Take the lock at `path` now, deleting every contender ahead of ours.

    Waiters ahead of us are removed too: kazoo's recipe re-queues a waiter whose contender
    vanished (behind us), and our own `locks.acquire` raises `LockLost`. The lock dir must
    exist or be creatable under an existing parent (a deleted node raises `NoNodeError`).
    """
    node = _create_contender(zk, path, identifier.encode("utf8"))
    held = HeldLock(zk, path, node, zk.epoch)
    removed: list[str] = []
    try:
        for _ in range(BREAK_ROUNDS):
            ahead = _ahead_of(zk.get_children(path) or [], node)
            if not ahead:
                return BrokenLock(held, tuple(removed))
            # Nearest first, the holder last: a waiter acts only when its predecessor
            # vanishes, and by then its own contender is gone, so it re-queues behind us.
            # Holder first would let the next waiter believe it got the lock.
            for contender in reversed(ahead):
                try:
                    zk.delete(f"{path}/{contender}")
                    removed.append(contender)
                except errors.NoNodeError:
                    pass  # released meanwhile
    except BaseException:
        held.release()
        raise
    held.release()
    raise LockNotAcquired(f"lock {path} is contended again after {BREAK_ROUNDS} attempts")


def _ahead_of(children: list[str], own: str) -> list[str]:
    if own not in children:
        raise errors.LockLost(f"own lock contender {own} vanished")
    own_seq = paths.lock_sequence(own)
    return [c for c in locks.contenders(children) if paths.lock_sequence(c) < own_seq]


def _create_contender(zk: ZkClient, path: str, data: bytes) -> str:
    prefix = f"{path}/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}"
    try:
        return paths.basename(zk.create(prefix, data, ephemeral=True, sequence=True))
    except errors.NoNodeError:
        pass
    # Create only the lock dir: its parent must exist, so a deleted node is not resurrected.
    try:
        zk.create(path, b"")
    except errors.NodeExistsError:
        pass
    return paths.basename(zk.create(prefix, data, ephemeral=True, sequence=True))
