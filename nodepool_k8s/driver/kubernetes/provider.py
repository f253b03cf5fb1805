"""`KubernetesProvider`: the Provider protocol over one cluster context.

Owns: the order of API calls for a launch (namespace, its fences from `guards` — quota,
limit range, network policy — service account, role, role binding, a TokenRequest for the
service account, pod), the node data handed back to the core (exactly what Zuul's executor
reads), deletion with an ownership proof and confirmation, and listing our namespaces for
the leak sweeper. Waiting is delegated to two shared watches (pods, namespaces) per
provider, both selected by our provider AND installation labels, so a namespace node with a
quota costs seven API calls to launch and a pod node eight (the same with `job-role:
cluster-role`, whose cleanup RoleBinding replaces the Role, plus one SelfSubjectReview per
provider; one more with a network policy; two more per `image-pull-secrets` entry, a GET
of the operator's Secret and the create of its copy, between the bindings and the pod),
and a deletion two (a GET that proves the namespace ours, then the DELETE with
`preconditions.uid`; its completion arrives through the shared namespace watch; with
`job-role: cluster-role` one PATCH more, removing our hold).
No Secret is created for the token (a bound, expiring TokenRequest token,
`token-lifetime`) and none is watched; the only Secrets created are the copies of the pull
Secrets a pod label names (`pull_secrets`), gone with the namespace.

Namespaces that stay Terminating: a job may leave objects with finalizers nobody removes,
or pods with a huge grace period. A namespace of ours Terminating past `terminating-grace`
is reported stuck once (`Underway.stuck`, for the node's condition, event and
metric), then cleared on the next look (`clearing`: its pods deleted with at most
`max-pod-grace`, the finalizers of its deleting objects of the job's kinds removed), after a
GET proved it ours again; only objects in that namespace are touched. With `job-role:
cluster-role` the launcher's rights for that come from a RoleBinding it made in the
namespace at launch (to the shipped ClusterRole `nodepool-launcher-cleanup`), held there by
our finalizer: removed as soon as that binding is all that is left (the namespace watch's
copy says so and wakes the parked deletion), or last in a clear-up.

What the watches keep: only what this provider created (`_created_namespace`,
`_created_pod`, over `manifests.created_namespace_problem` / `created_pod_problem`), as slim
copies. A job may create pods with our labels in its namespace; they are dropped where they
arrive and capacity never counts them as ours.

Ownership: no DELETE is ever sent for a namespace that a GET did not just show to carry our
provider label, our installation label and (for a node's namespace) the node's id label, and
the DELETE names the uid that GET saw, so an object replaced in between is not deleted (409).

How it fails (see `driver.base` for the contract): every failed launch attempt first deletes
its namespace (best effort, ownership-checked, confirmed within `cleanup_timeout` unless
cancelled; whatever is left carries our labels for the leak sweeper) and then raises
LaunchError (with `reason`), QuotaExceeded, or TemporaryError. Refused credentials (401,
still refused after loading them again, see `credentials`) raise `errors.Unauthorized`, a
ProviderUnavailable: the provider's trouble, not the label's; `credentials_condition` shows
it, `api_health` too (and an unreachable server, or a certificate that does not verify),
and `reload_credentials` reads them again when the operator reloads the configuration.
`delete` is one reconcile step (`Gone`, or `Underway` with when to look again; it never
waits and keeps no deadline: the caller owns `delete-timeout`); it raises NotOwned when the
namespace is not provably ours (nothing is sent) and TemporaryError when it cannot look or
act. `delete_and_confirm` waits for the namespace to go, within `delete-timeout`.
`list_resources` raises TemporaryError when listing fails.
"""

from __future__ import annotations

import logging
import dataclasses
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Sequence

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.runtime import logconfig
from nodepool_k8s.core import records
from nodepool_k8s.runtime.cancel import CancelEvent
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock, StampAges
from nodepool_k8s.config.fingerprint import label_hash
from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.driver.base import (ApiCallListener, ApiMetered, CloudResource,
                                      ClusterAware, Deletion, Gone, LaunchResult, LaunchSpec,
                                      Progress, Provider, ProviderHealth, Underway)
from nodepool_k8s.driver.kubernetes import clearing, guards, manifests, pull_secrets, slim
from nodepool_k8s.driver.kubernetes.bodies import NamespacedBody, Subject
from nodepool_k8s.driver.kubernetes.capacity import CapacityTracker
from nodepool_k8s.driver.kubernetes.client import (SERVICE_ACCOUNT_DIR, Budget, KubeClient,
                                                   Sleeper,
                                                   connect)
from nodepool_k8s.driver.kubernetes import errors as api_errors
from nodepool_k8s.driver.kubernetes.errors import Conflict, Invalid
from nodepool_k8s.driver.kubernetes.events import EventRecorder
from nodepool_k8s.driver.kubernetes.health import ApiProbe
from nodepool_k8s.driver.kubernetes.readiness import PodCheck, Token, token_from_request
from nodepool_k8s.driver.kubernetes.together import Together
from nodepool_k8s.driver.kubernetes.waiter import (ObjectWatch, deletion_finished, metadata,
                                                   object_uid, resource_version,
                                                   wait_namespace_deleted, wait_namespace_gone)
from nodepool_k8s.core.errors import (BootTimeout, LaunchCancelled, LaunchError,
                                      NodepoolError, NotFound, NotOwned, PermanentError,
                                      ProviderUnavailable, QuotaExceeded, TemporaryError)
from nodepool_k8s.core.model import Resources
from nodepool_k8s.core.pool_records import CapacityCondition, ConditionRecord

log = logging.getLogger(__name__)


def _log(spec: LaunchSpec) -> logging.LoggerAdapter[logging.Logger]:
    """Lines about one launch carry `[e: ...] [node_request: ...] [node: ...]`."""
    return logconfig.annotate(log, spec.request.event_id, spec.request.id, spec.node_id)


