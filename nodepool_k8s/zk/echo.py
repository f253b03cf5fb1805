"""Own writes echoed into the caches: what this process wrote need not be read back.

Owns: telling a cache (an `Observer`, see `mirror.ChildMirror`) about each data write this
ZooKeeper client makes to one of the cache's children, twice: before the write is sent
(`expect_write`: a change event for that child may come, and its read can wait) and once its
outcome is known (`settle_write`: the data and the znode's new stat, or None when the write
failed or its outcome is unknown). A successful write's answer is a read answer the cache
got for free; the persistent watch's event for the same write then costs no read.

Why both calls: ZooKeeper sends a session the notification of its own write before the
write's answer, so without the first call the cache would already have sent the read the
answer makes unnecessary. (Only the saving depends on that order, not correctness: an
answer that comes first is applied, and the event after it is counted as answered or read.)
A transaction that sets one child twice is echoed once, with the last set's data, so the
cache never shows the state in between, which no reader could see. A single creation
(`ZkClient.create`, not in a transaction) is echoed too: it is sent as ZooKeeper's
create2, whose answer carries the stat; the creation of a sequential child is expected by
its name's prefix (its counter is known only from the answer), and the observer holds
back the read of any child created with that prefix until the answer says which is ours.

Failure: `settle_write` is called for every `expect_write` that returned True, whatever
happens to the write (kazoo fails every request still pending when the connection drops);
an observer that raises is logged and skipped. Observers run on the writer's thread or on
kazoo's callback thread and must only queue work.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from kazoo.protocol.states import ZnodeStat

log = logging.getLogger("nodepool_k8s.zk.echo")


class Observer(Protocol):
    def expect_write(self, key: str, sequence: bool = False) -> bool:
        """A write of child `key` is about to be sent (`sequence`: the creation of a
        sequential child whose name will be `key` and a counter); False: not interested."""

    def settle_write(self, key: str, data: bytes, stat: ZnodeStat | None,
                     created: str | None = None) -> None:
        """That write is over: `stat` after it, or None (failed, or outcome unknown);
        `created`: for a sequential creation, the name the child got ("" if none)."""


Expected = list[tuple[int, Observer, str, bytes]]
"""Per expected write: its index among the results, the observer, the child, the data."""


class WriteEchoes:
    """The observers of one client, by the znode whose children they mirror."""

    def __init__(self) -> None:
        self._observers: dict[str, tuple[Observer, ...]] = {}
        self._lock = threading.Lock()

    def add(self, root: str, observer: Observer) -> None:
        with self._lock:
            self._observers[root] = self._observers.get(root, ()) + (observer,)

    def remove(self, root: str, observer: Observer) -> None:
        with self._lock:
            left = tuple(o for o in self._observers.get(root, ()) if o is not observer)
            if left:
                self._observers[root] = left
            else:
                self._observers.pop(root, None)

    def expect(self, writes: list[tuple[int, str, bytes]], sequence: bool = False
               ) -> Expected:
        """`writes`: (result index, path, data) of each data write about to be sent
        (`sequence`: one creation of a sequential znode, `path` its prefix)."""
        expected: Expected = []
        if not self._observers:
            return expected
        last = {path: index for index, path, _ in writes}
        for index, path, data in writes:
            if last[path] != index:
                continue  # set again later in the same transaction
            root, _, key = path.rpartition("/")
            for observer in self._observers.get(root, ()):
                try:
                    if observer.expect_write(key, sequence):
                        expected.append((index, observer, key, data))
                except Exception:
                    log.exception("write observer of %s failed", root)
        return expected

    @staticmethod
    def settle(expected: Expected, results: list[Any] | None,
               created: str | None = None) -> None:
        """`results`: the write's per-operation results (stats for data writes), or None
        when it failed as a whole or its outcome is unknown; `created`: for a sequential
        creation, the path it made ("" when it made none)."""
        name = created.rpartition("/")[2] if created is not None else None
        for index, observer, key, data in expected:
            stat = None
            if results is not None and index < len(results) \
                    and isinstance(results[index], ZnodeStat):
                stat = results[index]
            try:
                if name is None:
                    observer.settle_write(key, data, stat)
                else:
                    observer.settle_write(key, data, stat, name)
            except Exception:
                log.exception("write observer of %s failed", key)

    @classmethod
    def settle_from(cls, expected: Expected, answer: Any) -> None:
        """`settle` from a kazoo async result of a transaction (a `rawlink` callback)."""
        try:
            results = answer.get_nowait()
        except Exception:  # noqa: BLE001 - any failure: the outcome is unknown here
            results = None
        cls.settle(expected, results if isinstance(results, list) else None)
