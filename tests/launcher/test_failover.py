"""ZooKeeper leader failover during a burst, on a real 3-server ensemble.

Aspects: a launcher connected to all three servers serves a burst while the leader is
killed (and restarted) repeatedly; afterwards every request is fulfilled, every node was
accepted, used, released and deleted, no lock is left behind, the fake cloud is empty,
and the launcher's log has no traceback or ERROR (connection events are warnings).
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperEnsemble
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import wait_for
from tests.launchers import TEST_SETTINGS

pytestmark = pytest.mark.slow

BODY = """
zookeeper-timeout: 6.0
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    max-servers: 50
    max-concurrency: 4
    pools:
      - name: main
        labels:
          - name: small
            type: namespace
            launch-delay: 0.3
"""


@pytest.fixture(scope="module")
def ensemble() -> Iterator[ZooKeeperEnsemble]:
    servers = ZooKeeperEnsemble().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def chroot_hosts(ensemble: ZooKeeperEnsemble) -> tuple[str, str]:
    chroot = f"/failover-{uuid.uuid4().hex[:8]}"
    client = KazooClient(hosts=ensemble.hosts)
    client.start(timeout=30)
    client.ensure_path(chroot)
    client.stop()
    client.close()
    return chroot, f"{ensemble.hosts}{chroot}"


def config_text(ensemble: ZooKeeperEnsemble, chroot: str) -> str:
    servers = "".join(f"  - host: 127.0.0.1\n    port: {port}\n    chroot: {chroot}\n"
                      for port in ensemble.client_ports)
    return "zookeeper-servers:\n" + servers + BODY


def test_leader_killed_repeatedly_during_a_burst(ensemble: ZooKeeperEnsemble,
                                                 chroot_hosts: tuple[str, str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    chroot, hosts = chroot_hosts
    caplog.set_level(logging.WARNING)
    launcher = Launcher(load_config_text(config_text(ensemble, chroot)),
                        settings=TEST_SETTINGS, stats=Stats(RecordingBackend()))
    assert launcher.start()
    zuul = ZuulClient(hosts, timeout=10.0)
    try:
        # Zuul's side is not under test here: it submits while the ensemble is stable and
        # handles the nodes afterwards. The launcher works through the failovers.
        ids = [zuul.submit(["small"]) for _ in range(40)]

        def fulfilled() -> int:
            count = 0
            for request_id in ids:
                try:
                    body = zuul.get_request(request_id)
                except KazooException:
                    return -1  # the ensemble is electing: ask again
                count += bool(body and body.get("state") == "fulfilled")
            return count
        for round_ in range(3):
            wait_for(lambda: fulfilled() >= 5 + 10 * round_, 120, interval=0.05,
                     message="launches progressing between failovers")
            leader = ensemble.wait_quorum()
            ensemble.kill(leader)
            ensemble.wait_quorum()
            ensemble.restart(leader)
        ensemble.wait_quorum()
        wait_for(lambda: fulfilled() == len(ids), 180, interval=0.1,
                 message="every request fulfilled after the failovers")
        for request_id in ids:
            nodeset = zuul.accept(request_id)
            zuul.use(nodeset)
            zuul.release(nodeset)
        # Everything released is deleted; nothing stays building or locked.
        wait_for(lambda: not zuul.client.get_children(paths.NODES), 120,
                 message="every node deleted after the failovers")
        assert launcher.providers["fake"].resource_ids() == set()  # type: ignore[attr-defined]
        locks = zuul.client.get_children(paths.REQUEST_LOCKS) \
            if zuul.client.exists(paths.REQUEST_LOCKS) else []
        assert all(not zuul.client.get_children(f"{paths.REQUEST_LOCKS}/{lock}")
                   for lock in locks)
    finally:
        zuul.close()
        # Bounded: if the ensemble did not recover, a stop must not hang the suite.
        stopper = threading.Thread(target=launcher.stop, daemon=True)
        stopper.start()
        stopper.join(30)
    problems = [r for r in caplog.records
                if r.levelno >= logging.ERROR or r.exc_info is not None]
    assert problems == [], [r.getMessage() for r in problems[:5]]