LIST_PAGE_SIZE = 500
# Deleted namespaces the shared namespace watch remembers (so a deletion that completed
# before its waiter looked is still confirmed without an API call).
NAMESPACE_TOMBSTONES = 1024
# GET + DELETE rounds when the namespace keeps being replaced under us (uid precondition 409).
DELETE_ROUNDS = 3
# (namespace, node) pairs remembered as not ours (`ownership_problem`).
MAX_REFUSED = 1024
# A deletion answered as underway while the namespace watch cannot report its end is
# looked at again after this many seconds.
UNWATCHED_RECHECK = 2.0
# Namespaces whose stuck report or failed clear-up is remembered (report and log once).
MAX_STUCK_TRACKED = 4096
# A cleared namespace is looked at again after the pods' bounded grace period plus this.
CLEARED_RECHECK = 5.0


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
    # Where the pod's service account is mounted, when there is no kubeconfig (in-cluster).
    service_account: str = SERVICE_ACCOUNT_DIR
    # Threads (per provider, shared by its launches) that send a launch's independent
    # creations beside the launch's own thread (`together.Together`); 0: one after the other.
    together_workers: int = 16
    # ... only while at most this many launches of the provider run at once: more of them
    # keep the API server busy by themselves, and extra threads would only add switches.
    together_launches: int = 4


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


def _node_name(pod: dict[str, Any]) -> str | None:
    """The pod's `spec.nodeName`, if it is a string (it goes into the node's record)."""
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, dict) else None
    return name if isinstance(name, str) and name else None


def _plain_number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


