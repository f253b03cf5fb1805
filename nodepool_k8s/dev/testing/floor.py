"""The protocol floor: a launcher that does only Nodepool's mandatory ZooKeeper work.

Owns: a benchmark helper (never production code) that serves node requests the way the
Nodepool protocol requires and does nothing else: no Kubernetes call, no cache, no quota,
no upkeep. Per request: lock the request (a kazoo-compatible lock contender and one
listing), read it, write `pending`, create one `ready` node per requested type (allocated
to the request), write `fulfilled` with the node ids and unlock in one transaction: four
writes and two reads. Per node after Zuul's release
(`used`, unlocked): lock the node and remove it with its lock dir in one transaction. It
registers a launcher and a pool component, so Zuul's tooling and the benchmark's
`Stack.wait_launchers` see it like a launcher.

What it measures: how fast a launcher could serve a burst if everything but the protocol's
ZooKeeper round trips cost nothing. `tools/benchmark` and
`tools/compat/burst_side_by_side.py` run it in the same harness as the real launcher and
print its figures beside the real ones.

Run: `python -m nodepool_k8s.dev.testing.floor -c CONFIG` (a launcher configuration: its
ZooKeeper keys, and the first provider, pool and labels are used). SIGTERM or SIGINT stop
it (exit 0). Failure: kazoo exceptions of one request are logged and that request is left
alone (the run that needs it times out); a lost session ends the process with status 1.
"""

from __future__ import annotations

import argparse
import heapq
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType, KazooState, WatchedEvent

from nodepool_k8s.zk import paths

log = logging.getLogger("nodepool_k8s.floor")


def sort_key(request_id: str) -> tuple[str, str]:
    """Nodepool's order without relative priorities: priority prefix, then sequence."""
    prio, _, seq = request_id.partition("-")
    return prio, seq


def node_record(request: dict[str, Any], request_id: str, label: str, provider: str,
                pool: str, launcher: str) -> dict[str, Any]:
    """A ready namespace-like node with every key Nodepool writes (Zuul reads them)."""
    now = time.time()
    return {
        "state": "ready", "state_time": now, "created_time": now, "cloud": "floor",
        "provider": provider, "pool": pool, "type": [label], "allocated_to": request_id,
        "az": None, "region": None, "public_ipv4": None, "private_ipv4": None,
        "public_ipv6": None, "host_id": None, "interface_ip": None,
        "connection_type": "namespace", "connection_port": {
            "namespace": f"floor-{uuid.uuid4().hex[:12]}", "host": "https://floor.invalid",
            "skiptls": False, "token": "floor", "ca_crt": "", "user": "zuul-worker"},
        "ssh_port": 22, "image_id": None, "launcher": launcher, "external_id": None,
        "hostname": None, "comment": None, "user_data": None, "hold_job": None,
        "host_keys": [], "username": "zuul", "shell_type": None, "hold_expiration": None,
        "resources": {"instances": 1}, "slot": None, "attributes": None,
        "python_path": "auto", "tenant_name": request.get("tenant_name"),
        "driver_data": None, "requestor": request.get("requestor"), "node_properties": [],
    }


