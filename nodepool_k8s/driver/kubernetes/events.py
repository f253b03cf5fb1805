"""Kubernetes Events about a node's lifecycle, for `kubectl describe` / `kubectl get events`.

Owns: core/v1 Event bodies (source component `nodepool-launcher`, involved object the
node's namespace or pod, created in the node's namespace) and sending them best-effort:
`EventRecorder.emit` only queues (never blocks, never raises); one background thread sends,
each event once with a short timeout and no retries, at most `rate` per second (a token
bucket with burst `burst`); when the queue is full or the bucket empty the event is dropped
and counted. An Events failure never fails a launch. The RBAC this needs is `events:
create` (etc/kubernetes/launcher-rbac.yaml).

An event posted into a namespace that is then deleted (a failed attempt) is deleted with it;
the launcher's own event log in ZooKeeper (`nodepool events`) keeps the failure.
"""

from __future__ import annotations

import logging
import queue
import secrets
import socket
import threading
from datetime import datetime, timezone

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.driver.kubernetes.bodies import Event, ObjectReference
from nodepool_k8s.driver.kubernetes.client import KubeClient

log = logging.getLogger(__name__)

COMPONENT = "nodepool-launcher"
NORMAL = "Normal"
WARNING = "Warning"
QUEUE_SIZE = 256
SEND_TIMEOUT = 5.0
MESSAGE_LIMIT = 1024


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(namespace: str, reason: str, message: str, event_type: str, when: float,
               pod: str | None = None, node_id: str | None = None,
               host: str | None = None) -> Event:
    """A core/v1 Event about namespace `namespace` (or its pod `pod`), sent from `host`
    (default: this machine's hostname, looked up now)."""
    involved: ObjectReference = (
        {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": namespace} if pod
        else {"apiVersion": "v1", "kind": "Namespace", "name": namespace})
    stamp = _stamp(when)
    labels = {"nodepool-node-id": node_id} if node_id else {}
    host = host or socket.gethostname()
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{namespace}.{secrets.token_hex(8)}", "namespace": namespace,
                     "labels": labels},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": event_type,
        "source": {"component": COMPONENT, "host": host},
        "reportingComponent": COMPONENT,
        "reportingInstance": host,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class EventRecorder:
    """Best-effort, rate-limited sender of Events through one provider's client."""

    def __init__(self, client: KubeClient, clock: Clock = SYSTEM_CLOCK, rate: float = 20.0,
                 burst: int = 50) -> None:
        self._client = client
        self._clock = clock
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._refilled = clock.monotonic()
        self._queue: queue.Queue[Event | None] = queue.Queue(QUEUE_SIZE)
        self._lock = threading.Lock()
        self.sent = 0
        self.dropped = 0
        self.failed = 0
        self._thread = threading.Thread(target=self._run, name="k8s-events", daemon=True)
        # Looked up once, like the launcher's registration does: two system calls per event
        # otherwise, in the launch and deleter threads.
        self._host = socket.gethostname()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(SEND_TIMEOUT)

    def _take_token(self) -> bool:
        with self._lock:
            now = self._clock.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
            self._refilled = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True

    def emit(self, namespace: str, reason: str, message: str, warning: bool = False,
             pod: str | None = None, node_id: str | None = None, now: bool = False) -> None:
        """Queue one event; dropped (and counted) when over the rate or the queue is full.

        `now`: send it from the calling thread instead (once, short timeout, errors
        swallowed): a failed attempt's event must reach its namespace before the namespace
        is deleted."""
        if not self._take_token():
            with self._lock:
                self.dropped += 1
            return
        body = event_body(namespace, reason, message, WARNING if warning else NORMAL,
                          self._clock.time(), pod, node_id, self._host)
        if now:
            self._send(body)
            return
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            if body is None:
                return
            self._send(body)

    def _send(self, body: Event) -> None:
        """One try, never retried; failures are counted and logged at debug level."""
        namespace = body["metadata"]["namespace"]
        try:
            response = self._client.api.create_namespaced_event(
                namespace, body, _preload_content=False, _request_timeout=SEND_TIMEOUT)
            try:
                response.data  # read it all: the connection goes back to the pool
            finally:
                response.release_conn()
            with self._lock:
                self.sent += 1
        except Exception as exc:  # noqa: BLE001 - best effort by contract
            with self._lock:
                self.failed += 1
            log.debug("Event %s in %s not recorded: %s", body.get("reason"), namespace, exc)
