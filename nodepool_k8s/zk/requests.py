"""The request store: `/nodepool/requests/<prio>-<seq>` records and their locks.

Owns: reading requests tolerantly (unusable znodes are logged with their path and skipped),
request locks at `/nodepool/requests-lock/<id>` (never under the request znode), guarded
versioned writes that keep every key the requestor wrote, creating our own min-ready
requests (ephemeral, carrying every key Zuul's reader indexes), and the few deletions a
launcher may do: its own min-ready requests, the lock dir of a request it closes and
orphaned lock dirs.

Closing a request (`fulfilled` or `failed`, written with the lock released) deletes its lock
dir in the same transaction, after our contender: nobody works on a closed request again,
Zuul never deletes a lock dir, and other launchers' request caches take the dir's deletion
as "closed by its taker" and read nothing more of it (mirror.py, "Reads skipped"). The
deletion is optional (`Txn.delete`): if another contender is in the dir (Zuul revising the
request, another launcher trying it) or the dir is gone, the close commits without it, and
whoever locks a request whose dir went meanwhile finds it not locked (`locks.acquire`).

It never deletes another requestor's request and never creates a child under a request.

Failure modes: as `zk.nodes` (LockLost, NoNodeError when the request was deleted,
VersionConflict, ZkConnectionError).
"""

from __future__ import annotations

import logging
import uuid

from nodepool_k8s.core import model, records
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.zk import errors, locks, paths
from nodepool_k8s.zk.client import Stat, ZkClient
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import raise_for
from nodepool_k8s.zk.txn import PendingTxn, Txn

log = logging.getLogger("nodepool_k8s.zk.requests")


def decode(request_id: str, data: bytes, version: int = -1) -> NodeRequest:
    """Decode a request znode strictly (see `records`); `records.Malformed` otherwise."""
    return records.guarded(
        lambda raw: NodeRequest.from_dict(request_id, records.decode_request(raw),
                                          version=version), data)


def parse(request_id: str, data: bytes, version: int = -1) -> NodeRequest | None:
    """Decode a request znode; None (reported once, with its path) when it is malformed."""
    try:
        return decode(request_id, data, version)
    except records.Malformed as exc:
        records.REPORTS.report("request", paths.request_path(request_id), version,
                               exc.reason)
        return None


def closes(request: NodeRequest) -> bool:
    """Whether writing `request` (with its lock released) closes it: nobody serves it
    again, only its requestor reads it and deletes it."""
    return request.state in (model.RequestState.FULFILLED, model.RequestState.FAILED)


def encode(request: NodeRequest) -> bytes:
    return model.dumps(request.to_dict())


def min_ready_request(label: str, now: float, pool: str | None = None) -> NodeRequest:
    """A min-ready request: every key Zuul's `NodeRequest.fromDict` indexes is present.
    `pool` (`<provider>/<pool>`): a pool-level one, served by that pool only."""
    return NodeRequest(id="", state=model.RequestState.REQUESTED, state_time=now,
                       node_types=[label], reuse=False, requestor=model.MIN_READY_REQUESTOR,
                       requestor_data=None, provider=None, relative_priority=0,
                       event_id=uuid.uuid4().hex, created_time=now, tenant_name=None,
                       extra={model.MIN_READY_POOL: pool} if pool else {})


