"""Multi-operation transactions: several writes that succeed or fail together.

Owns: `Txn`, a small builder over ZooKeeper's `multi`. The launcher uses it to make each
protocol step one atomic write, for example "set the node ready and release its lock", or
"bump the provider's quota guard and create the node znodes". A transaction counts as one
write request (and one ZooKeeper txn) however many operations it holds.

Failure: `commit` raises `TxnFailed` naming the first refused operation and its typed cause
(`NoNodeError`, `VersionConflict`, `NodeExistsError`, `NotEmptyError`); nothing was applied
then. An optional deletion (`delete(..., optional=True)`: tidying, such as a closed
request's lock dir) refused because its znode is gone, has children or may not be deleted
by us is dropped and the rest committed again: one more transaction, only then.
Connection trouble raises `ZkConnectionError`: the outcome is unknown and the caller must
re-read before deciding anything. An operation ZooKeeper refused for lack of access raises
`ZkAuthError` (permanent) naming its path, not `TxnFailed`.

Creates carry the client's default ACL (`zookeeper-acl`, see `access`), as kazoo's own
creates do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kazoo import exceptions as kex
from kazoo.protocol.states import ZnodeStat
from kazoo.security import OPEN_ACL_UNSAFE

from nodepool_k8s.zk import _kazoo_ext, echo, errors
from nodepool_k8s.zk.client import Stat, ZkClient, translate


@dataclass(frozen=True)
class Op:
    kind: str  # create | set | delete | check
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False
    sequence: bool = False
    optional: bool = False  # a deletion the transaction may go without (`Txn.delete`)


class Txn:
    def __init__(self) -> None:
        self.ops: list[Op] = []

    def __len__(self) -> int:
        return len(self.ops)

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False) -> int:
        self.ops.append(Op("create", path, data, ephemeral=ephemeral, sequence=sequence))
        return len(self.ops) - 1

    def set(self, path: str, data: bytes, version: int = -1) -> int:
        self.ops.append(Op("set", path, data, version=version))
        return len(self.ops) - 1

    def delete(self, path: str, version: int = -1, *, optional: bool = False) -> int:
        """Queue deleting `path`. `optional`: if that alone is refused (the znode is gone, has
        children or an ACL forbids it), `commit` applies the rest without it (its result is
        then None)."""
        self.ops.append(Op("delete", path, version=version, optional=optional))
        return len(self.ops) - 1

    def check(self, path: str, version: int = -1) -> int:
        """Require `path` to exist (with `version`, unless -1) at commit time."""
        self.ops.append(Op("check", path, version=version))
        return len(self.ops) - 1

    def commit(self, zk: ZkClient) -> list[Any]:
        """Apply all operations atomically; returns per-op results (created paths, stats)."""
        if not self.ops:
            return []
        try:
            if len(self.ops) == 1:
                return [self._single(zk, self.ops[0])]
            return self.commit_async(zk).result()
        except errors.TxnFailed as exc:
            index = exc.index if isinstance(exc.cause, (errors.NoNodeError,
                                                        errors.NotEmptyError)) else -1
            if not self._optional(index, exc.path):
                raise
        except errors.ZkAuthError as exc:
            # Not allowed to delete it (an ACL on its parent): tidying we go without.
            index = next((i for i, op in enumerate(self.ops)
                          if op.optional and op.path == exc.path), -1)
            if not self._optional(index, exc.path):
                raise
        # Nothing was applied: the same writes again without that deletion.
        rest = Txn()
        rest.ops = [op for i, op in enumerate(self.ops) if i != index]
        results = rest.commit(zk)
        results.insert(index, None)
        return results

    def _optional(self, index: int, path: str | None) -> bool:
        """Whether the operation at `index` is an optional deletion of `path`."""
        return 0 <= index < len(self.ops) and self.ops[index].optional \
            and self.ops[index].path == path

    def commit_async(self, zk: ZkClient) -> "PendingTxn":
        """Send the transaction (two or more operations) without waiting for the answer:
        the caller goes on and collects the outcome, as `commit` reports it, later
        (possibly on another thread) with `PendingTxn.result`."""
        if len(self.ops) < 2:
            raise ValueError("commit_async needs two or more operations")
        tx = zk.transaction()
        for op in self.ops:
            if op.kind == "create":
                # Not tx.create: it drops the trailing "/" of a sequential create.
                acl = zk.kazoo.default_acl or OPEN_ACL_UNSAFE
                _kazoo_ext.add_create(tx, zk.kazoo.chroot, op.path, op.data, acl,
                                      op.ephemeral, op.sequence)
            elif op.kind == "set":
                tx.set_data(op.path, op.data, version=op.version)
            elif op.kind == "delete":
                tx.delete(op.path, version=op.version)
            else:
                tx.check(op.path, op.version)
        zk.writes.add(len(self.ops))
        expected = zk.echoes.expect(
            [(i, op.path, op.data) for i, op in enumerate(self.ops) if op.kind == "set"])
        try:
            sent = tx.commit_async()
        except BaseException as exc:
            zk.echoes.settle(expected, None)
            if isinstance(exc, kex.KazooException):
                raise translate(exc, self.ops[0].path) from exc
            raise
        if expected:
            # On kazoo's thread once answered, whether or not anyone collects the result.
            sent.rawlink(lambda answer: echo.WriteEchoes.settle_from(expected, answer))
        return PendingTxn(self.ops, sent)

    @staticmethod
    def _single(zk: ZkClient, op: Op) -> Any:
        try:
            if op.kind == "create":
                return zk.create(op.path, op.data, ephemeral=op.ephemeral, sequence=op.sequence)
            if op.kind == "set":
                return zk.set(op.path, op.data, op.version)
            if op.kind == "delete":
                zk.delete(op.path, op.version)
                return True
            stat = zk.exists(op.path)
            if stat is None:
                raise errors.NoNodeError(op.path)
            if op.version != -1 and stat.version != op.version:
                raise errors.VersionConflict(op.path)
            return True
        except (errors.NoNodeError, errors.VersionConflict, errors.NodeExistsError,
                errors.NotEmptyError) as exc:
            raise errors.TxnFailed(0, op.kind, op.path, exc) from exc


class PendingTxn:
    """A sent transaction whose answer has not been collected (see `Txn.commit_async`)."""

    def __init__(self, ops: list[Op], sent: Any) -> None:
        self.ops = ops
        self._sent = sent

    def result(self) -> list[Any]:
        """The per-op results, or the errors `Txn.commit` raises."""
        try:
            results = self._sent.get()
        except kex.KazooException as exc:
            raise translate(exc, self.ops[0].path) from exc
        for index, result in enumerate(results):
            if isinstance(result, Exception) and not isinstance(result, kex.RolledBackError):
                op = self.ops[index]
                cause = translate(result, op.path)
                if isinstance(cause, errors.ZkAuthError):
                    raise cause  # permanent, and about access, not the state of the tree
                if not isinstance(cause, errors.NodepoolError):
                    cause = errors.ZkConnectionError(repr(result))
                raise errors.TxnFailed(index, op.kind, op.path, cause)
        if any(isinstance(r, Exception) for r in results):
            raise errors.TxnFailed(0, self.ops[0].kind, self.ops[0].path,
                                   errors.ZkConnectionError("transaction rolled back"))
        return [Stat.of(r) if isinstance(r, ZnodeStat) else r for r in results]
