"""ZooKeeper helpers for the benchmark's load generator (never used by the launcher).

Owns the parts of the benchmark that need raw kazoo (which only this package imports):

- `fill_nodes`: create thousands of node records (each with its `lock` dir, as a node that
  was ever locked has) in large transactions, for the scale measurements;
- `NodeWatcher`: one children watch on `/nodepool/nodes` that notes when each node appears
  and disappears and the most nodes ever seen at once (quota checks, cleanup latency);
- `timed_wait`: wait for a request to reach a final state and note *when the watch
  fired*, which is when Zuul learns of it (not when a busy load thread got to run);
  `watch_final` does the same without a waiting thread, for many requests at once (the
  bursts).

Failure: kazoo exceptions propagate (a benchmark run fails loudly).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.zk import paths

FINAL_STATES = ("fulfilled", "failed")


def fill_nodes(client: KazooClient, records: Iterable[tuple[str, dict[str, Any]]],
               batch_bytes: int = 512 * 1024) -> int:
    """Create `(node_id, record)` nodes and their empty lock dirs in transactions of at most
    about `batch_bytes` (ZooKeeper refuses requests over `jute.maxbuffer`, 1 MiB).
    Returns how many nodes were created."""
    client.ensure_path(paths.NODES)
    created = 0
    txn, size, pending = client.transaction(), 0, 0
    for node_id, record in records:
        data = json.dumps(record).encode("utf8")
        txn.create(paths.node_path(node_id), data)
        txn.create(paths.node_lock_path(node_id), b"")
        size += len(data) + 200
        pending += 1
        if size >= batch_bytes:
            _commit(txn)
            created += pending
            txn, size, pending = client.transaction(), 0, 0
    if pending:
        _commit(txn)
        created += pending
    return created


def _commit(txn: Any) -> None:
    results = txn.commit()
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"node fill transaction failed: {failed[0]!r}")


class NodeWatcher:
    """Watches `/nodepool/nodes`: first-seen and gone times per node, and the maximum
    number of nodes present at once (sampled at every change of the child list).

    Children watches are one-shot and re-armed by the listing that follows the event, so
    changes that cancel out between two listings are not seen: the maximum is a sample, a
    lower bound of the true peak (which the launchers' guarded creates bound exactly)."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.appeared: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.max_nodes = 0
        self.samples = 0
        self._known: set[str] = set()
        self._stopped = False
        self._changed = threading.Condition()
        client.ensure_path(paths.NODES)
        client.ChildrenWatch(paths.NODES, self._on_children)

    def _on_children(self, children: list[str]) -> bool | None:
        now = time.monotonic()
        if self._stopped:
            return False
        current = {c for c in children if paths.is_node_id(c)}
        with self._changed:
            for node_id in current - self._known:
                self.appeared.setdefault(node_id, now)
            for node_id in self._known - current:
                self.gone.setdefault(node_id, now)
            self._known = current
            self.samples += 1
            self.max_nodes = max(self.max_nodes, len(current))
            self._changed.notify_all()
        return None

    def count(self) -> int:
        with self._changed:
            return len(self._known)

    def reset_max(self) -> None:
        with self._changed:
            self.max_nodes = len(self._known)

    def wait_gone(self, node_ids: Iterable[str], timeout: float) -> bool:
        """Wait until every one of `node_ids` was seen gone (or was never seen at all);
        False on timeout."""
        wanted = set(node_ids)
        deadline = time.monotonic() + timeout
        with self._changed:
            while any(n in self.appeared and n not in self.gone for n in wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def wait_empty(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._known:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        """The watch ends at its next event."""
        self._stopped = True


def timed_wait(client: KazooClient, request_id: str, timeout: float,
               states: tuple[str, ...] = FINAL_STATES) -> tuple[dict[str, Any] | None, float]:
    """Block until the request reaches one of `states`: (body, monotonic time the watch
    delivered it). (None, time) if it was deleted; TimeoutError after `timeout`."""
    done = threading.Event()
    seen: dict[str, Any] = {}

    def watch(data: bytes | None, stat: Any, event: Any = None) -> bool | None:
        if done.is_set():
            return False
        if data is None and stat is None:
            seen["at"] = time.monotonic()
            done.set()
            return False
        if data:
            body = json.loads(data.decode("utf8"))
            if body.get("state") in states:
                seen["at"] = time.monotonic()
                seen["body"] = body
                done.set()
                return False
        return None

    client.DataWatch(paths.request_path(request_id), watch)
    if not done.wait(timeout):
        raise TimeoutError(f"request {request_id} not in {states} after {timeout:g}s")
    return seen.get("body"), seen["at"]


FinalCallback = Callable[[dict[str, Any] | None, float, BaseException | None, float | None],
                         None]


def watch_final(client: KazooClient, request_id: str, on_final: FinalCallback,
                states: tuple[str, ...] = FINAL_STATES) -> None:
    """Call `on_final(body, at, error, lag)` once, from one of kazoo's callback threads,
    when the request reaches one of `states` (`at`: monotonic time the read delivered it;
    `lag`: seconds from the write of that state, the znode's mtime, to then, a check that
    the load generator sees fulfilments promptly); body None if it was deleted (error None)
    or could not be read (error set). Nothing blocks: an asynchronous read that sets a data
    watch, and again after each watch event, so hundreds of requests are watched without a
    thread each."""
    path = paths.request_path(request_id)
    lock = threading.Lock()  # watch events and read results come on different threads
    fired = False

    def finish(body: dict[str, Any] | None, error: BaseException | None,
               mtime_ms: int | None = None) -> None:
        nonlocal fired
        at, now = time.monotonic(), time.time()
        with lock:
            if fired:
                return
            fired = True
        on_final(body, at, error, None if mtime_ms is None else now - mtime_ms / 1000.0)

    def on_event(event: Any) -> None:
        with lock:
            if fired:
                return
        read()

    def on_data(result: Any) -> None:
        try:
            data, stat = result.get()
        except NoNodeError:
            finish(None, None)
            return
        except Exception as exc:
            finish(None, exc)
            return
        body = json.loads(data.decode("utf8")) if data else {}
        if body.get("state") in states:
            finish(body, None, stat.mtime)

    def read() -> None:
        client.get_async(path, watch=on_event).rawlink(on_data)

    read()
