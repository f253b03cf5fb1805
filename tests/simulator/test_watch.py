"""Watches: initial state, live events, resume, 410, bookmarks, timeouts, disconnects."""

from __future__ import annotations

import json
import queue
import socket
import ssl
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.simulator import watch as sim_watch
from tests.helpers import Signal
from tests.simulator.conftest import Kube


class Collector:
    """Runs a watch in a thread and queues its events."""

    def __init__(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.error: BaseException | None = None
        self.watch = watch.Watch()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs), daemon=True)
        self._thread.start()

    def _run(self, fn: Any, args: Any, kwargs: Any) -> None:
        try:
            for event in self.watch.stream(fn, *args, **kwargs):
                self.events.put(event)
        except BaseException as exc:  # noqa: B902 - handed to the test thread
            self.error = exc
        finally:
            self.done.set()

    def next(self, timeout: float = 5.0) -> dict[str, Any]:
        return self.events.get(timeout=timeout)

    def stop(self) -> None:
        self.watch.stop()
        self._thread.join(5)


def summary(event: dict[str, Any]) -> tuple[str, str]:
    return event["type"], event["raw_object"]["metadata"]["name"]


def test_watch_sends_initial_state_then_changes(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "w"}})
    kube.core.create_namespaced_config_map("w", {"metadata": {"name": "before"}})
    c = Collector(kube.core.list_namespaced_config_map, "w", timeout_seconds=10)
    try:
        assert summary(c.next()) == ("ADDED", "before")
        kube.core.create_namespaced_config_map("w", {"metadata": {"name": "after"}})
        assert summary(c.next()) == ("ADDED", "after")
        kube.core.patch_namespaced_config_map("after", "w", {"data": {"a": "1"}})
        event = c.next()
        assert summary(event) == ("MODIFIED", "after")
        assert event["object"].data == {"a": "1"}
        kube.core.delete_namespaced_config_map("after", "w")
        deleted = c.next()
        assert summary(deleted) == ("DELETED", "after")
        assert int(deleted["raw_object"]["metadata"]["resourceVersion"]) > int(
            event["raw_object"]["metadata"]["resourceVersion"])
    finally:
        c.stop()


def test_list_then_watch_from_list_resource_version(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "lw"}})
    kube.core.create_namespaced_config_map("lw", {"metadata": {"name": "old"}})
    listed = kube.core.list_namespaced_config_map("lw")
    kube.core.create_namespaced_config_map("lw", {"metadata": {"name": "new"}})
    c = Collector(kube.core.list_namespaced_config_map, "lw",
                  resource_version=listed.metadata.resource_version, timeout_seconds=10)
    try:
        assert summary(c.next()) == ("ADDED", "new")  # history replay, no synthetic "old"
    finally:
        c.stop()


def test_watch_selectors_turn_label_changes_into_added_and_deleted(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "ws"}})
    c = Collector(kube.core.list_namespaced_config_map, "ws", label_selector="on=yes",
                  timeout_seconds=10)
    try:
        kube.core.create_namespaced_config_map("ws", {"metadata": {"name": "x"}})
        kube.core.patch_namespaced_config_map("x", "ws", {"metadata": {"labels": {"on": "yes"}}})
        assert summary(c.next()) == ("ADDED", "x")
        kube.core.patch_namespaced_config_map("x", "ws", {"metadata": {"labels": {"on": "no"}}})
        assert summary(c.next()) == ("DELETED", "x")
    finally:
        c.stop()


def test_watch_field_selector_on_a_namespace_sees_it_go(kube: Kube) -> None:
    kube.core.create_namespace({"metadata": {"name": "bye"}})
    kube.core.create_namespace({"metadata": {"name": "stay"}})
    deleted = kube.core.delete_namespace("bye")
    rv = deleted.metadata.resource_version
    c = Collector(kube.core.list_namespace, field_selector="metadata.name=bye",
                  resource_version=rv, timeout_seconds=10)
    try:
        assert summary(c.next()) == ("DELETED", "bye")
    finally:
        c.stop()


