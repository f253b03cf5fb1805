"""`KubeClient.call` keeps its `api-timeout` for the whole answer, not per socket read.

A server (or a proxy in front of it) that sends its headers and then trickles the body, one
byte at a time just inside urllib3's read timeout, held a launch (and Zuul's request) for
ever: every read succeeded. Here a tiny HTTP server trickles a 40-byte body over about ten
seconds; with a one-second api-timeout the call must give up with a TemporaryError, and the
connection is not reused half-read.

Every request also has the provider's short connect and read timeouts, and a launch's calls
share one budget (`Budget`): no request outlasts what remains of it, no retry is made that
would pass its deadline, and a server that never answers is marked unreachable.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client as k8s

from nodepool_k8s.core.errors import BootTimeout, TemporaryError
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.driver.kubernetes.client import (Budget, KubeClient, RetryPolicy,
                                                   load_configuration)
from nodepool_k8s.driver.kubernetes.errors import Unreachable
from nodepool_k8s.runtime.clock import ManualClock

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


# -- the launch's one budget, and short connect/read timeouts per request ---------------

def sim_client(sim: Simulator, tmp_path: Path, policy: RetryPolicy) -> KubeClient:
    path = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim")
    configuration, context = load_configuration("sim", path, 4)
    return KubeClient(configuration, context, policy, provider="sim")


def recording(fn: Callable[..., Any], seen: list[Any]) -> Callable[..., Any]:
    """`fn`, noting the request timeout each attempt is sent with."""
    def send(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("_request_timeout"))
        return fn(*args, **kwargs)
    return send


def test_each_request_has_the_short_connect_and_read_timeouts(
        k8s_sim: Simulator, tmp_path: Path) -> None:
    client = sim_client(k8s_sim, tmp_path, RetryPolicy(retries=0, timeout=30.0,
                                                       connect_timeout=2.0,
                                                       read_timeout=3.0))
    seen: list[Any] = []
    client.call("list namespaces", recording(client.core.list_namespace, seen))
    assert seen == [(2.0, 3.0)]
    # Within a budget, no request is given more than what remains of it.
    clock = ManualClock()
    budget = Budget(threading.Event(), clock.monotonic() + 1.5, clock)
    client.call("list namespaces", recording(client.core.list_namespace, seen), sleep=budget)
    assert seen[-1] == (1.5, 1.5)
    client.close()


def test_retries_stop_at_the_budgets_deadline(k8s_sim: Simulator, tmp_path: Path) -> None:
    """A retry whose wait would pass the launch's deadline is not made: the call gives up
    with the last error (the old per-call budget retried five times regardless)."""
    client = sim_client(k8s_sim, tmp_path, RetryPolicy(retries=5, backoff=(2.0,)))
    k8s_sim.fail_next("create", "namespaces", count=5, code=500)
    clock = ManualClock()
    budget = Budget(threading.Event(), clock.monotonic() + 1.0, clock)
    seen: list[Any] = []
    with pytest.raises(TemporaryError):
        client.call("create namespace x", recording(client.core.create_namespace, seen),
                    {"metadata": {"name": "x"}}, sleep=budget)
    assert len(seen) == 1
    # Past the deadline nothing is sent at all.
    clock.advance(1.0)
    with pytest.raises(BootTimeout, match="deadline"):
        client.call("create namespace y", recording(client.core.create_namespace, seen),
                    {"metadata": {"name": "y"}}, sleep=budget)
    assert len(seen) == 1
    client.close()


def test_a_frozen_server_costs_one_read_timeout_and_marks_it_unreachable(
        k8s_sim: Simulator, tmp_path: Path) -> None:
    client = sim_client(k8s_sim, tmp_path, RetryPolicy(retries=0, connect_timeout=1.0,
                                                       read_timeout=0.3))
    client.call("list namespaces", client.core.list_namespace)
    assert client.health.current().healthy is True
    k8s_sim.freeze()
    try:
        with pytest.raises(Unreachable, match="(?i)timed out"):
            client.call("list namespaces", client.core.list_namespace)
        assert client.health.current().healthy is False
    finally:
        k8s_sim.thaw()
    client.call("list namespaces", client.core.list_namespace)
    assert client.health.current().healthy is True
    client.close()
