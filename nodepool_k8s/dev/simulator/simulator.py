"""`Simulator`: one simulated Kubernetes API server with its controllers, as a Python object.

Owns: wiring the parts together (store, token authority, fault injector, controllers on a
scheduler thread, HTTP(S) server), seeding what a fresh cluster has (the system namespaces and
the configured nodes), writing kubeconfigs, and the inspection/fault API that tests,
the demo and benchmarks use. `start()` raises `TlsError` if openssl fails and `OSError` if the
port cannot be bound; `stop()` is idempotent and never raises.
"""

from __future__ import annotations

import base64
import builtins
import logging
import os
import shutil
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import yaml

from nodepool_k8s.dev.simulator import patch as patching
from nodepool_k8s.dev.simulator import validation
from nodepool_k8s.dev.simulator.api import Api, Counters, system_namespace_objects
from nodepool_k8s.dev.simulator.auth import TokenAuthority
from nodepool_k8s.dev.simulator.config import SimulatorConfig
from nodepool_k8s.dev.simulator.controllers import Controllers, node_object
from nodepool_k8s.dev.simulator.data import clone
from nodepool_k8s.dev.simulator.faults import FaultInjector, Faults
from nodepool_k8s.dev.simulator.resources import STORED, by_plural
from nodepool_k8s.dev.simulator.selectors import label_matcher
from nodepool_k8s.dev.simulator.server import ApiServer
from nodepool_k8s.dev.simulator.store import Store
from nodepool_k8s.dev.simulator.timers import Scheduler
from nodepool_k8s.dev.simulator.tls import (
    TlsMaterial, load_tls_material, make_tls_material, server_context)

log = logging.getLogger(__name__)


def _kind(kind: str) -> str:
    if kind not in STORED:
        raise KeyError(f"unknown kind {kind!r}; use one of: {', '.join(STORED)}")
    return kind


