"""`zk.admin`, the ZooKeeper operations behind the CLI: bounded connect and lock breaking,
checked against kazoo's own `Lock` recipe (what Zuul uses)."""

from __future__ import annotations

import socket
import threading
from typing import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.recipe.lock import Lock

from nodepool_k8s.dev.testing.zookeeper import free_port
from nodepool_k8s.zk import admin, errors, locks, paths
from nodepool_k8s.zk.client import ZkClient, ZkSettings
from tests.helpers import ZkConnection, wait_for

NODE = "0000000001"
LOCK = paths.node_lock_path(NODE)


@pytest.fixture
def client(zk: ZkConnection, kazoo_client: KazooClient) -> Iterator[ZkClient]:
    kazoo_client.create(paths.node_path(NODE), b"{}", makepath=True)
    zk_client = admin.connect(ZkSettings(hosts=zk.hosts), timeout=5)
    try:
        yield zk_client
    finally:
        zk_client.stop()


def _connect_in_background(hosts: str, timeout: float) -> list[BaseException]:
    """Start `admin.connect` on a thread; the list gets the error it ends with."""
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            admin.connect(ZkSettings(hosts=hosts), timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    threading.Thread(target=attempt, daemon=True).start()
    return outcome


def test_connect_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens: the client's retries would go on for ever. What ends them is the
    # budget: each attempt bounded by it, and the stop event it sets once it is spent.
    started: list[tuple[ZkSettings, threading.Event | None]] = []

    class RecordingClient(ZkClient):
        def start(self, stop: threading.Event | None = None) -> bool:
            started.append((self.settings, stop))
            return super().start(stop)

    monkeypatch.setattr(admin, "ZkClient", RecordingClient)
    hosts = f"127.0.0.1:{free_port()}"
    outcome = _connect_in_background(hosts, 0.5)
    # (The deadline only keeps a regression, retrying for ever, from hanging the run.)
    wait_for(lambda: outcome, 60, message="connect to give up")
    [error] = outcome
    assert isinstance(error, errors.ZkConnectionError)
    assert str(error) == f"cannot connect to ZooKeeper at {hosts} within 0.5s"
    [(settings, stop)] = started
    assert settings.connect_attempt_timeout == 0.5
    assert stop is not None and stop.is_set()  # the budget was spent, so it gave up


def test_connect_gives_up_on_a_server_that_accepts_and_never_answers() -> None:
    """kazoo's stop waited for its connection thread, stuck reading from the silent peer
    until kazoo's own timeout: the CLI said "within 1s" after about 10 s."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    hosts = f"127.0.0.1:{listener.getsockname()[1]}"
    outcome = _connect_in_background(hosts, 1)
    try:
        wait_for(lambda: outcome, 4, message="connect to give up close to its budget")
        assert isinstance(outcome[0], errors.ZkConnectionError)
    finally:
        listener.close()


def test_break_a_held_lock_and_requeue_a_waiter(zk: ZkConnection, client: ZkClient,
                                                kazoo_client: KazooClient) -> None:
    holder = Lock(kazoo_client, LOCK)
    assert holder.acquire(timeout=5)
    waiter_client = KazooClient(hosts=zk.hosts)
    waiter_client.start(timeout=15)
    waiter = Lock(waiter_client, LOCK)
    got = threading.Event()

    def wait_for_lock() -> None:
        if waiter.acquire(timeout=30):
            got.set()

    thread = threading.Thread(target=wait_for_lock)
    thread.start()
    try:
        wait_for(lambda: len(locks.contenders(client.get_children(LOCK) or [])) == 2,
                 message="the waiter to queue")
        broken = admin.break_lock(client, LOCK)
        assert len(broken.removed) == 2  # the holder and the waiter
        assert holder.is_acquired  # the holder is not told
        # We hold it now: the waiter re-queued behind us (kazoo's recipe does that).
        children = locks.contenders(client.get_children(LOCK) or [])
        assert children[0] == broken.held.node
        assert not got.is_set()
        broken.held.release()
        wait_for(got.is_set, message="the waiter to get the lock after us")
    finally:
        thread.join(30)
        waiter.release()
        waiter_client.stop()
        waiter_client.close()


def test_break_a_free_lock_removes_nothing(client: ZkClient) -> None:
    broken = admin.break_lock(client, LOCK)
    assert broken.removed == ()
    assert locks.contenders(client.get_children(LOCK) or []) == [broken.held.node]
    broken.held.release()
    assert client.get_children(LOCK) == []


def test_break_the_lock_of_a_deleted_node(client: ZkClient) -> None:
    with pytest.raises(errors.NoNodeError):
        admin.break_lock(client, paths.node_lock_path("0000000099"))
    # The node was not resurrected by creating its lock dir.
    assert client.exists(paths.node_path("0000000099")) is None