class KubernetesProvider(ClusterAware, ApiMetered):
    """Hands out namespaces (`namespace` labels) and pods (`pod` labels) in one context.

    Implements `Provider` and declares `ClusterAware`: it watches the cluster's capacity
    (when `capacity` is configured), its own credentials and whether its API server
    answers (a probe every `api-probe-interval`, see `health`); and `ApiMetered`: every API
    request it sends is reported to the listener given before `start`."""

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
        self._namespaces: ObjectWatch | None = None
        self._events: EventRecorder | None = None
        self._probe: ApiProbe | None = None
        self._capacity: CapacityTracker | None = None
        self._capacity_listeners: list[Callable[[], None]] = []
        # (namespace, node id) -> why it is not that node's: such a namespace never becomes
        # one (names are unique per node and attempt), so a forged record costs one look.
        self._refused: OrderedDict[tuple[str, str], str] = OrderedDict()
        # namespace -> the name of the pod a launch of this process creates there (until
        # the launch returns): its pod is known before the namespace watch has the namespace.
        self._launching: dict[str, str] = {}
        # (pool label value, node-label label value) -> the pod name, for every `pod` label:
        # which pod a namespace of ours holds, from the namespace's labels (after a restart).
        self._pod_names = {
            (manifests.label_value(pool.name), manifests.label_value(label.name)):
                manifests.pod_name(label)
            for pool in config.pools.values() for label in pool.labels.values()
            if label.type == "pod"}
        # How long our namespaces have been Terminating (by their deletionTimestamp, judged
        # on our monotonic clock), those reported stuck, and those whose clear-up failed
        # (by (name, uid): each reported and logged once).
        self._terminating = StampAges(clock)
        self._stuck: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._clear_failed: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Namespaces (name, uid) whose hold we removed: not asked for again.
        self._released: OrderedDict[tuple[str, str], None] = OrderedDict()
        # namespace -> the `wake` of its parked deletion: called early when only our own
        # hold is left in it (job-role: cluster-role), so the deletion removes it at once.
        self._wakers: dict[str, Callable[[], None]] = {}
        # The RBAC subject the API server knows this launcher as (job-role: cluster-role).
        self._subject: Subject | None = None
        self._api_listener: ApiCallListener | None = None
        self._together: Together | None = None  # started with the connection
        self._launches_now = 0  # launches running (`launch` calls not returned)

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
            client = connect(self.config, self._kubeconfig, pool_size, clock=self._clock,
                             on_change=self._credentials_changed,
                             service_account=self.settings.service_account,
                             on_api_call=self._api_listener)
            selector = self.selector
            # Both keep only what the launcher created (`_created_pod`, `_created_namespace`),
            # as slim copies: whatever else carries our labels is dropped where it arrives.
            watches = {
                "pods": ObjectWatch("pods", client, client.core.list_pod_for_all_namespaces,
                                    selector, self._clock,
                                    watch_timeout=self.settings.watch_timeout,
                                    tick=self.settings.wait_tick, slim=slim.pod,
                                    keep=self._created_pod)
            }
            # Namespaces: confirms deletions (one stream per provider, not one per delete).
            watches["namespaces"] = ObjectWatch(
                "namespaces", client, client.core.list_namespace, selector, self._clock,
                watch_timeout=self.settings.watch_timeout, tick=self.settings.wait_tick,
                tombstones=NAMESPACE_TOMBSTONES, owned=self._owns, slim=slim.namespace,
                keep=self._created_namespace,
                on_change=self._namespace_changed)
            # Set before the threads start: the pod watch's predicate reads the namespaces.
            self._client, self._pods = client, watches["pods"]
            self._namespaces = watches["namespaces"]
            for watch in watches.values():
                watch.start()
            self._events = EventRecorder(client, self._clock)
            self._events.start()
            self._together = Together(self.settings.together_workers,
                                      f"k8s-create-{self.name}")
            config = self.config
            self._probe = ApiProbe(
                self.name, lambda: client.probe(config.api_probe_connect_timeout,
                                                config.api_probe_read_timeout),
                client.trust.check, client.health, self._clock,
                config.api_probe_interval)
            self._probe.start()
            if self.config.capacity_nodes or self.config.capacity_resource_quota:
                tracker = CapacityTracker(
                    client, self._clock, nodes=self.config.capacity_nodes,
                    resource_quota=self.config.capacity_resource_quota,
                    ours=lambda pod: self._created_pod(dict(pod)),
                    watch_timeout=self.settings.watch_timeout, tick=self.settings.wait_tick)
                for listener in self._capacity_listeners:
                    tracker.add_listener(listener)
                tracker.start()
                self._capacity = tracker
            log.info("Provider %s connected to %s (context %s)", self.name, client.host,
                     client.context)

    def stop(self) -> None:
        with self._lock:
            client, watches = self._client, (self._pods, self._namespaces)
            events, self._events = self._events, None
            probe, self._probe = self._probe, None
            capacity, self._capacity = self._capacity, None
            together, self._together = self._together, None
            self._client = self._pods = self._namespaces = None
        if together is not None:
            together.stop()
        if probe is not None:
            probe.stop()
        if capacity is not None:
            capacity.stop()
        if events is not None:
            events.stop()
        for watch in watches:
            if watch is not None:
                watch.stop()
        if client is not None:
            client.close()

    # -- credentials -------------------------------------------------------------------------

    def reload_credentials(self) -> bool:
        """Read the kubeconfig (or the in-cluster files) again now: the operator reloaded
        the configuration. False when it now names another server or trust, which a running
        provider does not follow: the launcher replaces it then."""
        with self._lock:
            client = self._client
        return True if client is None else client.credentials.reload_now()

    def credentials_condition(self) -> ConditionRecord | None:
        """The `Credentials` condition of the provider's pools (None: not started)."""
        with self._lock:
            client = self._client
        return None if client is None else client.credentials.condition()

    def api_health(self) -> ProviderHealth | None:
        """Whether the API server answers, trusted, accepting the credentials (None: not
        started): from the probe (`api-probe-interval`) and every real call."""
        with self._lock:
            client = self._client
        return None if client is None else client.health.current()

    def _credentials_changed(self) -> None:
        # Refused or accepted again, the API server unusable or usable again: the pool
        # workers look again (their status shows it, and requests waiting for the provider
        # can go on at once).
        with self._lock:
            listeners = list(self._capacity_listeners)
        for listener in listeners:
            listener()

    def watches_synced(self) -> bool:
        """True once the shared pod and namespace watches (and the capacity watches, when
        capacity awareness is on) have listed once."""
        with self._lock:
            watches = (self._pods, self._namespaces)
            capacity = self._capacity
        return all(w is not None and w.synced for w in watches) \
            and (capacity is None or capacity.synced)

    def _connected(self) -> tuple[KubeClient, ObjectWatch]:
        with self._lock:
            if self._client is None or self._pods is None:
                raise TemporaryError(f"provider {self.name} is not started")
            return self._client, self._pods

    def _namespace_watch(self) -> ObjectWatch:
        with self._lock:
            if self._namespaces is None:
                raise TemporaryError(f"provider {self.name} is not started")
            return self._namespaces

    @property
    def installation_id(self) -> str:
        return self.config.installation_id

    @property
    def selector(self) -> str:
        """Our provider label and our installation label: the watches and the sweep use it."""
        return manifests.provider_selector(self.name, self.installation_id)

    def _owns(self, obj: dict[str, Any]) -> bool:
        """Whether a namespace carries this provider's and this installation's labels."""
        return self._ownership_problem(obj) is None

    def _ownership_problem(self, obj: dict[str, Any], node_id: str | None = None) -> str | None:
        return manifests.ownership_problem(obj, self.name, self.installation_id, node_id)

    def _created_namespace(self, obj: dict[str, Any]) -> bool:
        """Whether `obj` is a namespace this provider created for a node."""
        return manifests.created_namespace_problem(obj, self.name,
                                                   self.installation_id) is None

    def _created_pod(self, obj: dict[str, Any]) -> bool:
        """Whether `obj` is the pod this provider created for a `pod` label's node: the
        namespace is one a launch of this process is filling, or one of ours (the
        namespace watch's copy, so also after a restart) whose labels name a `pod` label;
        and the pod has the name given to that label's pod. A job's own pods (any name,
        any labels, in a `namespace` label's namespace) never pass."""
        meta = metadata(obj)
        namespace = str(meta.get("namespace") or "")
        with self._lock:
            expected = self._launching.get(namespace)
            watch = self._namespaces
        if expected is None and watch is not None:
            owner = watch.get("", namespace)
            labels = metadata(owner).get("labels") if owner is not None else None
            if isinstance(labels, dict):
                expected = self._pod_names.get((str(labels.get(manifests.POOL_LABEL)),
                                                str(labels.get(manifests.NODE_LABEL_LABEL))))
        return manifests.created_pod_problem(obj, self.name, self.installation_id,
                                             expected) is None

    def _wait_gone(self, client: KubeClient, namespace: str,
                   response: dict[str, Any] | None, deadline: float) -> None:
        """Confirm `namespace` is gone after a DELETE (`response`; None after a 409)."""
        if response is not None and not self._created_namespace(response):
            # Not ours by label or name (a collision): the shared watch never reports it.
            wait_namespace_gone(client, namespace, resource_version(response), deadline,
                                self._clock)
            return
        uid = object_uid(response) if response is not None else None
        if self._holds and uid:
            self._release_when_alone(client, namespace, uid, deadline)
        wait_namespace_deleted(self._namespace_watch(), client, namespace, uid, deadline,
                               self._clock)

    def _release_when_alone(self, client: KubeClient, namespace: str, uid: str,
                            deadline: float) -> None:
        """Wait (on the namespace watch) until our cleanup binding is all that is left in
        the Terminating namespace `uid`, then remove our hold; return at once when the
        watch no longer holds that namespace (the caller confirms it gone)."""
        def check(obj: dict[str, Any] | None) -> bool | None:
            if obj is None or object_uid(obj) != uid:
                return False
            return True if clearing.only_own_hold(obj) else None
        try:
            alone = self._namespace_watch().wait("", namespace, check, deadline, CancelEvent(),
                                                 what=f"namespace {namespace} to empty")
        except BootTimeout as exc:
            raise TemporaryError(f"namespace {namespace} still exists after its deletion "
                                 f"timeout ({clearing.describe(self._namespace_copy(namespace))})"
                                 ) from exc
        except LaunchCancelled as exc:
            raise TemporaryError(f"stopped waiting for namespace {namespace}: {exc}") from exc
        if alone and not self._was_released(namespace, uid):
            clearing.release_hold(client, namespace)
            self._remember(self._released, (namespace, uid))

    def _namespace_copy(self, name: str) -> dict[str, Any]:
        with self._lock:
            watch = self._namespaces
        return (watch.get("", name) if watch is not None else None) or {}

    # -- namespaces that stay Terminating ----------------------------------------------------

    def _namespace_changed(self, old: dict[str, Any] | None,
                           new: dict[str, Any] | None) -> None:
        """Namespace watch listener (its thread): a parked deletion whose namespace now
        holds nothing but our cleanup binding is woken to remove our hold. A namespace
        that is gone takes its entries along, also when no deletion of ours will finish
        (its node record was removed meanwhile)."""
        if new is None:
            if old is not None:
                self._forget_namespace(str(metadata(old).get("name") or ""))
            else:  # listed afresh: what went unseen in between is gone too
                listed = {str(metadata(o).get("name") or "")
                          for o in self._namespace_watch().objects()}
                with self._lock:
                    unlisted = [n for n in self._wakers if n not in listed]
                for name in unlisted:
                    self._forget_namespace(name)
                self._terminating.keep(listed)
            return
        if not self._holds or not metadata(new).get("deletionTimestamp"):
            return
        name = str(metadata(new).get("name") or "")
        if not clearing.only_own_hold(new):
            return
        with self._lock:
            waker = self._wakers.pop(name, None)
        if waker is not None:
            waker()  # hands the deletion to a deleter thread; nothing blocks here

    def _forget_namespace(self, name: str) -> None:
        """Drop what is tracked for a parked deletion of `name` (the namespace is gone)."""
        with self._lock:
            self._wakers.pop(name, None)
        self._terminating.forget(name)

    def _was_released(self, name: str, uid: str) -> bool:
        with self._lock:
            return (name, uid) in self._released

    def _remember(self, table: OrderedDict[tuple[str, str], None],
                  key: tuple[str, str]) -> bool:
        """Add `key` to a bounded table of namespaces; whether it was new."""
        with self._lock:
            new = key not in table
            table[key] = None
            while len(table) > MAX_STUCK_TRACKED:
                table.popitem(last=False)
            return new

    def _wake_on_release(self, name: str, wake: Callable[[], None]) -> None:
        """Have `wake` called early once only our hold is left in `name` (also when
        that happened since this deletion looked)."""
        with self._lock:
            self._wakers[name] = wake
        current = self._namespace_copy(name)
        if current and clearing.only_own_hold(current):
            with self._lock:
                waker = self._wakers.pop(name, None)
            if waker is not None:
                waker()

    def _judge_terminating(self, client: KubeClient, name: str, node_id: str | None,
                           current: dict[str, Any]) -> tuple[str | None, float]:
        """For our Terminating namespace `current`: (what holds it, on the first look
        after it has been Terminating for `terminating-grace`, else None; when to look
        again).

        Before the grace: our hold is removed if it is all that is left. Past it, the first
        look only reports it stuck (the caller shows that before anything is touched); every
        later look clears it (see `clearing.clear`), raising ClearingFailed (logged once per
        namespace) when that did not work."""
        stamp = _parse_timestamp(metadata(current).get("deletionTimestamp"))
        grace = float(self.config.terminating_grace)
        age = self._terminating.age(name, stamp) if stamp is not None else 0.0
        if age < grace:
            uid = object_uid(current)
            if self._holds and clearing.only_own_hold(current) \
                    and not self._was_released(name, uid):
                clearing.release_hold(client, name)
                self._remember(self._released, (name, uid))
            return None, grace - age
        key = (name, object_uid(current))
        stuck = (f"namespace {name} Terminating for {age:.0f}s (terminating-grace "
                 f"{grace:.0f}s); {clearing.describe(current)}")
        if self._remember(self._stuck, key):
            return stuck, 0.0
        self._clear(client, name, node_id, current)
        return None, float(self.config.max_pod_grace) + CLEARED_RECHECK

    def _clear(self, client: KubeClient, name: str, node_id: str | None,
               current: dict[str, Any]) -> None:
        """Prove `name` ours once more (a GET: labels, node id, the same uid, Terminating),
        then clear what holds it."""
        try:
            fresh = client.call(f"read namespace {name}", client.api.read_namespace, name)
        except NotFound:
            return
        problem = self._ownership_problem(fresh, node_id)
        if problem is not None:
            raise NotOwned(f"namespace {name} is not provably ours: {problem}")
        uid = object_uid(current)
        if object_uid(fresh) != uid or not metadata(fresh).get("deletionTimestamp"):
            return  # not the namespace judged stuck: the next look judges this one
        where = f"[node: {node_id or '?'}] namespace {name}"
        try:
            cleared = clearing.clear(client, name, int(self.config.max_pod_grace),
                                     self._holds)
        except NodepoolError as exc:
            first = self._remember(self._clear_failed, (name, uid))
            log.log(logging.WARNING if first else logging.DEBUG,
                    "%s stays Terminating; clearing it failed (retried): %s", where, exc)
            raise clearing.ClearingFailed(str(exc)) from exc
        for kind, obj_name, finalizers in cleared.finalizers:
            log.warning("%s: removed the finalizers %s of %s %s, which kept it Terminating",
                        where, ", ".join(finalizers), kind, obj_name)
        for pod, grace in cleared.pods:
            log.warning("%s: deleted pod %s with a grace period of %ds (it had %s)", where,
                        pod, self.config.max_pod_grace, f"{grace}s" if grace is not None
                        else "not been deleted yet")
        if cleared.hold_released:
            self._remember(self._released, (name, uid))
            log.info("%s: released the launcher's hold on it", where)

    # -- launch ------------------------------------------------------------------------------

    def _event(self, namespace: str, reason: str, message: str, warning: bool = False,
               pod: str | None = None, node_id: str | None = None, now: bool = False) -> None:
        with self._lock:
            events = self._events
        if events is not None:
            events.emit(namespace, reason, message, warning, pod, node_id, now=now)

    def _condition(self, type_: str, status: str, reason: str,
                   message: str) -> cond.Condition:
        return cond.Condition(type_, status, reason, message, self._clock.time())

    def launch(self, spec: LaunchSpec, cancel: threading.Event,
               progress: Progress | None = None) -> LaunchResult:
        with self._lock:
            self._launches_now += 1
        try:
            return self._launch(spec, cancel, progress)
        finally:
            with self._lock:
                self._launches_now -= 1

    def _launch(self, spec: LaunchSpec, cancel: threading.Event,
                progress: Progress | None) -> LaunchResult:
        client, pods = self._connected()
        label = spec.label
        _validate(label)
        if cancel.is_set():
            raise LaunchCancelled("cancelled before start")
        deadline = self._clock.monotonic() + label.boot_timeout
        # One budget for every call of the launch, its retries included: a frozen API
        # server costs the launch its deadline at most, never a retry budget per call.
        budget = Budget(cancel, deadline, self._clock)
        labels = manifests.object_labels(spec)
        try:
            namespace = self._create_namespace(client, spec, labels, budget)
        except NodepoolError as exc:
            failure = _as_launch_failure(exc, cancel)
            if failure is None or failure is exc:
                raise
            raise failure from exc
        _log(spec).info("Created namespace %s (attempt %d)", namespace, spec.attempt)
        node_id = spec.node_id
        report = progress or (lambda external_id, *updates: None)
        pod_name: str | None = None
        try:
            message = f"namespace {namespace} created (attempt {spec.attempt})"
            report(namespace,
                   self._condition(cond.LAUNCHED, cond.TRUE, "NamespaceCreated", message))
            self._event(namespace, "Launched", f"node {node_id}: {message}", node_id=node_id)
            if label.type == "pod":
                with self._lock:  # before the pod exists: its first event is kept
                    self._launching[namespace] = manifests.pod_name(label)
            self._create_contents(client, namespace, label, labels, budget)
            token = self._request_token(client, namespace, budget)
            message = (f"service account {manifests.SERVICE_ACCOUNT}, role binding and token "
                       "in place")
            report(namespace, self._condition(cond.REGISTERED, cond.TRUE, "AccessGranted",
                                              message))
            self._event(namespace, "Registered", f"node {node_id}: {message}",
                        node_id=node_id)
            pod = None
            if label.type == "pod":
                pod_name = name = manifests.pod_name(label)
                check = PodCheck(f"{namespace}/{name}", self._clock,
                                 self.unschedulable_grace)
                pod = pods.wait(namespace, name, check, deadline, cancel,
                                what=f"pod {namespace}/{name} to run",
                                recheck_in=check.recheck_in)
                host = _node_name(pod) or "unknown"
                report(namespace, self._condition(
                    cond.INITIALIZED, cond.TRUE, "PodRunning",
                    f"pod {name} scheduled on {host}, image pulled, running"))
            else:
                report(namespace, self._condition(cond.INITIALIZED, cond.TRUE, "NoWorkload",
                                                  "namespace label: no pod to start"))
            # Inside the try: a result that cannot be built (the CA unreadable) is a failed
            # attempt whose namespace is removed, not a namespace left to the leak sweeper.
            result = self._result(client, namespace, label, token, pod)
        except BaseException as exc:
            failure = _as_launch_failure(exc, cancel)
            _log(spec).warning("Attempt %d in namespace %s failed: %s", spec.attempt,
                               namespace, exc)
            reason = _reason_of(failure if failure is not None else exc)
            if reason != "Cancelled":
                self._event(namespace, "LaunchFailed",
                            f"node {node_id} attempt {spec.attempt}: {reason}: {exc}",
                            warning=True, pod=pod_name, node_id=node_id,
                            now=not cancel.is_set())
            if self._given_up(client, budget):
                # Given up on a server that does not answer: waiting for it here would
                # hold the request; the node's deletion (or the leak sweep) removes the
                # namespace once the server answers again.
                _log(spec).warning("Leaving namespace %s to cleanup: the API server cannot"
                                   " be used now", namespace)
            else:
                self._discard(client, namespace, spec.node_id, cancelled=cancel.is_set())
            if failure is exc or failure is None:
                raise
            raise failure from exc
        finally:
            with self._lock:
                self._launching.pop(namespace, None)
        _log(spec).info("Namespace %s ready", namespace)
        self._event(namespace, "Ready", f"node {node_id} is ready for Zuul", pod=pod_name,
                    node_id=node_id)
        return result

    def _create_namespace(self, client: KubeClient, spec: LaunchSpec,
                          labels: dict[str, str], sleep: Sleeper) -> str:
        """Create a namespace with a name no earlier attempt used; returns the name."""
        for retry in (False, True):
            # The random suffix only for the second try (the first name was taken).
            suffix = "r" + secrets.token_hex(3) if retry else ""
            name = manifests.namespace_name(spec.pool.name, spec.node_id, spec.attempt, suffix)
            try:
                body = manifests.namespace_body(
                    name, {**labels, **guards.namespace_labels(spec.label)},
                    annotations={
                        **(spec.label.annotations or {} if spec.label.type == "namespace"
                           else {}),
                        manifests.CONFIG_HASH_ANNOTATION: label_hash(spec.label, spec.pool)})
                created = client.call(f"create namespace {name}", client.api.create_namespace,
                                      body, sleep=sleep, created_ok=True)
                if not created:
                    # A retried create met 409: accept it only when the namespace is provably
                    # this node's (our earlier try reached the server), never someone else's.
                    self._require_ours(client, name, spec.node_id, sleep)
                return name
            except Conflict:
                # Not ours to delete: perhaps an earlier attempt still Terminating.
                _log(spec).warning("Namespace %s exists already; using a fresh name", name)
            except NodepoolError as exc:
                if isinstance(exc, TemporaryError) \
                        and not isinstance(exc, ProviderUnavailable) \
                        and not self._given_up(client, sleep):
                    # The create may have reached the server before the answer was lost
                    # (a timeout): remove that name too, without waiting, but only if a GET
                    # shows it carries this installation's and this node's labels. (A 401
                    # is answered before anything is created.) Not once the launch was given
                    # up on a server known not to answer: the look would only hold it; the
                    # leak sweep removes such a namespace (it carries our labels) later.
                    self._discard(client, name, spec.node_id, cancelled=True)
                raise
        raise LaunchError(f"no free namespace name for node {spec.node_id}",
                          reason="NamespaceExists")

    @staticmethod
    def _given_up(client: KubeClient, sleep: Sleeper) -> bool:
        """The launch was cancelled while its API server is known not to be usable: its
        failed attempt leaves what it made to cleanup instead of waiting for the server."""
        return isinstance(sleep, Budget) and sleep.cancel.is_set() \
            and client.health.current().healthy is False

    def _require_ours(self, client: KubeClient, name: str, node_id: str,
                      sleep: Sleeper) -> None:
        """Raise Conflict unless namespace `name` carries our and node `node_id`'s labels."""
        try:
            current = client.call(f"read namespace {name}", client.api.read_namespace, name,
                                  sleep=sleep)
        except NotFound as exc:
            raise TemporaryError(f"namespace {name} vanished right after its creation") \
                from exc
        problem = self._ownership_problem(current, node_id)
        if problem is not None:
            raise Conflict(f"namespace {name} exists and is not ours: {problem}")

    def _request_token(self, client: KubeClient, namespace: str, sleep: Sleeper) -> Token:
        """A bound token of the namespace's service account, valid for `token-lifetime`."""
        answer = client.call(
            f"request a token for {namespace}/{manifests.SERVICE_ACCOUNT}",
            client.api.create_namespaced_service_account_token, manifests.SERVICE_ACCOUNT,
            namespace, manifests.token_request_body(self.config.token_lifetime), sleep=sleep)
        return token_from_request(answer)

    def _create_contents(self, client: KubeClient, namespace: str, label: PoolLabel,
                         labels: dict[str, str], sleep: Sleeper) -> None:
        # Prepared operations (`client.api`): the same requests at a fraction of the
        # generated methods' per-call work (see `client.Endpoint`).
        core = rbac = networking = client.api
        Step = tuple[str, Callable[..., Any], NamespacedBody | None]
        # The fences (the quota must exist before any pod is admitted), the service account
        # and the role do not depend on each other: they go out together. A role binding
        # goes after them: the API server's escalation check reads the role it names.
        independent: list[Step] = [
            ("resourcequota", core.create_namespaced_resource_quota,
             guards.resource_quota_body(namespace, label, labels)),
            ("limitrange", core.create_namespaced_limit_range,
             guards.limit_range_body(namespace, label, labels)),
            ("networkpolicy", networking.create_namespaced_network_policy,
             guards.network_policy_body(namespace, label, labels)),
            ("serviceaccount", core.create_namespaced_service_account,
             manifests.service_account_body(namespace, labels)),
        ]
        bindings: list[Step]
        if self.config.job_role == "cluster-role":
            # The launcher's own rights to clear this namespace should it stay Terminating
            # (held by our finalizer until we are done), before anything a job could hold.
            bindings = [("rolebinding", rbac.create_namespaced_role_binding,
                         manifests.cleanup_binding_body(namespace, labels,
                                                        self._own_subject(client, sleep))),
                        ("rolebinding", rbac.create_namespaced_role_binding,
                         guards.cluster_role_binding_body(namespace, label, labels))]
        else:
            independent.append(("role", rbac.create_namespaced_role,
                                manifests.role_body(namespace, label, labels)))
            bindings = [("rolebinding", rbac.create_namespaced_role_binding,
                         manifests.role_binding_body(namespace, label, labels))]

        def creation(kind: str, create: Callable[..., Any],
                     body: NamespacedBody) -> Callable[[], object]:
            return lambda: client.call(f"create {kind} {namespace}/{body['metadata']['name']}",
                                       create, namespace, body, sleep=sleep, created_ok=True)
        together, at_once = self._together_now()
        together.run([creation(kind, create, body)
                      for kind, create, body in independent if body is not None], at_once)
        for kind, create, body in bindings:
            if body is not None:
                creation(kind, create, body)()
        if label.type == "pod":
            # The pod names the copies: they exist before the kubelet looks for them.
            pull_secrets.copy_all(client, namespace, label, labels, self.name,
                                  self.installation_id, labels[manifests.NODE_ID_LABEL], sleep)
            body = manifests.pod_body(namespace, label, labels)
            client.call(f"create pod {namespace}/{body['metadata']['name']}",
                        core.create_namespaced_pod, namespace, body, sleep=sleep,
                        created_ok=True)

    def _together_now(self) -> tuple[Together, bool]:
        """The provider's `Together`, and whether a step goes out at once now (few
        launches running)."""
        with self._lock:
            together, running = self._together, self._launches_now
        if together is None:  # stopped meanwhile
            raise LaunchCancelled("the provider stopped")
        return together, running <= self.settings.together_launches

    @property
    def _holds(self) -> bool:
        """Whether our node namespaces carry the cleanup binding and its hold."""
        return self.config.job_role == "cluster-role"

    def _own_subject(self, client: KubeClient, sleep: Sleeper) -> Subject:
        """Who the API server takes this launcher for (a SelfSubjectReview, asked once)."""
        with self._lock:
            subject = self._subject
        if subject is not None:
            return subject
        review = client.call("ask who the launcher is", client.authentication
                             .create_self_subject_review,
                             {"apiVersion": "authentication.k8s.io/v1",
                              "kind": "SelfSubjectReview"}, sleep=sleep)
        status = review.get("status")
        info = status.get("userInfo") if isinstance(status, dict) else None
        username = info.get("username") if isinstance(info, dict) else None
        if not isinstance(username, str) or not username:
            raise TemporaryError("the SelfSubjectReview named no user")
        subject = manifests.subject_of(username)
        with self._lock:
            self._subject = subject
        log.info("Provider %s: the API server knows the launcher as %s", self.name, username)
        return subject

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
            ca_crt = client.ca_crt()
            if ca_crt is not None:
                port["ca_crt"] = ca_crt
        pod_name = None
        host_id = None
        if pod is not None:
            pod_name = str(metadata(pod).get("name") or manifests.pod_name(label))
            port["pod"] = pod_name
            host_id = _node_name(pod)
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
            extra={"token_expires": int(token.expires)} if token.expires is not None else None,
        )

    def _discard(self, client: KubeClient, namespace: str, node_id: str,
                 cancelled: bool) -> None:
        """Remove a failed attempt's namespace; never raises (the sweeper is the backstop)."""
        try:
            # No job ever had this namespace: our hold goes before the DELETE.
            if cancelled:  # no waiting: the DELETE only
                self._prove_and_delete(client, namespace, node_id,
                                       self._watched_namespace(namespace, node_id),
                                       release=True)
            else:
                self._delete_and_confirm(
                    client, namespace, node_id,
                    self._clock.monotonic() + self.settings.cleanup_timeout, release=True)
        except NotOwned as exc:
            log.warning("Not deleting namespace %s of a failed attempt: %s", namespace, exc)
        except Exception as exc:  # noqa: BLE001 - best effort by contract
            log.warning("Namespace %s of a failed attempt may remain (labelled for the leak "
                        "sweeper): %s", namespace, exc)

    def _prove_and_delete(self, client: KubeClient, name: str, node_id: str | None,
                          watched: dict[str, Any] | None, announce: bool = False,
                          release: bool = False) -> dict[str, Any] | None:
        """Look at `name`, prove it ours and, unless it is Terminating already, DELETE it
        with `preconditions.uid`: one step, no waiting. Returns the namespace as last seen
        (the DELETE's answer, or the Terminating copy), None when it is gone.

        The first look is `watched` (the shared namespace watch's copy, provably ours: the
        watch selects our labels, and the copy's labels were checked again), if given; else,
        and after any 409, a GET. Either way the DELETE carries the uid and resourceVersion
        of the very copy that was proven ours as preconditions, so it removes nothing that
        was replaced or changed since (say, relabelled) that copy was taken. Missing =
        gone. Raises NotOwned (nothing was sent), TemporaryError, or another NodepoolError
        from the API. A 409 (the preconditions failed, or the namespace is already
        Terminating) is never a delete: it is looked at again from a GET. With `announce`
        a `Deleting` event goes before the DELETE; with `release` our hold is removed first
        (a failed attempt's namespace, which no job ever had).
        """
        for _ in range(DELETE_ROUNDS):
            if watched is not None:
                current, watched = watched, None
            else:
                try:
                    current = client.call(f"read namespace {name}",
                                          client.api.read_namespace, name)
                except NotFound:
                    return None
            problem = self._ownership_problem(current, node_id)
            if problem is not None:
                raise NotOwned(f"namespace {name} is not provably ours: {problem}")
            uid = object_uid(current)
            if not uid:
                raise TemporaryError(f"namespace {name} was read without a uid")
            if metadata(current).get("deletionTimestamp"):
                return current  # Terminating: the DELETE was sent already
            if release and self._holds:
                try:
                    clearing.release_hold(client, name)
                except NodepoolError as exc:
                    log.info("Namespace %s keeps the launcher's hold: %s", name, exc)
            if announce:
                # Proven ours; sent before the DELETE (a Terminating namespace accepts no
                # new objects). Best effort, one try.
                self._event(name, "Deleting", f"node {node_id or '?'}: deleting the"
                            " namespace", node_id=node_id, now=True)
                announce = False
            try:
                return self._delete_uid(client, name, uid, resource_version(current))
            except NotFound:
                return None
            except Conflict:
                continue  # replaced or Terminating: judge what is there now
        raise TemporaryError(f"namespace {name} kept changing while being deleted")

    def _reconcile(self, client: KubeClient, name: str, node_id: str | None,
                   wake: Callable[[], None] | None, verify: bool) -> Deletion:
        """One look at the deletion of `name` (`delete`): DELETE it if it is not going yet,
        then answer from what is there. Asked again, the watch answers without a GET: gone
        (a confirmed tombstone, no copy) or still Terminating (its copy); with `verify` a
        GET decides (a watch that broke keeps an old copy). A Terminating namespace is
        judged (`_judge_terminating`: stuck, cleared) and `wake` registered with the watch
        for when it leaves (or only our hold is left in it)."""
        watched = self._watched_namespace(name, node_id)
        if watched is None:
            if self._gone_per_watch(name):
                return Gone()
            if not verify:
                watched = self._watched_namespace(name, node_id, terminating=True)
        response = self._prove_and_delete(client, name, node_id, watched, announce=True)
        if response is None or deletion_finished(response):
            return Gone()
        if not self._created_namespace(response):
            # Not ours by label or name (a collision): the shared watch never reports it,
            # so the next look reads it.
            return Underway(self._clock.monotonic() + UNWATCHED_RECHECK,
                            f"namespace {name} is terminating (not on the namespace watch)")
        uid = object_uid(response)
        stuck, look_in = self._judge_terminating(client, name, node_id, response)
        now = self._clock.monotonic()
        if uid and wake is not None \
                and self._namespace_watch().notify_gone("", name, uid, wake):
            if self._holds and not self._was_released(name, uid):
                self._wake_on_release(name, wake)
            return Underway(now + look_in, f"namespace {name} is terminating", stuck)
        if self._gone_per_watch(name):
            return Gone()  # gone already, before the wake-up could be registered
        # The watch cannot tell yet (not synced, say after this provider replaced another):
        # look again soon.
        return Underway(now + min(look_in, UNWATCHED_RECHECK),
                        f"namespace {name} is terminating (the namespace watch cannot tell"
                        " yet)", stuck)

    def _delete_and_confirm(self, client: KubeClient, name: str, node_id: str | None,
                            deadline: float, announce: bool = False,
                            release: bool = False) -> None:
        """Delete `name` (`_prove_and_delete`) and wait until it is gone, on the shared
        namespace watch (`_wait_gone`); TemporaryError at `deadline`."""
        response = self._prove_and_delete(client, name, node_id,
                                          self._watched_namespace(name, node_id),
                                          announce=announce, release=release)
        if response is not None and not deletion_finished(response):
            self._wait_gone(client, name, response, deadline)

    def _gone_per_watch(self, name: str) -> bool:
        """The synced namespace watch holds no copy of `name` and saw our namespace of that
        name deleted (a DELETED event while it still carried our labels)."""
        with self._lock:
            watch = self._namespaces
        if watch is None or not watch.synced or watch.get("", name) is not None:
            return False
        tomb = watch.tombstone("", name)
        return tomb is not None and tomb[1]

    def _watched_namespace(self, name: str, node_id: str | None,
                           terminating: bool = False) -> dict[str, Any] | None:
        """The namespace watch's copy of `name`, if it is provably ours and not yet being
        deleted (or, with `terminating`, already being deleted): one GET less per
        deletion; None sends the caller to the API."""
        with self._lock:
            watch = self._namespaces
        cached = watch.get("", name) if watch is not None and watch.synced else None
        if cached is None or self._ownership_problem(cached, node_id) is not None \
                or not object_uid(cached) \
                or bool(metadata(cached).get("deletionTimestamp")) != terminating:
            return None
        return cached

    @staticmethod
    def _delete_uid(client: KubeClient, name: str, uid: str,
                    version: str | None) -> dict[str, Any]:
        """DELETE namespace `name` only if its uid is still `uid` and, when given, its
        resourceVersion still `version` (409 Conflict otherwise)."""
        preconditions = {"uid": uid}
        if version:
            preconditions["resourceVersion"] = version
        # A plain body: the client's model classes copy its whole default Configuration
        # (and reset logger levels) per object, a large share of a deletion's CPU.
        options = {"propagationPolicy": "Background", "preconditions": preconditions}
        return client.call(f"delete namespace {name}", client.api.delete_namespace, name,
                           body=options)

    # -- delete and list ---------------------------------------------------------------------

    def delete(self, external_id: str, node_id: str | None = None,
               wake: Callable[[], None] | None = None, verify: bool = False) -> Deletion:
        self._check_name(external_id)
        client, _ = self._connected()
        try:
            step = self._reconcile(client, external_id, node_id, wake, verify)
        except NotOwned:
            self._forget_namespace(external_id)
            raise
        except PermanentError as exc:
            # Never swallowed (Nodepool logged and forgot): the core keeps the node and retries.
            self._forget_namespace(external_id)
            raise TemporaryError(f"cannot delete namespace {external_id}: {exc}") from exc
        except BaseException:
            self._forget_namespace(external_id)
            raise
        if isinstance(step, Gone):
            self._forget_namespace(external_id)
            log.info("Namespace %s deleted", external_id)
        return step

    def delete_and_confirm(self, external_id: str, node_id: str | None = None) -> None:
        """Delete the namespace and wait until it is gone, within `delete-timeout`
        (TemporaryError after it); for callers that must wait (the launcher's deleter
        calls `delete` instead)."""
        self._check_name(external_id)
        client, _ = self._connected()
        try:
            self._delete_and_confirm(client, external_id, node_id,
                                     self._clock.monotonic() + self.delete_timeout,
                                     announce=True)
        except NotOwned:
            raise
        except PermanentError as exc:
            raise TemporaryError(f"cannot delete namespace {external_id}: {exc}") from exc
        log.info("Namespace %s deleted", external_id)

    @staticmethod
    def _check_name(external_id: str) -> None:
        if not manifests.is_namespace_name(external_id):
            # No API call: such a name was never created by us, and a huge one would only
            # earn a 414 (retried for ever) from the server or a proxy in front of it.
            raise NotOwned(f"{records.clip(external_id)!r} is not a namespace name")

    def ownership_problem(self, external_id: str, node_id: str) -> str | None:
        if not manifests.is_namespace_name(external_id):
            return f"{records.clip(external_id)!r} is not a namespace name"
        key = (external_id, node_id)
        with self._lock:
            known = self._refused.get(key)
        if known is not None:
            return known
        if self._watched_namespace(external_id, node_id) is not None:
            return None
        client, _ = self._connected()
        try:
            current = client.call(f"read namespace {external_id}", client.api.read_namespace,
                                  external_id)
        except NotFound:
            problem: str | None = f"namespace {external_id} does not exist"
        else:
            problem = self._ownership_problem(current, node_id)
            if problem is None and metadata(current).get("deletionTimestamp"):
                problem = f"namespace {external_id} is being deleted"
        if problem is not None:
            with self._lock:
                self._refused[key] = problem
                while len(self._refused) > MAX_REFUSED:
                    self._refused.popitem(last=False)
        return problem

    def list_resources(self) -> Sequence[CloudResource]:
        client, _ = self._connected()
        found: list[CloudResource] = []
        token: str | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
                if token:
                    kwargs["_continue"] = token
                body = client.call("list namespaces", client.core.list_namespace,
                                   label_selector=self.selector,
                                   **kwargs)
                for item in body.get("items") or []:
                    resource = self._as_resource(item)
                    if resource is not None:
                        found.append(resource)
                token = metadata(body).get("continue")
                if not token:
                    return found
        except TemporaryError:
            raise
        except NodepoolError as exc:
            raise TemporaryError(f"cannot list namespaces of {self.name}: {exc}") from exc

    def _as_resource(self, item: dict[str, Any]) -> CloudResource | None:
        if not self._owns(item):  # the selector says so; never trust a list blindly
            return None
        meta = metadata(item)
        labels = dict(meta.get("labels") or {})
        name = str(meta.get("name") or "")
        node_id = labels.get(manifests.NODE_ID_LABEL)
        if not node_id:
            parsed = manifests.parse_namespace_name(name)
            node_id = parsed[1] if parsed else None
        status = item.get("status")
        phase = status.get("phase") if isinstance(status, dict) else None
        return CloudResource(
            external_id=name, node_id=node_id, provider=self.name,
            created=_parse_timestamp(meta.get("creationTimestamp")),
            deleting=bool(meta.get("deletionTimestamp")) or phase == "Terminating",
            metadata=labels)

    # -- quota -------------------------------------------------------------------------------

    def quota_for_label(self, label: PoolLabel) -> Resources:
        return label.quota()

    def cloud_limits(self, label: PoolLabel | None = None) -> Resources:
        """Unlimited unless capacity awareness is on (`capacity`, see `capacity.py`):
        without a label the ResourceQuota's hard ceiling, with one what fits now."""
        with self._lock:
            capacity = self._capacity
        if capacity is None:
            return Resources.limits()
        return capacity.limits(label)

    def capacity_condition(self, pool: PoolConfig) -> CapacityCondition | None:
        """The pool's `Capacity` condition (None: capacity awareness is off)."""
        with self._lock:
            capacity = self._capacity
        if capacity is None:
            return None
        return capacity.condition(pool.labels.values())

    def on_api_call(self, listener: ApiCallListener) -> None:
        """Report every API request of the client made by the next `start` to `listener`."""
        self._api_listener = listener

    def on_capacity_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (coalesced, on a watch thread) when capacity may have changed,
        and when the credentials become refused or accepted again (on the thread that
        found out)."""
        with self._lock:
            self._capacity_listeners.append(listener)
            if self._capacity is not None:
                self._capacity.add_listener(listener)


def _validate(label: PoolLabel) -> None:
    if label.type not in ("namespace", "pod"):
        raise LaunchError(f"label {label.name}: unknown type {label.type!r}",
                          reason="InvalidLabel", retryable=False)
    if label.type == "pod" and label.spec is None and not label.image:
        raise LaunchError(f"label {label.name}: a pod label needs `image` or `spec`",
                          reason="InvalidLabel", retryable=False)


def _reason_of(exc: BaseException) -> str:
    """The bounded reason (`conditions.REASONS`) of what a failed attempt raises."""
    if isinstance(exc, QuotaExceeded):
        return "QuotaExceeded"
    if isinstance(exc, ProviderUnavailable):
        return cond.reason(exc.reason)
    if isinstance(exc, LaunchError):
        return cond.reason(exc.reason)
    if isinstance(exc, TemporaryError):
        return "ApiError"
    return "Unknown"


def _as_launch_failure(exc: BaseException, cancel: threading.Event) -> BaseException | None:
    """What a failed attempt raises for `exc` (None: re-raise `exc` itself)."""
    if cancel.is_set() and isinstance(exc, NodepoolError) \
            and not isinstance(exc, LaunchCancelled):
        # An API error met while giving up is not the story: the core cancelled us.
        return LaunchCancelled(f"cancelled ({exc})")
    if isinstance(exc, QuotaExceeded) and guards.own_quota_refusal(str(exc)):
        # Not the cluster being full: the pod asks for more than its label was counted for.
        return LaunchError(f"the pod exceeds its label's ResourceQuota: {exc}",
                           reason="LabelQuota", retryable=False)
    if isinstance(exc, (LaunchError, TemporaryError)):
        return exc  # includes QuotaExceeded
    if isinstance(exc, Invalid):
        return LaunchError(str(exc), reason="Invalid", retryable=False)
    if isinstance(exc, (NotFound, Conflict)):
        # Someone removed or raced our objects mid-launch: a fresh attempt can succeed.
        return LaunchError(str(exc), reason=api_errors.reason_code(exc))
    if isinstance(exc, PermanentError):
        # Forbidden and the like: an operator must act first. (Unauthorized is a
        # ProviderUnavailable, a TemporaryError, passed on above: the core waits.)
        return LaunchError(str(exc), reason=api_errors.reason_code(exc), retryable=False)
    return None


if TYPE_CHECKING:
    # mypy proves the class satisfies the Provider protocol the core programs against.
    _CONFORMS: type[Provider] = KubernetesProvider