class Simulator:
    """A simulated API server. Use `start()`/`stop()` or `with Simulator(...) as sim:`."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self.store = Store(self.config.watch_history)
        self.authority = TokenAuthority(self.store, self.config.admin_token)
        self._faults = FaultInjector(self.config.faults)
        # (listener, whether it hears of API calls); replaced, never changed in place, so
        # the threads that tell them iterate without a lock.
        self._listeners: tuple[tuple[Callable[[str], None], bool], ...] = ()
        self._listeners_lock = threading.Lock()
        self._counters = Counters(on_add=lambda _key: self._tell("call"))
        self.store.subscribe(lambda _event: self._tell("object"))
        self.store.subscribe_watchers(lambda _count: self._tell("watch"))
        self._stop_event = threading.Event()
        self._scheduler = Scheduler()
        self._workdir: str | None = None
        self._tls: TlsMaterial | None = None
        self._server: ApiServer | None = None
        self._api: Api | None = None
        self._ssl_context: ssl.SSLContext | None = None
        self._serving_lock = threading.Lock()  # stop_serving / resume_serving / rotate_ca
        self._rotations = 0
        self._controllers: Controllers | None = None
        self._started = False
        self._stopped = False
        # Path of the last kubeconfig written by write_kubeconfig (the test fixture writes one).
        self.kubeconfig_path: str | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> "Simulator":
        if self._started:
            return self
        self._started = True
        try:
            self._workdir = tempfile.mkdtemp(prefix="nodepool-k8s-sim-")
            ssl_context = None
            if self.config.tls:
                if self.config.tls_material_dir is not None:
                    self._tls = load_tls_material(self.config.tls_material_dir)
                else:
                    self._tls = make_tls_material(os.path.join(self._workdir, "tls"),
                                                  (self.config.host,))
                ssl_context = server_context(self._tls)
            self._controllers = Controllers(self.store, self._scheduler, self._faults,
                                            self.authority, self.config, self.ca_pem)
            self._controllers.start()
            self._scheduler.start()
            self._seed()
            api = Api(self.store, self.authority, self._faults, self.config, self._counters,
                      self._stop_event, self._server_address)
            self._api, self._ssl_context = api, ssl_context
            self._server = ApiServer(api, self.config.host, self.config.port,
                                     ssl_context).start()
        except BaseException:
            self.stop()
            raise
        log.info("Kubernetes API simulator listening on %s", self.url)
        return self

    def _seed(self) -> None:
        namespaces = by_plural("namespaces")
        for obj in system_namespace_objects():
            validation.apply_defaults(namespaces, obj)
            obj["status"] = {"phase": "Active"}
            self.store.create(namespaces, obj)
        major, minor, patch = self.config.server_version
        for index, (name, labels) in enumerate(self.config.node_labels.items()):
            self.store.create(by_plural("nodes"),
                              node_object(name, labels, index, f"v{major}.{minor}.{patch}",
                                          self.config.node_taints.get(name),
                                          self.config.node_allocatable.get(name)))

    def stop(self) -> None:
        """Close watches and connections, stop controllers, remove temporary files."""
        if self._stopped:
            return
        self._stopped = True
        self._stop_event.set()
        self.store.close_watchers()
        if self._server is not None:
            try:
                self._server.stop()
            except Exception:
                log.exception("stopping the simulator's server failed")
        self._scheduler.stop()
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> "Simulator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the API server going away and coming back -------------------------------------------
    def stop_serving(self) -> None:
        """The API server goes away (it crashed, or the network between is cut): the
        listening socket closes, every open connection and watch is cut, and connecting
        is refused until `resume_serving`. The cluster's objects and controllers stay."""
        with self._serving_lock:
            server = self._require_server()
            if server.stopped:
                return
            self.store.close_watchers()
            server.stop()

    def resume_serving(self) -> None:
        """Serve again on the same address (with the current certificate)."""
        with self._serving_lock:
            server = self._require_server()
            if not server.stopped:
                return
            assert self._api is not None
            self._server = ApiServer(self._api, server.host, server.port,
                                     self._ssl_context).start()

    def freeze(self) -> None:
        """The API server stops answering without going away (overloaded, or a partition
        that drops the answers): connections are accepted, TLS handshakes complete, and
        no request gets an answer or is applied until `thaw`. Open watches are cut (their
        clients open them again, and those hang too). The controllers go on. A restart of
        the server (`resume_serving`, `rotate_ca`) serves unfrozen."""
        with self._serving_lock:
            server = self._require_server()
            server.freeze()
            self.store.close_watchers()

    def thaw(self) -> None:
        """Answer again; the requests held while frozen are dropped unanswered."""
        with self._serving_lock:
            self._require_server().thaw()

    @property
    def frozen(self) -> bool:
        return self._require_server().frozen

    def rotate_ca(self) -> str:
        """Replace the cluster's CA and the server certificate (a CA rotation): the API
        server restarts with them, so every open connection is cut and new ones see the new
        certificate; clients trusting only the old CA fail verification. Kubeconfigs already
        written keep the old CA until written again (`write_kubeconfig`). Returns the new CA
        (PEM). The session's shared material is never touched: the new one is made in this
        simulator's own directory."""
        if not self.config.tls or self._workdir is None:
            raise RuntimeError("the simulator serves no TLS")
        self._rotations += 1
        material = make_tls_material(
            os.path.join(self._workdir, f"tls-rotated-{self._rotations}"), (self.config.host,))
        with self._serving_lock:
            server = self._require_server()
            self._tls, self._ssl_context = material, server_context(material)
            if self._controllers is not None:
                self._controllers.ca_pem = material.ca_pem
            if server.stopped:
                return material.ca_pem
            self.store.close_watchers()
            server.stop()
            assert self._api is not None
            self._server = ApiServer(self._api, server.host, server.port,
                                     self._ssl_context).start()
        log.info("Kubernetes API simulator now serves a certificate of a new CA")
        return material.ca_pem

    # -- connection details -----------------------------------------------------------------
    def _require_server(self) -> ApiServer:
        if self._server is None:
            raise RuntimeError("the simulator is not started")
        return self._server

    def _server_address(self) -> str:
        server = self._require_server()
        return f"{server.host}:{server.port}"

    @property
    def url(self) -> str:
        return self._require_server().url

    @property
    def port(self) -> int:
        return self._require_server().port

    @property
    def ca_pem(self) -> str | None:
        return self._tls.ca_pem if self._tls else None

    @property
    def admin_token(self) -> str:
        return self.authority.admin_token

    def kubeconfig(self, context: str = "sim", namespace: str | None = None,
                   token: str | None = None,
                   user: dict[str, Any] | None = None) -> dict[str, Any]:
        """A kubeconfig document (dict) for the admin, or for `token` if given, or with
        `user` as its user entry (e.g. an `exec` plugin) if given."""
        cluster: dict[str, Any] = {"server": self.url}
        if self.ca_pem:
            cluster["certificate-authority-data"] = base64.b64encode(
                self.ca_pem.encode()).decode()
        ctx: dict[str, Any] = {"cluster": context, "user": f"{context}-admin"}
        if namespace:
            ctx["namespace"] = namespace
        return {
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": context, "cluster": cluster}],
            "users": [{"name": f"{context}-admin",
                       "user": user or {"token": token or self.admin_token}}],
            "contexts": [{"name": context, "context": ctx}],
            "current-context": context,
        }

    def write_kubeconfig(self, path: str | os.PathLike[str], context: str = "sim",
                         namespace: str | None = None, token: str | None = None,
                         user: dict[str, Any] | None = None) -> str:
        """Write a kubeconfig (mode 0600, atomically) and return its path.

        It authenticates as the admin, or with `token` (e.g. a service account's) if given,
        or as `user` says (a kubeconfig user entry: `exec`, `tokenFile`, ...) if given.
        """
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(self.kubeconfig(context, namespace, token, user), f,
                           default_flow_style=False)
        os.replace(tmp, target)
        if token is None and user is None:
            self.kubeconfig_path = str(target)
        return str(target)

    # -- the admin's credentials -------------------------------------------------------------
    def rotate_admin_token(self, token: str | None = None) -> str:
        """Replace the admin token at runtime (`token`, or a fresh random one) and return
        it: the old one is refused (401) from now on. Kubeconfigs already written keep the
        old token until written again."""
        return self.authority.rotate_admin_token(token)

    def issue_admin_token(self, lifetime: float | None = None) -> str:
        """Another admin token, valid for `lifetime` seconds on the token clock
        (`authority.now`; None: until revoked): what an exec credential plugin hands out."""
        return self.authority.issue_admin_token(lifetime)

    def revoke_token(self, token: str) -> None:
        """Refuse a token from `issue_admin_token` before its expiry."""
        self.authority.revoke(token)

    @property
    def rejected_requests(self) -> int:
        """Requests refused with 401 (no valid credential) since the start."""
        return self.authority.rejected

    @property
    def rejected_log(self) -> list[tuple[str, str]]:
        """The latest requests refused with 401, as (method, path), oldest first."""
        return self.authority.rejected_since_start()

    def end_watches(self) -> None:
        """End every open watch stream (as a restarting API server or a load balancer
        does): clients must watch again, with whatever credentials they hold now."""
        self.store.close_watchers()

    # -- faults -----------------------------------------------------------------------------
    @property
    def faults(self) -> Faults:
        return self._faults.faults

    def set_faults(self, **changes: Any) -> Faults:
        """Change fault settings at runtime (see `Faults`); returns the new settings.

        Work a fault was holding back (unschedulable pods, image pulls, hung namespace
        deletions) is retried right away, so turning a fault off lets things proceed.
        """
        faults = self._faults.set(**changes)
        if self._controllers is not None:
            self._scheduler.call_later(0, self._controllers.reconsider)
        return faults

    def fail_next(self, verb: str, resource: str, count: int = 1, code: int = 500) -> None:
        """Answer the next `count` (verb, resource) API calls with HTTP `code`."""
        self._faults.fail_next(verb, resource, count, code)

    def stall_next(self, verb: str, resource: str, count: int = 1,
                   seconds: float = 30.0) -> None:
        """Apply the next `count` (verb, resource) calls but answer `seconds` late (a lost
        reply: the client times out although the write happened)."""
        self._faults.stall_next(verb, resource, count, seconds)

    def rewrite_next(self, verb: str, resource: str, rewrite: Callable[[Any], Any],
                     count: int = 1) -> None:
        """Apply the next `count` (verb, resource) calls but answer with `rewrite(body)`
        (its decoded JSON body, a copy): valid HTTP whose content has an odd shape."""
        self._faults.rewrite_next(verb, resource, rewrite, count)

    def clear_faults(self) -> None:
        self._faults.clear()
        if self._controllers is not None:
            self._scheduler.call_later(0, self._controllers.reconsider)

    # -- inspection (deep copies; no API call, no counting, no faults) ----------------------
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        obj = self.store.get(_kind(kind), namespace, name)
        return clone(obj) if obj is not None else None

    def list(self, kind: str, namespace: str | None = None,
             label_selector: str | None = None) -> list[dict[str, Any]]:
        items, _ = self.store.list(_kind(kind), namespace, label_matcher(label_selector))
        return clone(items)

    def patch(self, kind: str, name: str, changes: dict[str, Any],
              namespace: str | None = None) -> dict[str, Any] | None:
        """JSON-merge-patch an object directly, status included (e.g. make a pod Failed).

        Watches see the change like any other. Returns the new object, None if missing.
        """
        resource = by_plural(_kind(kind))

        def apply(draft: dict[str, Any]) -> None:
            merged = patching.merge_patch(draft, changes)
            draft.clear()
            draft.update(merged)
        obj = self.store.mutate(resource, namespace, name, apply)
        return clone(obj) if obj is not None else None

    def compact(self) -> int:
        """Drop the watch history: resuming from any older resourceVersion now gets 410."""
        return self.store.compact()

    @property
    def resource_version(self) -> int:
        return self.store.current_rv

    @property
    def counters(self) -> dict[str, int]:
        return self._counters.snapshot()

    def reset_counters(self) -> None:
        self._counters.reset()

    @property
    def open_watches(self) -> int:
        return self.store.watcher_count()

    def connections_nodelay(self) -> "builtins.list[bool]":
        """Whether Nagle is off on each open client connection (it must be, see server.py)."""
        return self._server.nodelay_flags() if self._server is not None else []

    # -- change notification (event-driven waits in tests) ----------------------------------
    def add_listener(self, listener: Callable[[str], None], calls: bool = False) -> None:
        """Call `listener(what)` after every change a test may wait for: an object stored,
        changed or deleted by anyone (`"object"`: the API, a controller, `patch`), a watch
        opened or ended (`"watch"`), and with `calls` every API call counted in `counters`
        (`"call"`; leave it off when the waiter's own check calls the API, or each check
        would wake the next). Called on the thread that made the change, some with the
        store's lock held: it must only hand on (set an event), never block or call back
        into the simulator."""
        with self._listeners_lock:
            self._listeners = self._listeners + ((listener, calls),)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        with self._listeners_lock:
            self._listeners = tuple(entry for entry in self._listeners
                                    if entry[0] != listener)

    def _tell(self, what: str) -> None:
        for listener, calls in self._listeners:
            if calls or what != "call":
                try:
                    listener(what)
                except Exception:  # a test's listener must not break the server
                    log.exception("simulator change listener failed")

    def idle(self) -> bool:
        """True when no controller step is due right now (delays still pending count idle)."""
        return self._scheduler.idle()