class Floor:
    """Serves requests with `workers` threads over one kazoo session."""

    def __init__(self, client: KazooClient, provider: str, pool: str, labels: Sequence[str],
                 workers: int = 4) -> None:
        self.client = client
        self.provider = provider
        self.pool = pool
        self.labels = list(labels)
        self.workers = max(1, workers)
        self.hostname = socket.gethostname()
        self.launcher_id = f"{self.hostname}-Floor.{provider}-{pool}-{uuid.uuid4().hex}"
        self._cond = threading.Condition()
        self._queue: list[tuple[int, tuple[str, str], str, str]] = []  # heap
        self._seen: set[str] = set()
        self._gone: set[str] = set()  # nodes this process removed (late watches ignore them)
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self.lost = threading.Event()

    # -- registration ------------------------------------------------------------------
    def register(self) -> None:
        common = {"hostname": self.hostname, "state": "running", "version": "floor",
                  "model_api": 0}
        launcher = dict(common, kind="launcher")
        pool = dict(common, kind="pool", id=self.launcher_id, name=self.pool,
                    provider_name=self.provider, supported_labels=self.labels,
                    priority=100, paused=False)
        for kind, body in (("launcher", launcher), ("pool", pool)):
            self.client.create(paths.component_prefix(kind, self.hostname),
                               json.dumps(body, sort_keys=True).encode("utf8"),
                               ephemeral=True, sequence=True, makepath=True)

    # -- the work queue ----------------------------------------------------------------
    def _put(self, kind: str, key: tuple[str, str], item: str) -> None:
        with self._cond:
            # Deletions first (they free what Zuul holds), then requests in priority order.
            heapq.heappush(self._queue, (0 if kind == "delete" else 1, key, item, kind))
            self._cond.notify()

    def _on_requests(self, children: list[str]) -> bool | None:
        if self._stopping:
            return False
        names = {c for c in children if paths.is_request_id(c)}
        with self._cond:
            new = names - self._seen
            self._seen &= names
            self._seen |= new
        for name in sorted(new, key=sort_key):
            self._put("request", sort_key(name), name)
        return None

    def start(self) -> None:
        self.client.ensure_path(paths.REQUESTS)
        self.client.ensure_path(paths.NODES)
        self.client.ensure_path(paths.REQUEST_LOCKS)
        self.register()
        self.client.ChildrenWatch(paths.REQUESTS, self._on_requests)
        for index in range(self.workers):
            thread = threading.Thread(target=self._run, name=f"floor-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                _, _, item, kind = heapq.heappop(self._queue)
            try:
                if kind == "request":
                    self.serve(item)
                else:
                    self.delete(item)
            except Exception:
                log.exception("%s %s", kind, item)

    # -- locks (the kazoo Lock recipe's znodes, without its blocking machinery) ---------
    def _lock(self, directory: str, new_dir: bool) -> str | None:
        """A contender under `directory`; its path when it is the lowest, else None (and
        the contender removed). With `new_dir` (the directory probably does not exist yet)
        the directory and the contender are created in one transaction; a directory that
        exists after all costs a second write, a missing one (without `new_dir`) too."""
        name = f"{directory}/{uuid.uuid4().hex}{paths.LOCK_NODE_NAME}"
        mine: str | None = None
        if new_dir:
            txn = self.client.transaction()
            txn.create(directory, b"")
            txn.create(name, b"", ephemeral=True, sequence=True)
            results = txn.commit()
            if not any(isinstance(r, Exception) for r in results):
                mine = str(results[1])
        if mine is None:
            try:
                mine = str(self.client.create(name, b"", ephemeral=True, sequence=True))
            except NoNodeError:
                return None  # a node's lock dir: the node is gone
        children = self.client.get_children(directory)
        seqs = sorted(c.rsplit(paths.LOCK_NODE_NAME, 1)[-1] for c in children
                      if paths.LOCK_NODE_NAME in c)
        if seqs and mine.endswith(seqs[0]):
            return str(mine)
        self.client.delete(mine)
        return None

    # -- requests ----------------------------------------------------------------------
    def serve(self, request_id: str) -> None:
        path = paths.request_path(request_id)
        lock = self._lock(paths.request_lock_path(request_id), new_dir=True)
        if lock is None:
            return
        unlocked = False
        try:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                return
            body = json.loads(data.decode("utf8")) if data else {}
            if body.get("state") != "requested":
                return
            body.update(state="pending", state_time=time.time())
            stat = self.client.set(path, json.dumps(body).encode("utf8"),
                                   version=stat.version)
            # The nodes (pipelined creates: their ids are ZooKeeper's sequence numbers,
            # known only from its answers), then `fulfilled` naming them together with the
            # unlock, one transaction.
            records = [node_record(body, request_id, label, self.provider, self.pool,
                                   self.launcher_id) for label in body.get("node_types") or []]
            pending = [self.client.create_async(paths.NODE_CREATE_PREFIX,
                                                json.dumps(r).encode("utf8"), sequence=True)
                       for r in records]
            nodes = [paths.basename(str(p.get())) for p in pending]
            body.update(state="fulfilled", state_time=time.time(), nodes=nodes)
            txn = self.client.transaction()
            txn.set_data(path, json.dumps(body).encode("utf8"), version=stat.version)
            txn.delete(lock)
            results = txn.commit()
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                raise failed[0]
            unlocked = True
            for node_id in nodes:
                self._watch_node(node_id)
        finally:
            if not unlocked:
                self.client.delete(lock)

    # -- nodes -------------------------------------------------------------------------
    def _watch_node(self, node_id: str) -> None:
        """Until the node is `used`: read it with a data watch, and again on each change."""
        path = paths.node_path(node_id)

        def on_event(event: WatchedEvent) -> None:
            if event.type != EventType.DELETED and not self._stopping:
                self.client.get_async(path, watch=on_event).rawlink(on_data)

        def on_data(result: Any) -> None:
            try:
                data, _ = result.get()
            except NoNodeError:
                return
            except Exception:
                log.exception("reading node %s", node_id)
                return
            if data and json.loads(data.decode("utf8")).get("state") == "used":
                self._put("delete", ("", node_id), node_id)

        self.client.get_async(path, watch=on_event).rawlink(on_data)

    def delete(self, node_id: str) -> None:
        """Lock the used node and remove it with its lock dir; while Zuul still holds its
        lock, try again when the lock dir changes."""
        lock_dir = paths.node_lock_path(node_id)
        with self._cond:
            if node_id in self._gone:
                return

        def on_lock_dir(event: WatchedEvent) -> None:
            if not self._stopping and event.type == EventType.CHILD:
                self._put("delete", ("", node_id), node_id)

        try:
            holders = self.client.get_children(lock_dir)
        except NoNodeError:
            holders = []
        if holders:
            # Zuul still holds it: again when the lock dir changes (re-listed with the watch,
            # so that a release in between is not missed).
            try:
                if self.client.get_children(lock_dir, watch=on_lock_dir):
                    return
            except NoNodeError:
                pass
        mine = self._lock(lock_dir, new_dir=False)
        if mine is None:
            return
        txn = self.client.transaction()
        txn.delete(mine)
        txn.delete(lock_dir)
        txn.delete(paths.node_path(node_id))
        results = txn.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            with self._cond:
                self._gone.add(node_id)
        else:
            log.warning("deleting node %s: %r", node_id, failed[0])
            try:
                self.client.delete(mine)
            except NoNodeError:
                pass


def main(argv: Sequence[str] | None = None) -> int:
    from nodepool_k8s.config.loader import load_config
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-c", "--config", required=True, help="a launcher configuration")
    parser.add_argument("--workers", type=int, default=4, help="serving threads (4)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config)
    provider = next(iter(config.providers.values()))
    pool = next(iter(provider.pools.values()))
    tls = config.zookeeper_tls
    kwargs: dict[str, Any] = {}
    if tls is not None:
        kwargs.update(use_ssl=True, ca=tls.ca, certfile=tls.cert, keyfile=tls.key)
    client = KazooClient(hosts=config.zk_hosts(), timeout=config.zookeeper_timeout, **kwargs)
    client.start(timeout=30)
    floor = Floor(client, provider.name, pool.name, list(pool.labels), args.workers)

    def on_state(state: str) -> None:
        if state == KazooState.LOST:
            floor.lost.set()

    client.add_listener(on_state)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    floor.start()
    log.info("floor %s serving %s/%s (%s), pid %d", floor.launcher_id, provider.name,
             pool.name, ", ".join(floor.labels), os.getpid())
    while not done.wait(0.2):
        if floor.lost.is_set():
            log.error("ZooKeeper session lost")
            floor.stop()
            client.stop()
            return 1
    floor.stop()
    client.stop()
    client.close()
    log.info("floor stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