class RequestStore:
    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    # -- reads ---------------------------------------------------------------------------
    def ids(self) -> list[str]:
        return [c for c in (self.zk.get_children(paths.REQUESTS) or [])
                if paths.is_request_id(c)]

    def get(self, request_id: str) -> NodeRequest | None:
        found = self.get_with_stat(request_id)
        return found[0] if found else None

    def get_with_stat(self, request_id: str) -> tuple[NodeRequest, Stat] | None:
        found = self.zk.get(paths.request_path(request_id))
        if found is None:
            return None
        data, stat = found
        request = parse(request_id, data, stat.version)
        return (request, stat) if request is not None else None

    def exists(self, request_id: str) -> bool:
        return self.zk.exists(paths.request_path(request_id)) is not None

    def lock_contenders(self, request_id: str) -> list[str]:
        return locks.contenders(
            self.zk.get_children(paths.request_lock_path(request_id)) or [])

    def held_elsewhere(self, request_id: str) -> bool:
        """Whether any client's lock contender (an exclusive or a read lock) is in the
        request's lock dir now."""
        children = self.zk.get_children(paths.request_lock_path(request_id)) or []
        return any(locks.is_contender(child) for child in children)

    # -- locks ---------------------------------------------------------------------------
    def lock(self, request_id: str, *, blocking: bool = False,
             timeout: float | None = None) -> HeldLock | None:
        return locks.acquire(self.zk, paths.request_lock_path(request_id),
                             blocking=blocking, timeout=timeout, makepath=True)

    def lock_and_read(self, request_id: str, *, look_first: bool = False
                      ) -> tuple[HeldLock, NodeRequest] | None:
        """Non-blocking lock, then a fresh read; None (lock released) if busy or gone.

        `look_first`: list the lock dir before contending and give up, writing nothing,
        while somebody's contender is in it (a lost attempt costs a contender's create and
        deletion; the listing is one the attempt would read anyway)."""
        if look_first and self.held_elsewhere(request_id):
            return None
        held = self.lock(request_id)
        if held is None:
            return None
        try:
            request = self.get(request_id)
        except Exception:
            held.release()
            raise
        if request is None:
            held.release()
            return None
        return held, request

    # -- writes --------------------------------------------------------------------------
    def add_store(self, txn: Txn, request: NodeRequest, held: HeldLock,
                  release: bool = False) -> int:
        """Queue a guarded, versioned write of the whole request (all requestor keys kept).
        With `release` the lock is given back in `txn`; a request it closes loses its
        lock dir too (module doc)."""
        if not held.valid:
            raise errors.LockLost(f"lock on request {request.id} is no longer ours")
        if not release:
            held.guard(txn)
        idx = txn.set(paths.request_path(request.id), encode(request),
                      version=request.version)
        if release:
            held.release_in(txn)
            if closes(request):
                held.remove_dir_in(txn)
        return idx

    def store(self, request: NodeRequest, held: HeldLock, release: bool = False) -> None:
        txn = Txn()
        idx = self.add_store(txn, request, held, release)
        try:
            results = txn.commit(self.zk)
        except errors.TxnFailed as exc:
            raise_for(exc, {held.child_path})
        except errors.ZkConnectionError:
            # Ambiguous: adopt the write if it was applied (see locks.reconcile_write), so
            # the request's version stays right for the writes that follow.
            outcome = locks.reconcile_write(self.zk, paths.request_path(request.id),
                                            encode(request), request.version)
            if outcome is None:
                raise
            request.version = outcome[0]
        else:
            request.version = results[idx].version
        if release:
            held.mark_released()

    def store_fresh(self, request: NodeRequest, *, release: bool) -> HeldLock | None:
        """Lock a request whose lock dir does not exist yet and write it, in one transaction.

        The versioned write stands in for the re-read after locking: it fails if the
        request changed since `request` was read. With `release` the lock is taken and
        given back in the same transaction (a decline). Returns the held lock (or a
        released one), None when the lock dir already exists (use `lock_and_read`).
        Raises NoNodeError / VersionConflict when the request is gone or changed.
        """
        return self.store_fresh_async(request, release=release).result()

    def store_fresh_async(self, request: NodeRequest, *, release: bool) -> "PendingFresh":
        """`store_fresh`, sent now and collected later with `PendingFresh.result`: a pool
        worker accepting several requests sends all their transactions before waiting."""
        lock_dir = paths.request_lock_path(request.id)
        txn = Txn()
        contender = locks.add_fresh_lock(txn, lock_dir)
        data = encode(request)
        idx = txn.set(paths.request_path(request.id), data, version=request.version)
        if release:
            txn.delete(f"{lock_dir}/{contender}")
            if closes(request):
                # Created in this transaction, so nobody else can be in it.
                txn.delete(lock_dir)
        return PendingFresh(self, request, release, lock_dir, contender, data, idx,
                            txn.commit_async(self.zk))

    @staticmethod
    def add_create(txn: Txn, request: NodeRequest, priority: str, *,
                   ephemeral: bool) -> int:
        return txn.create(paths.request_create_prefix(priority), encode(request),
                          ephemeral=ephemeral, sequence=True)

    def delete_own_min_ready(self, txn: Txn, request: NodeRequest, stat: Stat) -> None:
        """Queue deleting a min-ready request this session created (the only kind we may)."""
        if request.requestor != model.MIN_READY_REQUESTOR \
                or stat.ephemeral_owner != self.zk.session_id:
            raise errors.NotOurs(f"request {request.id} is not our own min-ready request")
        txn.delete(paths.request_path(request.id), version=stat.version)

    # -- request-lock dirs ---------------------------------------------------------------
    def lock_dir_ids(self) -> list[str]:
        return self.zk.get_children(paths.REQUEST_LOCKS) or []

    def delete_orphan_lock_dir(self, request_id: str, older_than: float) -> bool:
        """Delete `/nodepool/requests-lock/<id>` if its request is gone, it has no contenders
        and it was last changed no later than `older_than` (its mtime, ZooKeeper's clock:
        the caller passes the mtime it judged old, so a changed dir is kept)."""
        path = paths.request_lock_path(request_id)
        stat = self.zk.exists(path)
        if stat is None or stat.num_children or stat.mtime > older_than:
            return False
        if self.exists(request_id):
            return False
        try:
            self.zk.delete(path, version=stat.version)
        except (errors.NoNodeError, errors.NotEmptyError, errors.VersionConflict):
            return False
        return True


class PendingFresh:
    """A sent `store_fresh` transaction (see `RequestStore.store_fresh_async`)."""

    def __init__(self, store: RequestStore, request: NodeRequest, release: bool,
                 lock_dir: str, contender: str, data: bytes, idx: int,
                 sent: PendingTxn) -> None:
        self.store = store
        self.request = request
        self._release = release
        self._lock_dir = lock_dir
        self._contender = contender
        self._data = data
        self._idx = idx
        self._sent = sent

    def result(self) -> HeldLock | None:
        """As `RequestStore.store_fresh` returns or raises."""
        zk, request, release, lock_dir = (self.store.zk, self.request, self._release,
                                          self._lock_dir)
        try:
            results = self._sent.result()
        except errors.ZkConnectionError:
            # Ambiguous: the transaction may have been applied. Adopt it if it was.
            adopted = locks.adopt_fresh_lock(zk, paths.request_path(request.id), self._data,
                                             request.version, lock_dir, self._contender,
                                             released=release)
            if adopted is None:
                raise
            request.version, held = adopted
            return held
        except errors.TxnFailed as exc:
            if exc.path == lock_dir and isinstance(exc.cause, errors.NodeExistsError):
                return None
            if exc.path == lock_dir and isinstance(exc.cause, errors.NoNodeError):
                zk.ensure_path(paths.REQUEST_LOCKS)
                return None
            raise exc.cause from exc
        request.version = results[self._idx].version
        return HeldLock(zk, lock_dir, self._contender, zk.epoch, released=release)
