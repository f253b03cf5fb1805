"""`KubernetesProvider`: the Provider protocol over one cluster context.

Owns: the order of API calls for a launch (namespace, service account, token secret, role,
role binding, pod), the node data handed back to the core (exactly what Zuul's executor
reads), deletion with confirmation, and listing our namespaces for the leak sweeper. Waiting
is delegated to three shared watches (pods, secrets, namespaces) per provider, so a namespace
node costs five API calls to launch and a pod node six, and a deletion one (the DELETE; its
completion arrives through the shared namespace watch).

How it fails (see `driver.base` for the contract): every failed launch attempt first deletes
its namespace (best effort, confirmed within `cleanup_timeout` unless cancelled; whatever is
left carries our labels for the leak sweeper) and then raises LaunchError (with `reason`),
QuotaExceeded, or TemporaryError. `delete` raises TemporaryError until the namespace is
confirmed gone. `list_resources` raises TemporaryError when listing fails.
"""

from __future__ import annotations

import logging
import dataclasses
import secrets
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Sequence

from nodepool_k8s import logconfig
from nodepool_k8s.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import PoolLabel, ProviderConfig
from nodepool_k8s.driver.base import CloudResource, LaunchResult, LaunchSpec, Provider
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.client import KubeClient, Sleeper, connect
from nodepool_k8s.driver.kubernetes.errors import Conflict, Invalid
from nodepool_k8s.driver.kubernetes.readiness import PodCheck, Token, token_from_secret
from nodepool_k8s.driver.kubernetes.waiter import (ObjectWatch, deletion_finished, object_uid,
                                                   resource_version, wait_namespace_deleted,
                                                   wait_namespace_gone)
from nodepool_k8s.exceptions import (LaunchCancelled, LaunchError, NodepoolError, NotFound,
                                     PermanentError, TemporaryError)
from nodepool_k8s.model import Resources

log = logging.getLogger(__name__)


def _log(spec: LaunchSpec) -> logging.LoggerAdapter[logging.Logger]:
    """Lines about one launch carry `[e: ...] [node_request: ...] [node: ...]`."""
    return logconfig.annotate(log, spec.request.event_id, spec.request.id, spec.node_id)


LIST_PAGE_SIZE = 500
# Deleted namespaces the shared namespace watch remembers (so a deletion that completed
# before its waiter looked is still confirmed without an API call).
NAMESPACE_TOMBSTONES = 1024


@dataclass(frozen=True)
class KubernetesSettings:
    """Driver tunables. None = the provider config's value (`unschedulable-grace`,
    `delete-timeout`, whose defaults live in config/schema.py); the rest are not config keys."""

    # How long a pod may stay PodScheduled=False/Unschedulable before the attempt fails.
    unschedulable_grace: float | None = None
    # How long `delete` waits for the namespace to vanish before raising TemporaryError.
    delete_timeout: float | None = None
    # How long a failed attempt waits to confirm its namespace is gone (then: leak sweeper).
    cleanup_timeout: float = 30.0
    # Server-side duration of one watch request; it is resumed from its last version.
    watch_timeout: int = 300
    # urllib3 connections kept per API server; raised to max-concurrency + 8 if larger.
    connection_pool_maxsize: int = 128
    # None in production: waits wake on events, cancel and deadline, never on a tick. Tests
    # on a ManualClock set one (its time moves without waking anyone).
    wait_tick: float | None = None


class ConnectionData(dict):  # type: ignore[type-arg]
    """The `connection_port` dict; its repr hides the token so logging a result is safe."""

    def __repr__(self) -> str:
        shown = {k: ("<redacted>" if k == "token" else v) for k, v in self.items()}
        return repr(shown)

    __str__ = __repr__


