"""A client that talks to the launcher exactly the way Zuul 14's scheduler and executor do.

Owns: test/benchmark-side emulation of Zuul's half of the Nodepool protocol (see
nodepool-protocol.md Part B), on a raw `KazooClient` and kazoo's own `Lock` recipe, so the
launcher is exercised against the real wire behaviour rather than our own store code:

- `submit` writes exactly Zuul's request keys (persistent sequential `<prio>-<seq>`;
  `requestor_data` with span ids larger than 2**63); `submit_async` the same without
  waiting for the answer (the benchmark's bursts);
- `wait` watches the request until it is fulfilled or failed (or deleted);
- `accept` reads each node, checks `allocated_to`, locks it (30 s timeout), re-checks and
  then deletes the request, like the executor's acceptNodes;
- `use` / `release` / `hold` rewrite whole nodes without a version (plus Zuul's `id` key)
  while holding the lock, then unlock;
- `cancel` deletes a request at any moment; `revise_priority` rewrites relative_priority
  under the request lock with a versioned set, skipping when the launcher holds the lock.

It lives in the `zk` package because it imports kazoo; it is not used by the launcher.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout, NoNodeError
from kazoo.recipe.lock import Lock

from nodepool_k8s.zk import paths

FINAL_STATES = ("fulfilled", "failed")
# Zuul's tracing span ids are 64/128-bit integers; these do not fit a signed 64-bit int.
BIG_TRACE_ID = 2**127 + 12345
BIG_SPAN_ID = 2**64 - 7


class ZuulError(Exception):
    """What Zuul would turn into NODE_FAILURE (wrong allocation, lock timeout, ...)."""


@dataclass
class HeldNode:
    """A node Zuul has locked for a build."""

    id: str
    data: dict[str, Any]
    lock: Lock


@dataclass
class NodeSet:
    request_id: str
    nodes: list[HeldNode] = field(default_factory=list)


def requestor_data(job: str = "job") -> dict[str, Any]:
    return {"build_set_uuid": uuid.uuid4().hex, "tenant_name": "tenant-1",
            "pipeline_name": "check", "job_uuid": uuid.uuid4().hex, "job_name": job,
            "span_info": {"trace_id": BIG_TRACE_ID, "span_id": BIG_SPAN_ID,
                          "trace_flags": 1}}


class ZuulClient:
    def __init__(self, hosts: str, *, system_id: str | None = None,
                 tls: tuple[str, str, str] | None = None, timeout: float = 10.0,
                 auth_data: list[tuple[str, str]] | None = None) -> None:
        """`tls` is (ca, cert, key) paths; `auth_data` kazoo's (scheme, credential) pairs,
        e.g. `[("digest", "zuul:secret")]`. Like Zuul, it sets no ACL of its own: what
        it creates (requests, lock contenders) gets ZooKeeper's open ACL."""
        kw: dict[str, Any] = {}
        if tls:
            kw.update(use_ssl=True, ca=tls[0], certfile=tls[1], keyfile=tls[2])
        if auth_data:
            kw.update(auth_data=auth_data)
        self.client = KazooClient(hosts=hosts, timeout=timeout, **kw)
        self.client.start(timeout=20)
        self.system_id = system_id or uuid.uuid4().hex

    def close(self) -> None:
        self.client.stop()
        self.client.close()

    def __enter__(self) -> "ZuulClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------
    def submit(self, node_types: Iterable[str], *, priority: str = "200",
               relative_priority: int = 0, provider: str | None = None,
               tenant_name: str | None = "tenant-1", event_id: str | None = None,
               data: dict[str, Any] | None = None) -> str:
        body = self.request_body(node_types, relative_priority=relative_priority,
                                 provider=provider, tenant_name=tenant_name,
                                 event_id=event_id, data=data)
        path = self.client.create(f"{paths.REQUESTS}/{priority:0>3}-", body, makepath=True,
                                  sequence=True)
        return paths.basename(path)

    def submit_async(self, body: bytes, *, priority: str = "200") -> Any:
        """`submit` without waiting for ZooKeeper's answer: kazoo's async result of the
        create (its value is the new request's path). A body from `request_body`. Many of
        these pipeline on the session: the benchmark submits a burst this way."""
        return self.client.create_async(f"{paths.REQUESTS}/{priority:0>3}-", body,
                                        makepath=True, sequence=True)

    def request_body(self, node_types: Iterable[str], *, relative_priority: int = 0,
                     provider: str | None = None, tenant_name: str | None = "tenant-1",
                     event_id: str | None = None,
                     data: dict[str, Any] | None = None) -> bytes:
        """The request znode's data, exactly Zuul's keys."""
        now = time.time()
        body = {
            "node_types": list(node_types),
            "requestor": self.system_id,
            "requestor_data": data if data is not None else requestor_data(),
            "state": "requested",
            "state_time": now,
            "created_time": now,
            "relative_priority": relative_priority,
            "event_id": event_id or uuid.uuid4().hex,
            "provider": provider,
            "tenant_name": tenant_name,
        }
        return json.dumps(body).encode("utf8")

    def get_request(self, request_id: str) -> dict[str, Any] | None:
        try:
            data, _ = self.client.get(paths.request_path(request_id))
        except NoNodeError:
            return None
        body: dict[str, Any] = json.loads(data.decode("utf8"))
        return body

    def request_children(self, request_id: str) -> list[str]:
        try:
            return list(self.client.get_children(paths.request_path(request_id)))
        except NoNodeError:
            return []

    def wait(self, request_id: str, timeout: float = 30.0,
             states: tuple[str, ...] = FINAL_STATES) -> dict[str, Any] | None:
        """Block (on a watch) until the request reaches one of `states`; None if deleted."""
        done = threading.Event()
        seen: dict[str, Any] = {}

        def watch(data: bytes | None, stat: Any, event: Any = None) -> bool | None:
            if data is None and stat is None:
                seen["deleted"] = True
                done.set()
                return False
            if data:
                body = json.loads(data.decode("utf8"))
                if body.get("state") in states:
                    seen["body"] = body
                    done.set()
                    return False
            return None

        self.client.DataWatch(paths.request_path(request_id), watch)
        if not done.wait(timeout):
            raise TimeoutError(f"request {request_id} not in {states} after {timeout}s: "
                               f"{self.get_request(request_id)}")
        return seen.get("body")

    def cancel(self, request_id: str) -> None:
        """Zuul's cancel: a non-recursive delete (fails if someone put a child there)."""
        try:
            self.client.delete(paths.request_path(request_id))
        except NoNodeError:
            pass

    def revise_priority(self, request_id: str, relative_priority: int) -> bool:
        """Zuul's relative-priority revision; False when the launcher holds the lock."""
        lock = Lock(self.client, paths.request_lock_path(request_id))
        if not lock.acquire(blocking=False):
            return False
        try:
            data, stat = self.client.get(paths.request_path(request_id))
            body = json.loads(data.decode("utf8"))
            if body.get("state") != "requested":
                return False
            body["relative_priority"] = relative_priority
            self.client.set(paths.request_path(request_id), json.dumps(body).encode("utf8"),
                            version=stat.version)
            return True
        finally:
            lock.release()

    # -- nodes --------------------------------------------------------------------------
    def get_node(self, node_id: str) -> dict[str, Any] | None:
        try:
            data, _ = self.client.get(paths.node_path(node_id))
        except NoNodeError:
            return None
        return json.loads(data.decode("utf8")) if data else None

    def accept(self, request_id: str, lock_timeout: float = 30.0) -> NodeSet:
        """The executor's acceptNodes: lock every node, check allocation, delete request."""
        request = self.get_request(request_id)
        if request is None or request.get("state") != "fulfilled":
            raise ZuulError(f"request {request_id} is not fulfilled: {request}")
        nodeset = NodeSet(request_id)
        try:
            for node_id in request.get("nodes", []):
                node = self.get_node(node_id)
                if node is None or node.get("allocated_to") != request_id:
                    raise ZuulError(f"node {node_id} not allocated to {request_id}: {node}")
                lock = Lock(self.client, paths.node_lock_path(node_id))
                try:
                    if not lock.acquire(timeout=lock_timeout):
                        raise ZuulError(f"could not lock node {node_id}")
                except LockTimeout as exc:
                    raise ZuulError(f"timed out locking node {node_id}") from exc
                node = self.get_node(node_id)
                if node is None or node.get("allocated_to") != request_id:
                    lock.release()
                    raise ZuulError(f"node {node_id} re-allocated while locking: {node}")
                nodeset.nodes.append(HeldNode(node_id, node, lock))
        except ZuulError:
            self.unlock(nodeset)
            raise
        finally:
            # Zuul deletes the request whether or not locking worked.
            self.cancel(request_id)
        return nodeset

    def _store(self, held: HeldNode) -> None:
        body = dict(held.data)
        body["id"] = held.id  # Zuul's toDict adds it
        self.client.set(paths.node_path(held.id), json.dumps(body).encode("utf8"))

    def use(self, nodeset: NodeSet, project: str = "example.com/org/project") -> None:
        for held in nodeset.nodes:
            held.data.update(state="in-use", state_time=time.time(),
                             user_data={"zuul_system": self.system_id,
                                        "project_name": project})
            self._store(held)

    def release(self, nodeset: NodeSet) -> None:
        """returnNodeSet: in-use nodes become `used`, then they are unlocked."""
        for held in nodeset.nodes:
            if held.data.get("state") == "in-use":
                held.data.update(state="used", state_time=time.time())
                self._store(held)
        self.unlock(nodeset)

    def hold(self, nodeset: NodeSet, hold_expiration: int | None = None,
             comment: str = "autohold") -> None:
        for held in nodeset.nodes:
            held.data.update(state="hold", state_time=time.time(), comment=comment,
                             hold_job="tenant-1 example.com/org/project job .*",
                             hold_expiration=hold_expiration)
            self._store(held)
        self.unlock(nodeset)

    @staticmethod
    def unlock(nodeset: NodeSet) -> None:
        for held in nodeset.nodes:
            try:
                held.lock.release()
            except Exception:
                pass

    def run_build(self, node_types: Iterable[str], timeout: float = 30.0,
                  **submit: Any) -> tuple[str, list[str]]:
        """Submit, wait, accept, use and release: one whole build. Returns (request, nodes)."""
        request_id = self.submit(node_types, **submit)
        body = self.wait(request_id, timeout)
        if body is None or body.get("state") != "fulfilled":
            raise ZuulError(f"request {request_id} not fulfilled: {body}")
        nodeset = self.accept(request_id)
        self.use(nodeset)
        self.release(nodeset)
        return request_id, [h.id for h in nodeset.nodes]
