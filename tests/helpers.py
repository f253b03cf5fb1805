"""Small helpers shared by the tests: connection details, condition waits, and a build in
progress on Zuul's side."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

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
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


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
