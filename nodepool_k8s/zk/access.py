"""ZooKeeper access control: the session's credentials and the ACL of the znodes we create.

Owns: turning `zookeeper-auth` into kazoo `auth_data` and `zookeeper-acl` into the default
ACL that `client.ZkClient` gives its `KazooClient`. kazoo applies a client's `default_acl`
to every create that names no ACL of its own: `create` (with `makepath` parents),
`ensure_path`, its `Lock` and `Election` recipes (contenders and their parent znodes) and
`TransactionRequest.create`; `txn.Txn` builds its create records itself and passes the same
ACL. Nothing in `zk` passes an explicit ACL, so every znode the launcher creates (nodes,
locks, min-ready requests, registry components, elections, guards, chroot and parents) gets
this one.

With the ACL enabled the list is: `auth` (ZooKeeper expands it, at create time, into every
identity the creating session authenticated as: its digest user and/or the x509 subject DN
of its TLS client certificate) with all permissions, then each configured grant. `world`
is never added: an unauthenticated client can neither read nor list such a znode.

Failure modes: none here (the configuration was validated); ZooKeeper refuses an `auth`
entry on a session without an authenticated identity with `InvalidACLError`, which
`client.ZkClient.start` reports at start-up.
"""

from __future__ import annotations

from kazoo.security import ACL, CREATOR_ALL_ACL, Id, Permissions, make_digest_acl_credential

from nodepool_k8s.config.model import ZkAcl, ZkAuth, ZkGrant

_PERMISSIONS = {
    "read": Permissions.READ,
    "write": Permissions.WRITE,
    "create": Permissions.CREATE,
    "delete": Permissions.DELETE,
    "admin": Permissions.ADMIN,
    "all": Permissions.ALL,
}


def auth_data(auth: ZkAuth | None) -> list[tuple[str, str]]:
    """kazoo `auth_data` for `zookeeper-auth` (empty without one)."""
    if auth is None:
        return []
    return [(auth.scheme, f"{auth.username}:{auth.password}")]


def digest_id(username: str, password: str) -> str:
    """The id ZooKeeper's digest provider gives a session authenticated as user/password:
    `user:base64(sha1("user:password"))`."""
    return str(make_digest_acl_credential(username, password))


def grant_id(grant: ZkGrant) -> str:
    if grant.id is not None:
        return grant.id
    assert grant.username is not None and grant.password is not None
    return digest_id(grant.username, grant.password)


def default_acl(acl: ZkAcl | None) -> list[ACL] | None:
    """The ACL for every znode we create, or None for ZooKeeper's open ACL (the default)."""
    if acl is None or not acl.enabled:
        return None
    entries: list[ACL] = list(CREATOR_ALL_ACL)
    for grant in acl.grants:
        perms = 0
        for name in grant.permissions:
            perms |= _PERMISSIONS[name]
        entries.append(ACL(perms, Id(grant.scheme, grant_id(grant))))
    return entries


def describe(acl: list[ACL] | None) -> str:
    """`scheme:id=perms, ...` for logs (digest ids carry a hash, never a password)."""
    if not acl:
        return "world:anyone=all (open)"
    return ", ".join(f"{entry.id.scheme}:{entry.id.id or '<self>'}="
                     f"{'+'.join(entry.acl_list).lower()}" for entry in acl)
