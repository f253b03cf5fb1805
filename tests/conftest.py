"""Shared pytest fixtures: a real ZooKeeper per test session, a fresh chroot per test.

Fixtures here start real servers (Debian's ZooKeeper) as child processes and always stop
them at the end of the session. Waiting helpers check a condition against a deadline, on each
change a listener reports (`helpers.Signal`) or, where nothing reports one, by polling; no test
sleeps a fixed time to wait for something.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterator

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.core import records
from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.simulator.tls import make_tls_material
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection, client_for
from tests.launcher.util import Processes
from tests.launchers import LauncherFactory


@pytest.fixture(autouse=True)
def _fresh_malformed_reports() -> None:
    """Every test's chroot reuses the same znode paths: the once-per-version memo of
    malformed records must not carry over from one test to the next."""
    records.REPORTS.clear()


@pytest.fixture(autouse=True)
def _own_state_directory(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's launchers (in this process or started from it) pin their installation id
    in a directory of the test's own, as systemd's StateDirectory= would give them, never
    in the machine's /var/lib/nodepool."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    return state


@pytest.fixture(scope="session")
def zk_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def zk_tls_server() -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tls=True).start()
    try:
        yield server
    finally:
        server.stop()


def _make_chroot(hosts: str, **kw: object) -> str:
    chroot = f"/nodepool-test-{uuid.uuid4().hex}"
    client = KazooClient(hosts=hosts, **kw)  # type: ignore[arg-type]
    client.start(timeout=15)
    try:
        client.ensure_path(chroot)
    finally:
        client.stop()
        client.close()
    return chroot


@pytest.fixture
def zk(zk_server: ZooKeeperServer) -> ZkConnection:
    """Connection details of a fresh, empty chroot on the session's plain ZooKeeper."""
    chroot = _make_chroot(zk_server.hosts)
    return ZkConnection(host="127.0.0.1", port=zk_server.port, chroot=chroot)


@pytest.fixture
def zk_tls(zk_tls_server: ZooKeeperServer) -> ZkConnection:
    """Connection details of a fresh chroot reached over TLS (client certificate required)."""
    tls = zk_tls_server.tls_files
    assert tls is not None
    chroot = _make_chroot(zk_tls_server.hosts)
    return ZkConnection(host="127.0.0.1", port=zk_tls_server.secure_port, chroot=chroot,
                        tls_ca=tls.ca, tls_cert=tls.cert, tls_key=tls.key)


@pytest.fixture
def kazoo_client(zk: ZkConnection) -> Iterator[KazooClient]:
    """A raw kazoo client inside the test's chroot, for arranging and checking znodes."""
    client = KazooClient(hosts=zk.hosts)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


# -- Kubernetes API simulator -----------------------------------------------------------------

@pytest.fixture(scope="session")
def sim_tls_material(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One CA and server certificate for every `k8s_sim` of the session: making them is three
    openssl runs, most of a simulator's start. Read-only; a test that needs a CA of its own
    starts its simulator without it."""
    directory = tmp_path_factory.mktemp("sim-tls")
    make_tls_material(str(directory))
    return str(directory)


@pytest.fixture
def k8s_sim(tmp_path: Path, sim_tls_material: str) -> Iterator[Simulator]:
    """A fresh simulated Kubernetes API server: TLS on (the session's certificate), zero
    delays, empty store, always stopped.

    Its admin kubeconfig (context "sim") is at `k8s_sim.kubeconfig_path`.
    """
    sim = Simulator(SimulatorConfig(tls=True, tls_material_dir=sim_tls_material)).start()
    try:
        sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim")
        yield sim
    finally:
        sim.stop()


def _session(zk: ZkConnection) -> Iterator[ZkClient]:
    client = client_for(zk)
    try:
        yield client
    finally:
        client.stop()


@pytest.fixture
def zkc(zk: ZkConnection) -> Iterator[ZkClient]:
    """A started `ZkClient` in the test's chroot (the ZooKeeper layer's own client)."""
    yield from _session(zk)


@pytest.fixture
def other(zk: ZkConnection) -> Iterator[ZkClient]:
    """Another launcher's session on the test's chroot."""
    yield from _session(zk)


# -- launchers and a Zuul-like client on the test's chroot ------------------------------------
@pytest.fixture
def launchers(zk: ZkConnection) -> Iterator[LauncherFactory]:
    """Starts in-process launchers from YAML (tests/launchers.py); always stops them."""
    factory = LauncherFactory(zk)
    try:
        yield factory
    finally:
        factory.stop_all()


@pytest.fixture
def processes(zk: ZkConnection, tmp_path: Path) -> Iterator[Processes]:
    """Real `nodepool-launcher` processes on the test's chroot (tests/launcher/util.py; they
    inherit the environment, $KUBECONFIG included); always killed."""
    procs = Processes(zk, tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


@pytest.fixture
def zuul(zk: ZkConnection) -> Iterator[ZuulClient]:
    """A client speaking Zuul's half of the protocol (nodepool_k8s.dev.testing.zuul_client)."""
    client = ZuulClient(zk.hosts)
    try:
        yield client
    finally:
        client.close()