def test_watch_timeout_ends_the_stream(kube: Kube, k8s_sim: Simulator,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The stream's clock stands still until the test moves it, and its waits are recorded:
    # the timeout is observed as the deadline the server sets, then as the end it causes.
    now = [1000.0]
    waits: list[float] = []
    waiting = Signal()

    def select(rlist: Any, wlist: Any, xlist: Any, timeout: float) -> Any:
        waits.append(timeout)
        waiting()
        return real_select.select(rlist, wlist, xlist, timeout)

    real_select = sim_watch.select
    monkeypatch.setattr(sim_watch, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(sim_watch, "select", SimpleNamespace(select=select))
    events: list[Any] = []
    ended = threading.Event()

    def stream() -> None:
        for event in watch.Watch().stream(kube.core.list_namespaced_pod, "default",
                                          timeout_seconds=1):
            events.append(event)
        ended.set()
    threading.Thread(target=stream, daemon=True).start()
    waiting.until(lambda: waits, message="the stream to wait for events")
    # Its end is due one second (of its clock) after it started, not before.
    assert set(waits) == {1.0} and not ended.is_set()
    now[0] += 1.0
    # Then the server ends the stream by itself, sending nothing more.
    assert ended.wait(30), "the watch stream did not end after its timeout"
    assert events == []


def test_resume_after_compaction_gets_410(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "old"}})
    rv = kube.core.list_namespace().metadata.resource_version
    kube.core.create_namespace({"metadata": {"name": "newer"}})
    k8s_sim.compact()
    # Raw response: the server answers 200 and a single ERROR event with a 410 Status.
    resp = kube.core.list_namespace(watch=True, resource_version=rv, _preload_content=False,
                                    timeout_seconds=5)
    lines = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    status = lines[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410
    assert status["reason"] == "Expired" and "too old resource version" in status["message"]
    # The client's Watch helper retries once, then raises ApiException(410).
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(kube.core.list_namespace, resource_version=rv))
    assert info.value.status == 410


def test_history_window_is_bounded(make_sim: Any) -> None:
    sim, kube = make_sim(watch_history=5)
    rv = kube.core.list_namespace().metadata.resource_version
    for i in range(10):
        kube.core.create_namespace({"metadata": {"name": f"n{i}"}})
    with pytest.raises(ApiException) as info:
        list(watch.Watch().stream(kube.core.list_namespace, resource_version=rv))
    assert info.value.status == 410
    recent = str(sim.resource_version - 3)
    events = list(watch.Watch().stream(kube.core.list_namespace, resource_version=recent,
                                       timeout_seconds=1))
    assert [e["object"].metadata.name for e in events] == ["n7", "n8", "n9"]


def test_bookmarks_and_initial_events_end(make_sim: Any) -> None:
    sim, kube = make_sim(bookmark_interval=0.2)
    resp = kube.core.list_namespace(watch=True, allow_watch_bookmarks=True,
                                    send_initial_events=True,
                                    resource_version_match="NotOlderThan",
                                    timeout_seconds=1, _preload_content=False)
    events = [json.loads(line) for line in resp.data.decode().splitlines() if line]
    types = [e["type"] for e in events]
    assert types[:4] == ["ADDED"] * 4  # the four system namespaces
    assert types[4] == "BOOKMARK"
    assert events[4]["object"]["metadata"]["annotations"] == {
        "k8s.io/initial-events-end": "true"}
    assert types.count("BOOKMARK") >= 3  # initial-end, periodic, and one at the timeout
    assert events[-1]["object"]["metadata"]["resourceVersion"] == str(sim.resource_version)


def test_watch_client_can_resume_from_bookmark(make_sim: Any) -> None:
    sim, kube = make_sim(bookmark_interval=0.1)
    w = watch.Watch()
    seen = []
    for event in w.stream(kube.core.list_namespace, allow_watch_bookmarks=True,
                          resource_version=str(sim.resource_version), timeout_seconds=1):
        seen.append(event["type"])
    assert set(seen) == {"BOOKMARK"}
    assert w.resource_version == str(sim.resource_version)


def test_client_disconnect_mid_watch_is_harmless(kube: Kube, k8s_sim: Simulator,
                                                 changes: Signal) -> None:
    c = Collector(kube.core.list_namespace, timeout_seconds=60)
    c.next()
    changes.until(lambda: k8s_sim.open_watches == 1)
    c.stop()
    changes.until(lambda: k8s_sim.open_watches == 0, message="the server to notice the disconnect")
    # And abruptly: a raw TLS connection that asks for a watch and vanishes.
    ctx = ssl.create_default_context(cadata=k8s_sim.ca_pem)
    raw = socket.create_connection(("127.0.0.1", k8s_sim.port))
    tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(f"GET /api/v1/pods?watch=true HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                f"{k8s_sim.admin_token}\r\n\r\n".encode())
    assert tls.recv(100).startswith(b"HTTP/1.1 200")
    tls.close()  # no TLS close_notify, no end of the HTTP exchange: just gone
    changes.until(lambda: k8s_sim.open_watches == 0)
    kube.core.create_namespace({"metadata": {"name": "still-alive"}})


def test_stop_closes_open_watches_promptly(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim()
    c = Collector(kube.core.list_namespace, timeout_seconds=600)
    c.next()
    changes.until(lambda: sim.open_watches == 1)
    stopped = threading.Event()
    threading.Thread(target=lambda: (sim.stop(), stopped.set()), daemon=True).start()
    # An open watch must not hold the stop up (its deadline: the stream's 600 s timeout).
    assert stopped.wait(30), "stop() waited for the open watch"
    assert c.done.wait(5)
