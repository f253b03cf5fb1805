"""ZooKeeper outcomes as domain errors, so no layer above `zk` ever sees a kazoo exception.

Owns: the typed errors the stores raise. `ZkConnectionError` (and `ZkSessionLost`) are
temporary: the same operation may succeed after the session is back. `NoNodeError`,
`VersionConflict` and `NodeExistsError` report the state of the tree. `LockLost` means a
write was refused because our lock contender znode is gone (session expired): the caller
must stop acting on that object. `ZkAuthError` is permanent: ZooKeeper refused the session's
credentials or an operation on a znode its ACL does not grant us; retrying cannot help, the
configuration (`zookeeper-auth`, `zookeeper-acl`, `zookeeper-tls`) or the ACLs must change.
"""

from __future__ import annotations

from nodepool_k8s.core.errors import (
    NodepoolError, NotFound, PermanentError, TemporaryError, ZkSessionLost)

__all__ = ["NodepoolError", "ZkSessionLost", "ZkConnectionError", "NoNodeError",
           "VersionConflict", "NodeExistsError", "NotEmptyError", "LockLost", "TxnFailed",
           "NotOurs", "ZkAuthError"]


class ZkConnectionError(TemporaryError):
    """The request could not be completed because the connection dropped."""


class NoNodeError(NotFound):
    """The znode does not exist (any more)."""


class VersionConflict(TemporaryError):
    """Someone else changed the znode since we read it."""


class NodeExistsError(NodepoolError):
    """The znode already exists."""


class NotEmptyError(NodepoolError):
    """The znode has children."""


class NotOurs(PermanentError):
    """A write or deletion the protocol does not allow us (e.g. deleting another
    requestor's request): a bug in the caller, never retried."""


class ZkAuthError(PermanentError):
    """ZooKeeper refused us: authentication failed (`AuthFailedError`), an ACL does not
    grant the operation (`NoAuthError`), or the ACL we asked for is invalid for this session
    (`InvalidACLError`, e.g. an `auth` ACL on a session without an authenticated identity).

    `path` names the znode (None for a session-wide failure), `reason` the kazoo error.
    """

    HINT = "check zookeeper-auth/zookeeper-acl (and zookeeper-tls)"

    def __init__(self, reason: str, path: str | None = None, detail: str = "") -> None:
        where = f" on {path}" if path else ""
        more = f": {detail}" if detail else ""
        super().__init__(f"ZooKeeper refused access{where} ({reason}){more}; {self.HINT}")
        self.reason = reason
        self.path = path


class LockLost(ZkSessionLost):
    """Our lock contender znode is gone; someone else may own the object now."""


class TxnFailed(NodepoolError):
    """A multi-op transaction was rolled back.

    `index` and `path` name the first operation ZooKeeper refused, `cause` is its error
    (one of the classes above), `kind` the operation (`create`, `set`, `delete`, `check`).
    """

    def __init__(self, index: int, kind: str, path: str, cause: NodepoolError) -> None:
        super().__init__(f"transaction op #{index} ({kind} {path}) failed: "
                         f"{type(cause).__name__}: {cause}")
        self.index = index
        self.kind = kind
        self.path = path
        self.cause = cause
