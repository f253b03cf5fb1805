"""`KubeClient.call` keeps its `api-timeout` for the whole answer, not per socket read.

A server (or a proxy in front of it) that sends its headers and then trickles the body, one
byte at a time just inside urllib3's read timeout, held a launch (and Zuul's request) for
ever: every read succeeded. Here a tiny HTTP server trickles a 40-byte body over about ten
seconds; with a one-second api-timeout the call must give up with a TemporaryError, and the
connection is not reused half-read.
"""

from __future__ import annotations

import socket
import threading
from typing import Iterator

import pytest
from kubernetes import client as k8s

from nodepool_k8s.driver.kubernetes.client import KubeClient, RetryPolicy
from nodepool_k8s.core.errors import TemporaryError

BODY = b'{"kind":"Namespace","metadata":{"name":"x"}}'


@pytest.fixture
def trickler() -> Iterator[tuple[int, list[int]]]:
    """A server answering every connection with headers at once and the body slowly."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    served: list[int] = []
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(BODY))
            for byte in BODY:
                if stop.wait(0.25):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            served.append(1)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], served
    finally:
        stop.set()
        listener.close()


def test_a_trickled_answer_ends_at_the_api_timeout(trickler: tuple[int, list[int]]) -> None:
    port, served = trickler
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    client = KubeClient(configuration, "test", RetryPolicy(retries=1, backoff=(0.01,),
                                                           timeout=1.0))
    with pytest.raises(TemporaryError) as info:
        client.call("read namespace x", client.core.read_namespace, "x")
    assert "took longer than 1s" in str(info.value)
    # Both attempts (one retry) gave up at their deadline, before the body was complete
    # (about 11 s: the old code waited for it and returned it); each on a fresh connection,
    # a half-read one is never reused.
    assert len(served) == 2
    client.close()
