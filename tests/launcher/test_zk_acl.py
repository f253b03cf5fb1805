"""A launcher with `zookeeper-auth` and `zookeeper-acl` serving a Zuul-like client that has
its own credentials: requests are fulfilled and the nodes read, while an anonymous client
can read no znode the launcher created (node records, lock dirs and contenders, request
locks, min-ready requests, components, elections, guards). Wrong credentials stop a
launcher process at start with one clear line, as they stop `nodepool`; the ACL off keeps
today's open znodes."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions, make_digest_acl_credential

from nodepool_k8s.cmd.nodepoolcmd import main as nodepool_main
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import Processes
from tests.launchers import TEST_SETTINGS

BODY = """
labels:
  - name: small
    min-ready: 1
  - name: large
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: small
            type: namespace
            launch-delay: 120
          - name: large
            type: pod
"""

SECURE = """
zookeeper-auth:
  username: nodepool
  password: {password}
zookeeper-acl:
  grants:
    - scheme: digest
      username: zuul
      password: zuul-secret
"""

LAUNCHER_ID = ACL(Permissions.ALL, Id("digest", make_digest_acl_credential("nodepool", "s3")))
ZUUL_ID = ACL(Permissions.ALL, Id("digest", make_digest_acl_credential("zuul", "zuul-secret")))
# `small` builds slowly: its min-ready request and building spare stay while the test looks.
# Requests are Zuul's (`<prio>-<seq>`); min-ready requests are the launcher's, Zuul
# never writes those.
ZUUL_REQUEST = re.compile(rf"^{paths.REQUESTS}/\d\d\d-\d+$")


def make_launcher(zk: ZkConnection, password: str = "s3", acl: bool = True) -> Launcher:
    secure = SECURE.format(password=password)
    if not acl:
        secure = secure.split("zookeeper-acl:")[0]
    config = load_config_text(zk.config_yaml() + "zookeeper-timeout: 5\n"
                              + textwrap.dedent(BODY), secure_text=secure)
    return Launcher(config, settings=TEST_SETTINGS, stats=Stats(RecordingBackend()))


@pytest.fixture
def secured(zk: ZkConnection) -> Iterator[Launcher]:
    launcher = make_launcher(zk)
    try:
        assert launcher.start()
        yield launcher
    finally:
        launcher.stop()


@pytest.fixture
def authorised_zuul(zk: ZkConnection) -> Iterator[ZuulClient]:
    client = ZuulClient(zk.hosts, auth_data=[("digest", "zuul:zuul-secret")])
    try:
        yield client
    finally:
        client.close()


def walk(client: KazooClient, path: str = "/") -> Iterator[str]:
    for child in client.get_children(path):
        full = f"{path.rstrip('/')}/{child}"
        yield full
        yield from walk(client, full)


def test_authorised_zuul_is_served_and_anonymous_reads_nothing(
        secured: Launcher, authorised_zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    zuul = authorised_zuul
    wait_for(lambda: [r for r in secured.reader.requests()
                      if r.requestor == "NodePool:min-ready"], 30,
             message="the launcher's min-ready request")
    request_id = zuul.submit(["large", "large"])
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    nodeset = zuul.accept(request_id)
    assert [n.data["state"] for n in nodeset.nodes] == ["ready", "ready"]
    node_ids = [n.id for n in nodeset.nodes]
    assert all(zuul.get_node(node_id) is not None for node_id in node_ids)
    zuul.use(nodeset)  # Zuul writes the nodes and holds their locks: its contenders exist
    anonymous = kazoo_client
    client = zuul.client
    zuul_session = client.client_id[0]
    checked: list[str] = []
    for path in walk(client):
        acl, stat = client.get_acls(path)
        if ZUUL_REQUEST.match(path) and json.loads(client.get(path)[0])["requestor"] \
                == zuul.system_id or stat.ephemeralOwner == zuul_session:
            assert list(acl) == OPEN_ACL_UNSAFE, path  # Zuul sets no ACL of its own
            continue
        assert list(acl) == [LAUNCHER_ID, ZUUL_ID], path
        with pytest.raises(NoAuthError):
            anonymous.get(path)
        with pytest.raises(NoAuthError):
            anonymous.get_children(path)
        checked.append(path)
    for expected in (paths.ROOT, paths.NODES, paths.REQUESTS, paths.REQUEST_LOCKS,
                     paths.LAUNCHER_COMPONENTS, paths.POOL_COMPONENTS, paths.GUARDS,
                     *(paths.node_path(n) for n in node_ids),
                     *(paths.node_lock_path(n) for n in node_ids)):
        assert expected in checked, expected
    for prefix in (f"{paths.LAUNCHER_COMPONENTS}/", f"{paths.POOL_COMPONENTS}/",
                   f"{paths.REQUEST_LOCKS}/", f"{paths.GUARDS}/"):
        assert any(p.startswith(prefix) for p in checked), prefix
    # The min-ready request the launcher wrote, and its building spare, locked by it.
    assert any(p.startswith(f"{paths.REQUESTS}/") for p in checked)
    spare = [p for p in checked if re.match(rf"^{paths.NODES}/\d+/lock/.+", p)]
    assert spare, checked
    zuul.release(nodeset)
    wait_for(lambda: all(zuul.get_node(n) is None for n in node_ids), 30,
             message="used nodes deleted")


def zuul_node(client: KazooClient, node_id: str) -> dict[str, Any] | None:
    try:
        data = client.get(paths.node_path(node_id))[0]
    except NoNodeError:
        return None
    body = json.loads(data) if data else None
    return body if isinstance(body, dict) else None


def test_acl_off_keeps_the_open_acl(zk: ZkConnection, authorised_zuul: ZuulClient,
                                    kazoo_client: KazooClient) -> None:
    launcher = make_launcher(zk, acl=False)
    try:
        assert launcher.start()
        authorised_zuul.run_build(["large"])

        def spares() -> list[str]:
            # The min-ready spare (still building: its launch takes 120 s) only; the
            # build's own node is being deleted meanwhile.
            found = []
            for node_id in kazoo_client.get_children(paths.NODES):
                data = zuul_node(kazoo_client, node_id)
                if data and data.get("type") == ["small"]:
                    found.append(node_id)
            return found
        spare = wait_for(spares, 30, message="the min-ready spare")
        for node_id in spare:
            assert list(kazoo_client.get_acls(paths.node_path(node_id))[0]) == \
                OPEN_ACL_UNSAFE
    finally:
        launcher.stop()


def _files(tmp_path: Path, zk: ZkConnection, password: str) -> tuple[Path, Path]:
    config = tmp_path / "nodepool.yaml"
    config.write_text(zk.config_yaml() + "zookeeper-timeout: 5\n" + textwrap.dedent(BODY))
    secure = tmp_path / f"secure-{password}.yaml"
    secure.write_text(SECURE.format(password=password))
    secure.chmod(0o600)
    return config, secure


def test_cli_uses_the_secure_credentials(secured: Launcher, zk: ZkConnection,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    wait_for(lambda: secured.reader.nodes(), 30, message="the min-ready spare")
    config, secure = _files(tmp_path, zk, "s3")
    capsys.readouterr()
    assert nodepool_main(["-c", str(config), "-s", str(secure), "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert len(listed) >= 1
    _, wrong = _files(tmp_path, zk, "guessed")
    assert nodepool_main(["-c", str(config), "-s", str(wrong), "list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "ZooKeeper refused access on /nodepool" in err[0]
    assert "check zookeeper-auth/zookeeper-acl" in err[0]
    # Without any credentials the same.
    assert nodepool_main(["-c", str(config), "list"]) == 1
    assert "check zookeeper-auth/zookeeper-acl" in capsys.readouterr().err


def test_launcher_process_with_wrong_credentials_exits(secured: Launcher, zk: ZkConnection,
                                                       tmp_path: Path) -> None:
    procs = Processes(zk, tmp_path)
    body = textwrap.dedent(BODY) + SECURE.format(password="guessed")
    try:
        code = procs.exit_code(procs.start(body))
        logs = procs.logs()
        assert code == 1, logs
        assert "nodepool-launcher: cannot use ZooKeeper: ZooKeeper refused access on" \
            " /nodepool" in logs
        assert "check zookeeper-auth/zookeeper-acl" in logs
        assert "Traceback" not in logs
    finally:
        procs.stop_all()
