"""Component registration: who is launching, and which pools are online.

Owns: this process's ephemeral sequential znodes under `/nodepool/components/launcher` and
`/nodepool/components/pool` (JSON with sorted keys, `model_api` 0), their in-place updates
with a versioned set when labels, priority, paused or state change, and re-creating them
after the session was lost (ephemerals vanish with the session). Other launchers read the
pool entries to decide "every pool declined", provider preference and priority; Zuul reads
`id` and `supported_labels`.

Failure modes: writes raise `ZkConnectionError`/`ZkSessionLost` while ZooKeeper is away;
`reregister_all` (called on reconnect after LOST, and when another client deleted one of
ours, see `owns`) restores every registration whose znode is gone.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from nodepool_k8s import __version__
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient

log = logging.getLogger("nodepool_k8s.zk.registry")

MODEL_API = 0


def pool_worker_id(provider: str, pool: str, fqdn: str | None = None) -> str:
    """`<fqdn>-PoolWorker.<provider>-<pool>-<uuid4hex>`, new for every worker start."""
    return f"{fqdn or socket.getfqdn()}-PoolWorker.{provider}-{pool}-{uuid.uuid4().hex}"


def encode(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True).encode("utf8")


@dataclass
class Registration:
    kind: str
    data: dict[str, Any]
    path: str | None = None
    version: int = -1
    # The session epoch `path` was created in (see `forget_paths`).
    epoch: int = -1
    active: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)


class ComponentRegistry:
    def __init__(self, zk: ZkClient, hostname: str | None = None) -> None:
        self.zk = zk
        self.hostname = hostname or socket.gethostname()
        self._registrations: list[Registration] = []
        self._lock = threading.Lock()

    def _base(self, kind: str, state: str) -> dict[str, Any]:
        return {"hostname": self.hostname, "kind": kind, "model_api": MODEL_API,
                "state": state, "version": __version__}

    def register_launcher(self, state: str = "initializing") -> Registration:
        return self._register(Registration("launcher", self._base("launcher", state)))

    def register_pool(self, pool_id: str, provider: str, pool: str, labels: list[str],
                      priority: int, state: str = "running") -> Registration:
        data = self._base("pool", state)
        data.update(id=pool_id, name=pool, provider_name=provider,
                    supported_labels=sorted(labels), priority=priority, paused=False)
        return self._register(Registration("pool", data))

    def _register(self, reg: Registration) -> Registration:
        with self._lock:
            self._registrations.append(reg)
        with reg.lock:
            self._create(reg)
        return reg

    def _create(self, reg: Registration) -> None:
        created = self.zk.create(paths.component_prefix(reg.kind, self.hostname),
                                 encode(reg.data), ephemeral=True, sequence=True,
                                 makepath=True)
        # Read after the create: one sent after a session loss runs in the new session.
        reg.path, reg.version, reg.epoch = created, 0, self.zk.epoch
        log.debug("Registered %s component at %s", reg.kind, created)

    def update(self, reg: Registration, **changes: Any) -> None:
        """Apply `changes` (only if something differs) with a versioned set."""
        with reg.lock:
            if not reg.active or all(reg.data.get(k) == v for k, v in changes.items()):
                return
            reg.data.update(changes)
            if reg.path is None:
                return  # not registered (session away); reregister_all writes the data
            try:
                reg.version = self.zk.set(reg.path, encode(reg.data), reg.version).version
            except errors.NoNodeError:
                self._create(reg)
            except errors.VersionConflict:
                found = self.zk.get(reg.path)
                if found is None:
                    self._create(reg)
                else:
                    reg.version = self.zk.set(reg.path, encode(reg.data),
                                              found[1].version).version

    def unregister(self, reg: Registration) -> None:
        with reg.lock:
            reg.active = False
            path, reg.path = reg.path, None
        with self._lock:
            if reg in self._registrations:
                self._registrations.remove(reg)
        if path is not None:
            try:
                self.zk.delete(path)
            except (errors.NoNodeError, errors.ZkConnectionError, errors.ZkSessionLost):
                pass

    def owns(self, key: str) -> bool:
        """Whether `key` (`<kind>/<name>`, as the component cache names a component) is
        the znode of one of our live registrations."""
        path = f"{paths.COMPONENTS}/{key}"
        with self._lock:
            return any(reg.active and reg.path == path for reg in self._registrations)

    def pool_ids(self) -> frozenset[str]:
        """The `id` of each of our live pool registrations (what our nodes name as their
        `launcher`)."""
        with self._lock:
            regs = list(self._registrations)
        return frozenset(reg.data["id"] for reg in regs
                         if reg.active and reg.kind == "pool" and reg.data.get("id"))

    def forget_paths(self) -> None:
        """Session lost: our ephemerals are gone; remember that before re-registering.

        The loss reaches us after the connection moved on to the new session, where an
        `update` may already have re-created a registration: that znode is kept
        (forgotten, `reregister_all` would create a second one beside it)."""
        with self._lock:
            regs = list(self._registrations)
        for reg in regs:
            with reg.lock:
                if reg.epoch != self.zk.epoch:
                    reg.path = None

    def reregister_all(self) -> None:
        """Create a fresh znode for every registration whose znode is gone."""
        with self._lock:
            regs = list(self._registrations)
        for reg in regs:
            with reg.lock:
                if not reg.active:
                    continue
                if reg.path is not None and self.zk.exists(reg.path) is not None:
                    continue
                self._create(reg)
        log.info("Re-registered %d components", len(regs))

    def unregister_all(self) -> None:
        with self._lock:
            regs = list(self._registrations)
        for reg in regs:
            self.unregister(reg)
