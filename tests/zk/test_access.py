"""ZooKeeper access control against a real server: the ACL on every create path of the zk
layer, permanent access errors, the start-up access check, and the x509 (TLS) identity."""

from __future__ import annotations

import threading
from typing import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions, make_digest_acl_credential

from nodepool_k8s.config.model import ZkAcl, ZkAuth, ZkGrant, ZkTls
from nodepool_k8s.core.errors import PermanentError, TemporaryError
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer
from nodepool_k8s.zk import errors, locks, paths
from nodepool_k8s.zk.client import ZkClient, ZkSettings
from nodepool_k8s.zk.election import Election, Term
from nodepool_k8s.zk.txn import Txn
from tests.helpers import ZkConnection, wait_for

LAUNCHER = ZkAuth(scheme="digest", username="nodepool", password="s3cret")
ACL_ON = ZkAcl(enabled=True)
OURS = ACL(Permissions.ALL, Id("digest", make_digest_acl_credential("nodepool", "s3cret")))


def started(settings: ZkSettings) -> ZkClient:
    client = ZkClient(settings)
    assert client.start()
    return client


@pytest.fixture
def secured(zk: ZkConnection) -> Iterator[ZkClient]:
    client = started(ZkSettings(hosts=zk.hosts, auth=LAUNCHER, acl=ACL_ON))
    try:
        yield client
    finally:
        client.stop()


@pytest.fixture
def anonymous(kazoo_client: KazooClient) -> KazooClient:
    """A client without credentials (the shared raw client has none)."""
    return kazoo_client


def walk(client: KazooClient, path: str = "/") -> Iterator[str]:
    for child in client.get_children(path):
        full = f"{path.rstrip('/')}/{child}"
        yield full
        yield from walk(client, full)


def assert_refused(anonymous: KazooClient, path: str) -> None:
    with pytest.raises(NoAuthError):
        anonymous.get(path)
    with pytest.raises(NoAuthError):
        anonymous.get_children(path)


def test_every_create_path_gets_the_acl(secured: ZkClient, anonymous: KazooClient) -> None:
    zk = secured
    # ZkClient.create with makepath, ensure_path, sequential and ephemeral creates.
    zk.create(f"{paths.GUARDS}/provider-x", b"", makepath=True)
    zk.ensure_path(paths.REQUEST_LOCKS)
    node = paths.basename(zk.create(paths.NODE_CREATE_PREFIX, b'{"token": "t"}',
                                    sequence=True, makepath=True))
    # A multi-op transaction (our own Create records) and a single-op one.
    txn = Txn()
    txn.create(paths.NODE_CREATE_PREFIX, b"{}", sequence=True)
    txn.create(f"{paths.OWN_ROOT}/multi", b"")
    txn.commit(zk)
    single = Txn()
    single.create(f"{paths.OWN_ROOT}/single", b"")
    single.commit(zk)
    # Our lock (contender and lock dir), then kazoo's Lock recipe, as Zuul's lock is.
    held = locks.acquire(zk, paths.node_lock_path(node), timeout=5)
    recipe = zk.kazoo.Lock(f"{paths.REQUEST_LOCKS}/100-0000000001")
    assert recipe.acquire(timeout=5)
    # An election contender, while it leads.
    elected = threading.Event()
    leave = threading.Event()

    def lead(term: Term) -> None:
        elected.set()
        leave.wait(10)

    election = Election(zk, paths.STATS_ELECTION)
    runner = threading.Thread(target=election.run, args=(lead, leave), daemon=True)
    runner.start()
    try:
        assert elected.wait(10)
        everything = list(walk(zk.kazoo))
        assert {paths.NODES, paths.REQUEST_LOCKS, paths.STATS_ELECTION, paths.GUARDS,
                f"{paths.OWN_ROOT}/multi", f"{paths.OWN_ROOT}/single",
                paths.node_lock_path(node)} <= set(everything)
        assert any(p.startswith(f"{paths.STATS_ELECTION}/") for p in everything)
        assert any(p.startswith(f"{paths.node_lock_path(node)}/") for p in everything)
        for path in everything:
            acl, _ = zk.kazoo.get_acls(path)
            assert list(acl) == [OURS], path
            assert_refused(anonymous, path)
        # The owner reads what it wrote.
        assert zk.get(paths.node_path(node)) is not None
    finally:
        leave.set()
        election.cancel()
        runner.join(10)
        recipe.release()
        held.release()


def test_access_errors_are_permanent_and_name_the_path(secured: ZkClient,
                                                       zk: ZkConnection) -> None:
    secured.create(paths.node_path("0000000001"), b"{}", makepath=True)
    stranger = started(ZkSettings(hosts=zk.hosts))
    try:
        with pytest.raises(errors.ZkAuthError) as caught:
            stranger.get(paths.node_path("0000000001"))
        assert isinstance(caught.value, PermanentError)
        assert not isinstance(caught.value, TemporaryError)
        assert caught.value.path == paths.node_path("0000000001")
        assert "NoAuthError" in str(caught.value)
        assert "check zookeeper-auth/zookeeper-acl" in str(caught.value)
        with pytest.raises(errors.ZkAuthError):
            stranger.get_children(paths.NODES)
        # A batched read skips what it may not read (reported once) instead of failing
        # for every znode of the batch (see test_client_reader).
        assert list(stranger.get_many([paths.node_path("0000000001")])) == [
            (paths.node_path("0000000001"), None)]
        txn = Txn()
        txn.set(paths.node_path("0000000001"), b"{}")
        txn.create(f"{paths.NODES}/0000000002", b"{}")
        with pytest.raises(errors.ZkAuthError) as in_txn:
            txn.commit(stranger)
        assert in_txn.value.path in (paths.node_path("0000000001"),
                                     f"{paths.NODES}/0000000002")
    finally:
        stranger.stop()


