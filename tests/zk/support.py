"""What the cache tests share: waiting on a mirror's own thread, and writing a record as
another client while knowing when the mirror has counted the change."""

from __future__ import annotations

import threading
from typing import Any

from kazoo.client import KazooClient

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
