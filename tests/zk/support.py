"""What the cache tests share: waiting on a mirror's own thread, writing a record as
another client while knowing when the mirror has counted the change, and counting a
client's listings of the nodes and reads of the quota guards."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.zk import paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.mirror import ChildMirror
from tests.helpers import wait_for


def drained(mirror: ChildMirror[Any]) -> None:
    """Wait until the cache's thread has handled everything queued before now (queued
    past `_submit`: a test's `submissions` signal hears nothing of it)."""
    done = threading.Event()
    mirror._tasks.put((done.set, ()))
    assert done.wait(10)


def write_counted(kazoo: KazooClient, mirror: ChildMirror[Any], key: str, path: str,
                  data: bytes) -> None:
    """Write `data` at `path` (the mirror's child `key`) and wait until the mirror has
    counted the change (a change it leaves unread tells the listeners nothing: polled)."""
    counted = mirror._changes.get(key, 0)
    kazoo.set(path, data)
    wait_for(lambda: mirror._changes.get(key, 0) == counted + 1, 10)
    drained(mirror)


def held_up(mirror: ChildMirror[Any]) -> threading.Event:
    """Hold the mirror's thread until the returned event is set: events queue meanwhile,
    in the order they came (as a burst read in one go from the network would)."""
    go = threading.Event()
    mirror._tasks.put((go.wait, (10,)))
    return go


def queued_event_of(mirror: ChildMirror[Any], path: str) -> bool:
    """Whether a watch event about exactly `path` waits in the mirror's queue."""
    return any(path in args for _, args in list(mirror._tasks.queue) if _ is not None)


class Listings:
    """Counts this client's listings of `/nodepool/nodes` (pipelined with the guard
    reads, or alone)."""

    def __init__(self, zkc: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        children, both = zkc.get_children, zkc.exists_and_children

        def get_children(path: str) -> Any:
            self.count += path == paths.NODES
            return children(path)

        def exists_and_children(exists_paths: list[str], children_path: str) -> Any:
            self.count += children_path == paths.NODES
            return both(exists_paths, children_path)
        monkeypatch.setattr(zkc, "get_children", get_children)
        monkeypatch.setattr(zkc, "exists_and_children", exists_and_children)


class GuardReads:
    """Counts this client's reads of guard znodes (`exists`, alone or pipelined)."""

    def __init__(self, zkc: ZkClient, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        exists, exists_all = zkc.exists, zkc.exists_all

        def one(path: str) -> Any:
            self.count += path.startswith(paths.GUARDS + "/")
            return exists(path)

        def many(exists_paths: list[str]) -> Any:
            self.count += sum(p.startswith(paths.GUARDS + "/") for p in exists_paths)
            return exists_all(exists_paths)
        monkeypatch.setattr(zkc, "exists", one)
        monkeypatch.setattr(zkc, "exists_all", many)
