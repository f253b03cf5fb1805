"""Small helpers shared by the tests: connection details, condition waits, and a build in
progress on Zuul's side."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, TypeVar

import pytest


from nodepool_k8s.dev.testing.zuul_client import NodeSet, ZuulClient
from nodepool_k8s.zk.client import ZkClient, ZkSettings

T = TypeVar("T")


@dataclass(frozen=True)
class ZkConnection:
    host: str
    port: int
    chroot: str
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @property
    def hosts(self) -> str:
        """kazoo-style host string including the chroot."""
        return f"{self.host}:{self.port}{self.chroot}"

    def config_yaml(self) -> str:
        """The `zookeeper-servers` (and `zookeeper-tls`) part of a nodepool.yaml."""
        text = (f"zookeeper-servers:\n  - host: {self.host}\n    port: {self.port}\n"
                f"    chroot: {self.chroot}\n")
        if self.tls_ca:
            text += (f"zookeeper-tls:\n  ca: {self.tls_ca}\n  cert: {self.tls_cert}\n"
                     f"  key: {self.tls_key}\n")
        return text


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, interval: float = 0.01,
             message: str = "condition") -> T:
    """Poll `predicate` until it returns a truthy value or the deadline passes. Only for
    what tells of no change (another process, a file): anything with a listener hook is
    waited on with `Signal` instead."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class Signal:
    """An event-driven wait: a listener to register with whatever reports changes (a
    ZooKeeper cache or `ZkClient`, the simulator, a driver watch), and `until(predicate)`,
    which checks the predicate now and again after each notification, never on a timer.

    `listen(source, **options)` calls `source.add_listener(self, **options)`; `close()` (or
    leaving a `with` block) removes it from every source again. Called as a listener it
    takes and ignores any arguments, from any thread, and never blocks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._count = 0
        self._sources: list[Any] = []

    def __call__(self, *args: object, **kwargs: object) -> None:
        with self._cond:
            self._count += 1
            self._cond.notify_all()

    @property
    def count(self) -> int:
        """Notifications so far."""
        with self._cond:
            return self._count

    def listen(self, source: Any, **options: Any) -> "Signal":
        source.add_listener(self, **options)
        self._sources.append(source)
        return self

    def close(self) -> None:
        while self._sources:
            self._sources.pop().remove_listener(self)

    def __enter__(self) -> "Signal":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def until(self, predicate: Callable[[], T], timeout: float = 15.0,
              message: str = "condition") -> T:
        """`predicate()`'s first truthy value, checked now and after every notification;
        AssertionError if none came by the deadline (a change no source reported, or
        nothing changed)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._count  # before the check: a change during it wakes us at once
            value = predicate()
            if value:
                return value
            with self._cond:
                while self._count == seen:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise AssertionError(
                            f"timed out after {timeout}s waiting for {message}")
                    self._cond.wait(remaining)


def submissions(mirror: Any, monkeypatch: pytest.MonkeyPatch) -> Signal:
    """A `Signal` told of every task queued for a `ChildMirror`'s thread, once it is queued
    (for a test that holds that thread and waits for events to pile up behind it)."""
    signal = Signal()
    submit = mirror._submit

    def submitting(fn: Callable[..., None], *args: Any) -> None:
        submit(fn, *args)
        signal()

    monkeypatch.setattr(mirror, "_submit", submitting)
    return signal


def replaced(text: str, old: str, new: str, count: int = 1) -> str:
    """`text` with `old` replaced by `new`, failing loudly if `old` occurs other than
    `count` times (a template edited elsewhere must not turn a test into a no-op)."""
    found = text.count(old)
    if found != count:
        raise AssertionError(f"expected {count} occurrence(s) of {old!r}, found {found}")
    return text.replace(old, new)


def in_use(zuul: ZuulClient, labels: list[str], timeout: float = 30.0) -> NodeSet:
    """A build in progress: its request fulfilled within `timeout`, Zuul holds the lock of
    every node and marked them in-use."""
    request_id = zuul.submit(labels)
    body = zuul.wait(request_id, timeout)
    assert body is not None and body["state"] == "fulfilled", body
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    return nodeset


def client_for(zk: ZkConnection, timeout: float = 5.0) -> ZkClient:
    """A started `ZkClient` on `zk` (stop it when done)."""
    client = ZkClient(ZkSettings(hosts=zk.hosts, timeout=timeout))
    assert client.start()
    return client