def test_wrong_password_fails_at_start(secured: ZkClient, zk: ZkConnection) -> None:
    secured.ensure_path(paths.NODES)
    wrong = ZkClient(ZkSettings(hosts=zk.hosts, acl=ACL_ON, auth=ZkAuth(
        scheme="digest", username="nodepool", password="guessed")))
    with pytest.raises(errors.ZkAuthError) as caught:
        wrong.start()
    assert caught.value.path == paths.ROOT
    assert "check zookeeper-auth/zookeeper-acl" in str(caught.value)
    assert not wrong.connected


def test_rejected_credentials_are_not_retried(zk: ZkConnection) -> None:
    # ZooKeeper's digest provider accepts any user:password (a wrong one only fails on
    # ACLs); a scheme the server has no provider for is rejected outright.
    client = ZkClient(ZkSettings(hosts=zk.hosts, connect_attempt_timeout=5.0,
                                 auth=ZkAuth(scheme="nosuchscheme", username="u",
                                             password="p")))
    stop = threading.Event()
    timer = threading.Timer(30, stop.set)
    timer.start()
    try:
        with pytest.raises(errors.ZkAuthError) as caught:
            client.start(stop)
    finally:
        timer.cancel()
    assert not stop.is_set()  # refused at once, not after the retry loop was stopped
    assert "AuthFailedError" in str(caught.value)
    assert "nosuchscheme" in str(caught.value)


def test_acl_without_an_identity_is_refused_at_start(zk: ZkConnection) -> None:
    client = ZkClient(ZkSettings(hosts=zk.hosts, acl=ACL_ON))
    with pytest.raises(errors.ZkAuthError) as caught:
        client.start()
    assert "InvalidACLError" in str(caught.value)
    assert "no authenticated identity" in str(caught.value)


def test_grant_of_a_scheme_without_provider_is_refused_at_start(zk: ZkConnection) -> None:
    acl = ZkAcl(enabled=True, grants=(ZkGrant(scheme="x509", id="CN=zuul"),))
    client = ZkClient(ZkSettings(hosts=zk.hosts, auth=LAUNCHER, acl=acl))
    with pytest.raises(errors.ZkAuthError) as caught:
        client.start()
    assert "InvalidACLError" in str(caught.value)
    assert "grant schemes: x509" in str(caught.value)


def test_acl_off_keeps_the_open_acl(zk: ZkConnection, anonymous: KazooClient) -> None:
    for acl in (None, ZkAcl(enabled=False)):
        client = started(ZkSettings(hosts=zk.hosts, auth=LAUNCHER, acl=acl))
        try:
            path = client.create(paths.NODE_CREATE_PREFIX, b"{}", sequence=True,
                                 makepath=True)
            assert list(client.kazoo.get_acls(path)[0]) == OPEN_ACL_UNSAFE
            assert anonymous.get(path)[0] == b"{}"
        finally:
            client.stop()


def test_grants_add_identities(zk_tls: ZkConnection,
                               zk_tls_server: ZooKeeperServer) -> None:
    # The plain port of the server that runs the x509 provider: an x509 grant is valid
    # there (ZooKeeper refuses ACL entries of schemes it has no provider for).
    hosts = f"127.0.0.1:{zk_tls_server.port}{zk_tls.chroot}"
    grants = (ZkGrant(scheme="digest", username="zuul", password="zz"),
              ZkGrant(scheme="x509", id="CN=zuul", permissions=("read", "write")))
    client = started(ZkSettings(hosts=hosts, auth=LAUNCHER,
                                acl=ZkAcl(enabled=True, grants=grants)))
    try:
        path = client.create(f"{paths.OWN_ROOT}/x", b"secret", makepath=True)
        acl = list(client.kazoo.get_acls(path)[0])
        assert acl == [OURS,
                       ACL(Permissions.ALL, Id("digest",
                                               make_digest_acl_credential("zuul", "zz"))),
                       ACL(Permissions.READ | Permissions.WRITE, Id("x509", "CN=zuul"))]
    finally:
        client.stop()
    zuul = KazooClient(hosts=hosts, auth_data=[("digest", "zuul:zz")])
    zuul.start(timeout=15)
    try:
        assert zuul.get(f"{paths.OWN_ROOT}/x")[0] == b"secret"
    finally:
        zuul.stop()
        zuul.close()


def test_tls_client_certificate_identity(zk_tls: ZkConnection,
                                         zk_tls_server: ZooKeeperServer) -> None:
    """Over TLS, with ZooKeeper's x509 provider, the certificate's subject DN is the
    launcher's identity: no `zookeeper-auth` needed; a plain-port client is refused."""
    assert zk_tls.tls_ca and zk_tls.tls_cert and zk_tls.tls_key
    client = started(ZkSettings(hosts=zk_tls.hosts, acl=ACL_ON, tls=ZkTls(
        cert=zk_tls.tls_cert, key=zk_tls.tls_key, ca=zk_tls.tls_ca)))
    plain = KazooClient(hosts=f"127.0.0.1:{zk_tls_server.port}{zk_tls.chroot}")
    plain.start(timeout=15)
    try:
        path = client.create(paths.NODE_CREATE_PREFIX, b"{}", sequence=True, makepath=True)
        assert list(client.kazoo.get_acls(path)[0]) == [
            ACL(Permissions.ALL, Id("x509", "CN=localhost"))]
        for znode in (paths.ROOT, paths.NODES, path):
            assert_refused(plain, znode)
        wait_for(lambda: client.get(path) is not None, message="owner reads its node")
    finally:
        plain.stop()
        plain.close()
        client.stop()
