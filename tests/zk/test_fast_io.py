"""`_kazoo_ext.FastIO`: kazoo's connection thread writes queued requests together and
handles every reply a socket read brought before it waits again.

Both tests hold the connection thread in a persistent-watch listener (which runs on it)
while the work piles up, so what the thread finds afterwards does not depend on timing:
the requests queued meanwhile, the replies that arrived meanwhile (waited for in the
socket's receive buffer).
"""

from __future__ import annotations

import queue
import socket
import threading
from typing import Any, Iterator

import pytest

from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection, client_for, wait_for

ROOT = "/fast-io"


@pytest.fixture
def watched(zkc: ZkClient) -> Iterator[ZkClient]:
    zkc.ensure_path(ROOT)
    yield zkc


def test_requests_queued_together_go_out_in_one_write_in_order(watched: ZkClient) -> None:
    zkc = watched
    sent: list[Any] = []

    def listener(kind: str, path: str) -> None:
        if path == f"{ROOT}/go":
            # On the connection thread: nothing queued here goes out before we return.
            for _ in range(20):
                sent.append(zkc.kazoo.create_async(f"{ROOT}/s-", b"", sequence=True))

    assert zkc.watch_tree(ROOT, listener)
    batches, batched, _ = zkc.io_counts()
    zkc.create(f"{ROOT}/go")
    wait_for(lambda: len(sent) == 20, message="the listener's requests")
    created = [result.get(timeout=10) for result in sent]
    # Sent in queue order: the server numbered them in that order.
    assert created == sorted(created) and len(set(created)) == 20
    after = zkc.io_counts()
    assert (after[0] - batches, after[1] - batched) == (1, 20)


def _event_bytes(zkc: ZkClient, names: list[str]) -> int:
    """The wire size of a watch event on ROOT/<name> for each of `names`: length (4),
    reply header (xid, zxid, err: 16), type, state and the path's length (12), path."""
    chroot = zkc.kazoo.chroot or ""
    return sum(4 + 16 + 12 + len(f"{chroot}{ROOT}/{name}") for name in names)


def _buffered(zkc: ZkClient) -> int:
    sock = zkc.kazoo._connection._socket
    try:
        return len(sock.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


def test_replies_read_together_wake_a_waiting_thread_once(
        watched: ZkClient, zk: ZkConnection) -> None:
    zkc = watched
    names = [f"n{i:02d}" for i in range(40)]
    held, release = threading.Event(), threading.Event()
    handed: queue.Queue[str | None] = queue.Queue()
    wakeups: list[list[str]] = []

    def listener(kind: str, path: str) -> None:
        if path == f"{ROOT}/go":
            held.set()
            release.wait(30)  # the connection thread waits while the events arrive
        elif path.startswith(f"{ROOT}/n"):
            handed.put(path)

    def consume() -> None:
        while True:
            batch = [handed.get()]  # one wake-up: then everything already queued
            while True:
                try:
                    batch.append(handed.get_nowait())
                except queue.Empty:
                    break
            wakeups.append([x for x in batch if x is not None])
            if None in batch:
                return

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    assert zkc.watch_tree(ROOT, listener)
    writer = client_for(zk)
    try:
        writer.create(f"{ROOT}/go")
        wait_for(held.is_set, message="the connection thread in the listener")
        txn = writer.kazoo.transaction()
        for name in names:
            txn.create(f"{ROOT}/{name}", b"")
        assert all(r is True or isinstance(r, str) for r in txn.commit())
        expected = _event_bytes(zkc, names)
        wait_for(lambda: _buffered(zkc) >= expected, message="the events in the socket")
        grouped = zkc.io_counts()[2]
        release.set()
        wait_for(lambda: sum(len(w) for w in wakeups) == len(names),
                 message="the events handed on")
    finally:
        release.set()
        handed.put(None)
        writer.stop()
    consumer.join(10)
    # All 40 events came in one read and were handed on without a system call between
    # them, so the consumer, woken by the first, found the others queued: one wake-up
    # (two if the machine preempted the connection thread in the middle for longer than
    # the interpreter's switch interval). With kazoo's own reads (a wait and two reads per
    # event, each letting go of the GIL) it often woke per event or few events.
    assert len([w for w in wakeups if w]) <= 2
    assert [p.rsplit("/", 1)[1] for w in wakeups for p in w] == names  # server order
    assert zkc.io_counts()[2] == grouped + 1