def _parse_timestamp(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _plain_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


class KubernetesProvider:
    """Hands out namespaces (`namespace` labels) and pods (`pod` labels) in one context."""

    def __init__(self, config: ProviderConfig, clock: Clock = SYSTEM_CLOCK,
                 kubeconfig: str | None = None,
                 settings: KubernetesSettings | None = None) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock
        self._kubeconfig = kubeconfig
        settings = settings or KubernetesSettings()
        # Resolved once: explicit settings win over the provider config keys.
        self.settings = dataclasses.replace(
            settings,
            unschedulable_grace=float(config.unschedulable_grace
                                      if settings.unschedulable_grace is None
                                      else settings.unschedulable_grace),
            delete_timeout=float(config.delete_timeout if settings.delete_timeout is None
                                 else settings.delete_timeout))
        self._lock = threading.Lock()
        self._client: KubeClient | None = None
        self._pods: ObjectWatch | None = None
        self._secrets: ObjectWatch | None = None
        self._namespaces: ObjectWatch | None = None

    @property
    def unschedulable_grace(self) -> float:
        return float(self.settings.unschedulable_grace or 0.0)

    @property
    def delete_timeout(self) -> float:
        return float(self.settings.delete_timeout or 0.0)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._client is not None:
                return
            pool_size = max(self.settings.connection_pool_maxsize,
                            self.config.max_concurrency + 8)
            client = connect(self.config, self._kubeconfig, pool_size)
            selector = manifests.provider_selector(self.name)
            watches = {
                kind: ObjectWatch(kind, client, list_fn, selector, self._clock,
                                  watch_timeout=self.settings.watch_timeout,
                                  tick=self.settings.wait_tick)
                for kind, list_fn in (("pods", client.core.list_pod_for_all_namespaces),
                                      ("secrets", client.core.list_secret_for_all_namespaces))
            }
            # Namespaces: confirms deletions (one stream per provider, not one per delete).
            watches["namespaces"] = ObjectWatch(
                "namespaces", client, client.core.list_namespace, selector, self._clock,
                watch_timeout=self.settings.watch_timeout, tick=self.settings.wait_tick,
                tombstones=NAMESPACE_TOMBSTONES, owned=self._owns)
            for watch in watches.values():
                watch.start()
            self._client, self._pods, self._secrets = client, watches["pods"], watches["secrets"]
            self._namespaces = watches["namespaces"]
            log.info("Provider %s connected to %s (context %s)", self.name, client.host,
                     client.context)

    def stop(self) -> None:
        with self._lock:
            client, watches = self._client, (self._pods, self._secrets, self._namespaces)
            self._client = self._pods = self._secrets = self._namespaces = None
        for watch in watches:
            if watch is not None:
                watch.stop()
        if client is not None:
            client.close()

    def watches_synced(self) -> bool:
        """True once the shared pod, secret and namespace watches have listed once."""
        with self._lock:
            watches = (self._pods, self._secrets, self._namespaces)
        return all(w is not None and w.synced for w in watches)

    def _connected(self) -> tuple[KubeClient, ObjectWatch, ObjectWatch]:
        with self._lock:
            if self._client is None or self._pods is None or self._secrets is None:
                raise TemporaryError(f"provider {self.name} is not started")
            return self._client, self._pods, self._secrets

    def _namespace_watch(self) -> ObjectWatch:
        with self._lock:
            if self._namespaces is None:
                raise TemporaryError(f"provider {self.name} is not started")
            return self._namespaces

    def _owns(self, obj: dict[str, Any]) -> bool:
        """Whether a namespace carries this provider's ownership label."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return labels.get(manifests.PROVIDER_LABEL) == manifests.label_value(self.name)

    def _wait_gone(self, client: KubeClient, namespace: str,
                   response: dict[str, Any] | None, deadline: float) -> None:
        """Confirm `namespace` is gone after a DELETE (`response`; None after a 409)."""
        if response is not None and not self._owns(response):
            # Not ours by label (a name collision): the shared watch never reports it.
            wait_namespace_gone(client, namespace, resource_version(response), deadline,
                                self._clock)
            return
        uid = object_uid(response) if response is not None else None
        wait_namespace_deleted(self._namespace_watch(), client, namespace, uid, deadline,
                               self._clock)

    # -- launch ------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, cancel: threading.Event,
               progress: Callable[[str], None] | None = None) -> LaunchResult:
        client, pods, secret_watch = self._connected()
        label = spec.label
        _validate(label)
        if cancel.is_set():
            raise LaunchCancelled("cancelled before start")
        deadline = self._clock.monotonic() + label.boot_timeout
        labels = manifests.object_labels(spec)
        try:
            namespace = self._create_namespace(client, spec, labels, cancel.wait)
        except NodepoolError as exc:
            failure = _as_launch_failure(exc, cancel)
            if failure is None or failure is exc:
                raise
            raise failure from exc
        _log(spec).info("Created namespace %s (attempt %d)", namespace, spec.attempt)
        try:
            if progress is not None:
                progress(namespace)
            self._create_contents(client, namespace, label, labels, cancel.wait)
            token: Token = secret_watch.wait(
                namespace, manifests.TOKEN_SECRET, token_from_secret, deadline, cancel,
                what=f"the token of namespace {namespace}")
            pod = None
            if label.type == "pod":
                name = manifests.pod_name(label)
                check = PodCheck(f"{namespace}/{name}", self._clock,
                                 self.unschedulable_grace)
                pod = pods.wait(namespace, name, check, deadline, cancel,
                                what=f"pod {namespace}/{name} to run",
                                recheck_in=check.recheck_in)
        except BaseException as exc:
            failure = _as_launch_failure(exc, cancel)
            _log(spec).warning("Attempt %d in namespace %s failed: %s", spec.attempt,
                               namespace, exc)
            self._discard(client, namespace, cancelled=cancel.is_set())
            if failure is exc or failure is None:
                raise
            raise failure from exc
        _log(spec).info("Namespace %s ready", namespace)
        return self._result(client, namespace, label, token, pod)

    def _create_namespace(self, client: KubeClient, spec: LaunchSpec,
                          labels: dict[str, str], sleep: Sleeper) -> str:
        """Create a namespace with a name no earlier attempt used; returns the name."""
        for suffix in ("", "r" + secrets.token_hex(3)):
            name = manifests.namespace_name(spec.pool.name, spec.node_id, spec.attempt, suffix)
            try:
                client.call(f"create namespace {name}", client.core.create_namespace,
                            manifests.namespace_body(name, labels), sleep=sleep,
                            created_ok=True)
                return name
            except Conflict:
                # Not ours to delete: perhaps an earlier attempt still Terminating.
                _log(spec).warning("Namespace %s exists already; using a fresh name", name)
            except NodepoolError as exc:
                if isinstance(exc, TemporaryError):
                    # The create may have reached the server before the answer was lost
                    # (a timeout): remove that name too, without waiting.
                    self._discard(client, name, cancelled=True)
                raise
        raise LaunchError(f"no free namespace name for node {spec.node_id}",
                          reason="NamespaceExists")

    def _create_contents(self, client: KubeClient, namespace: str, label: PoolLabel,
                         labels: dict[str, str], sleep: Sleeper) -> None:
        core, rbac = client.core, client.rbac
        steps: list[tuple[str, Callable[..., Any], dict[str, Any]]] = [
            ("serviceaccount", core.create_namespaced_service_account,
             manifests.service_account_body(namespace, labels)),
            ("secret", core.create_namespaced_secret,
             manifests.token_secret_body(namespace, labels)),
            ("role", rbac.create_namespaced_role,
             manifests.role_body(namespace, label, labels)),
            ("rolebinding", rbac.create_namespaced_role_binding,
             manifests.role_binding_body(namespace, label, labels)),
        ]
        if label.type == "pod":
            steps.append(("pod", core.create_namespaced_pod,
                          manifests.pod_body(namespace, label, labels)))
        for kind, create, body in steps:
            client.call(f"create {kind} {namespace}/{body['metadata']['name']}", create,
                        namespace, body, sleep=sleep, created_ok=True)

    def _result(self, client: KubeClient, namespace: str, label: PoolLabel, token: Token,
                pod: dict[str, Any] | None) -> LaunchResult:
        skiptls = not client.verify_ssl
        port = ConnectionData({
            "name": namespace,
            "namespace": namespace,
            "host": client.host,
            "skiptls": skiptls,
            "token": token.token,
            "user": manifests.SERVICE_ACCOUNT,
        })
        if not skiptls:
            port["ca_crt"] = token.ca_crt
        pod_name = None
        host_id = None
        if pod is not None:
            pod_name = str((pod.get("metadata") or {}).get("name") or manifests.pod_name(label))
            port["pod"] = pod_name
            host_id = (pod.get("spec") or {}).get("nodeName")
        return LaunchResult(
            external_id=namespace,
            connection_type="kubectl" if pod is not None else "namespace",
            connection_port=port,
            interface_ip=pod_name,
            host_id=host_id,
            cloud=client.context,
            python_path=label.python_path,
            shell_type=label.shell_type,
            resources={k: _plain_number(v) for k, v in label.quota().items()},
        )

    def _discard(self, client: KubeClient, namespace: str, cancelled: bool) -> None:
        """Remove a failed attempt's namespace; never raises (the sweeper is the backstop)."""
        try:
            response = client.call(f"delete namespace {namespace}",
                                   client.core.delete_namespace, namespace,
                                   propagation_policy="Background")
            if cancelled or deletion_finished(response):
                return
            self._wait_gone(client, namespace, response,
                            self._clock.monotonic() + self.settings.cleanup_timeout)
        except NotFound:
            return
        except Exception as exc:  # noqa: BLE001 - best effort by contract
            log.warning("Namespace %s of a failed attempt may remain (labelled for the leak "
                        "sweeper): %s", namespace, exc)

    # -- delete and list ---------------------------------------------------------------------

    def delete(self, external_id: str) -> None:
        client, _, _ = self._connected()
        deadline = self._clock.monotonic() + self.delete_timeout
        try:
            response: dict[str, Any] | None
            try:
                response = client.call(f"delete namespace {external_id}",
                                       client.core.delete_namespace, external_id,
                                       propagation_policy="Background")
                if deletion_finished(response):
                    return
            except NotFound:
                return
            except Conflict:
                response = None  # already Terminating: just confirm it goes
            self._wait_gone(client, external_id, response, deadline)
        except PermanentError as exc:
            # Never swallowed (Nodepool logged and forgot): the core keeps the node and retries.
            raise TemporaryError(f"cannot delete namespace {external_id}: {exc}") from exc
        log.info("Namespace %s deleted", external_id)

    def list_resources(self) -> Sequence[CloudResource]:
        client, _, _ = self._connected()
        owner = manifests.label_value(self.name)
        found: list[CloudResource] = []
        token: str | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
                if token:
                    kwargs["_continue"] = token
                body = client.call("list namespaces", client.core.list_namespace,
                                   label_selector=manifests.provider_selector(self.name),
                                   **kwargs)
                for item in body.get("items") or []:
                    resource = self._as_resource(item, owner)
                    if resource is not None:
                        found.append(resource)
                token = (body.get("metadata") or {}).get("continue")
                if not token:
                    return found
        except TemporaryError:
            raise
        except NodepoolError as exc:
            raise TemporaryError(f"cannot list namespaces of {self.name}: {exc}") from exc

    def _as_resource(self, item: dict[str, Any], owner: str) -> CloudResource | None:
        meta = item.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        if labels.get(manifests.PROVIDER_LABEL) != owner:
            return None
        name = str(meta.get("name") or "")
        node_id = labels.get(manifests.NODE_ID_LABEL)
        if not node_id:
            parsed = manifests.parse_namespace_name(name)
            node_id = parsed[1] if parsed else None
        phase = (item.get("status") or {}).get("phase")
        return CloudResource(
            external_id=name, node_id=node_id, provider=self.name,
            created=_parse_timestamp(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")) or phase == "Terminating",
            metadata=labels)

    # -- quota -------------------------------------------------------------------------------

    def quota_for_label(self, label: PoolLabel) -> Resources:
        return label.quota()

    def cloud_limits(self) -> Resources:
        # Unknown = unlimited. Future: sum a configured namespace's ResourceQuota or the
        # nodes' allocatable capacity.
        return Resources.limits()


def _validate(label: PoolLabel) -> None:
    if label.type not in ("namespace", "pod"):
        raise LaunchError(f"label {label.name}: unknown type {label.type!r}",
                          reason="InvalidLabel", retryable=False)
    if label.type == "pod" and label.spec is None and not label.image:
        raise LaunchError(f"label {label.name}: a pod label needs `image` or `spec`",
                          reason="InvalidLabel", retryable=False)


def _as_launch_failure(exc: BaseException, cancel: threading.Event) -> BaseException | None:
    """What a failed attempt raises for `exc` (None: re-raise `exc` itself)."""
    if cancel.is_set() and isinstance(exc, NodepoolError) \
            and not isinstance(exc, LaunchCancelled):
        # An API error met while giving up is not the story: the core cancelled us.
        return LaunchCancelled(f"cancelled ({exc})")
    if isinstance(exc, (LaunchError, TemporaryError)):
        return exc  # includes QuotaExceeded
    if isinstance(exc, Invalid):
        return LaunchError(str(exc), reason="Invalid", retryable=False)
    if isinstance(exc, (NotFound, Conflict)):
        # Someone removed or raced our objects mid-launch: a fresh attempt can succeed.
        return LaunchError(str(exc), reason=type(exc).__name__)
    if isinstance(exc, PermanentError):
        # Forbidden/Unauthorized and the like: an operator must act first.
        return LaunchError(str(exc), reason=type(exc).__name__, retryable=False)
    return None


if TYPE_CHECKING:
    # mypy proves the class satisfies the Provider protocol the core programs against.
    _CONFORMS: type[Provider] = KubernetesProvider
