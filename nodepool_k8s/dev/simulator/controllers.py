"""Background controllers: pod lifecycle, service-account tokens, namespace/pod deletion.

Owns: what a real cluster does on its own after an API call —
- scheduler + kubelet: Pending -> scheduled on a node (spec.nodeName, PodScheduled) ->
  Running (podIP, hostIP, startTime, ready containerStatuses); or stuck Pending with
  PodScheduled=False/Unschedulable (selector matches no node, or the unschedulable fault),
  or with containers waiting in ErrImagePull -> ImagePullBackOff (image-pull fault);
- token controller: fills data.token / ca.crt / namespace of service-account-token Secrets;
- namespace controller: deletes a Terminating namespace's contents as a client DELETE would
  (pods gracefully, objects with finalizers only marked), reports what remains in the
  namespace's status conditions (`NamespaceContentRemaining`,
  `NamespaceFinalizersRemaining`, worded as the real controller words them), looks again
  whenever something in it changes and removes the namespace once it is empty;
- graceful pod deletion: a deleted pod stops after `pod_delete_delay` (or its grace period,
  if shorter; its whole grace period under the `ignore_sigterm` fault), then is removed
  unless finalizers hold it.
- quota controller: a ResourceQuota's `status` (`hard` from its spec, `used` from the
  namespace's objects, as admission counts them) follows the objects it counts and its own
  spec, so a watch on it sees usage change as pods come and go.

Event driven: the store calls `on_event` (under its lock) for every change; that only
schedules work on the shared `Scheduler` thread. Each step re-reads the object and checks its
uid, so steps for objects deleted or re-created meanwhile are dropped. `reconsider()` re-runs
steps blocked by a fault (called when faults or nodes change), e.g. unschedulable pods get
scheduled once the fault is turned off. A failing step is logged by the scheduler and skipped.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import itertools
import logging
import secrets
import threading
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from nodepool_k8s.dev.simulator import admission, errors, scheduler as filters
from nodepool_k8s.dev.simulator.config import DEFAULT_NODE
from nodepool_k8s.dev.simulator.auth import TokenAuthority
from nodepool_k8s.dev.simulator.config import SimulatorConfig
from nodepool_k8s.dev.simulator.faults import FaultInjector
from nodepool_k8s.dev.simulator.resources import by_plural
from nodepool_k8s.dev.simulator.store import (ADDED, DELETED, MODIFIED, Event, Obj, Store,
                                              finalizers, now_rfc3339)
from nodepool_k8s.dev.simulator.timers import Scheduler
from nodepool_k8s.dev.simulator.validation import SA_NAME_ANNOTATION, SA_TOKEN_TYPE

log = logging.getLogger(__name__)

PODS, NAMESPACES, SECRETS, SAS, NODES, QUOTAS = (by_plural(p) for p in (
    "pods", "namespaces", "secrets", "serviceaccounts", "nodes", "resourcequotas"))
SA_UID_ANNOTATION = "kubernetes.io/service-account.uid"
NO_TLS_CA = "# the simulator runs without TLS; there is no CA certificate\n"


# What a pod gets when neither the DELETE nor its spec names a grace period.
DEFAULT_POD_GRACE = 30


def pod_stop_delay(config: SimulatorConfig, faults: FaultInjector, grace: int) -> float:
    """How long the kubelet takes to stop a pod deleted with `grace` seconds."""
    if faults.faults.ignore_sigterm:
        return float(grace)
    return min(float(config.pod_delete_delay), float(grace))


def _grace_of(pod: Obj, grace: Any) -> int:
    if grace is None:
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_POD_GRACE)
    try:
        return max(0, int(grace))
    except (TypeError, ValueError):
        raise errors.bad_request(f"gracePeriodSeconds {grace!r} is not an integer") from None


def delete_pod(store: Store, config: SimulatorConfig, faults: FaultInjector, current: Obj,
               grace: Any) -> Obj:
    """A DELETE of `current` (a pod) with `grace` (None: the pod's own), store lock held.

    The pod gets `deletionTimestamp` and `deletionGracePeriodSeconds`; the controller removes
    it once the kubelet has stopped it (`pod_stop_delay`). A pod already being deleted only
    changes when the new grace period is shorter (as on a real server: the shorter wins).
    Without a stop delay (or with grace 0) it goes at once, unless finalizers hold it."""
    meta = current["metadata"]
    namespace, name, uid = meta.get("namespace"), meta["name"], meta["uid"]
    seconds = _grace_of(current, grace)
    if meta.get("deletionTimestamp") and (
            grace is None or seconds >= int(meta.get("deletionGracePeriodSeconds") or 0)):
        return current
    if seconds == 0 or pod_stop_delay(config, faults, seconds) <= 0:
        return store.delete_or_mark(PODS, namespace, name, uid)[0]

    def mark(draft: Obj) -> None:
        when = datetime.now(timezone.utc) + timedelta(seconds=seconds)
        draft["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
        draft["metadata"]["deletionGracePeriodSeconds"] = seconds
    marked = store.mutate(PODS, namespace, name, mark, uid)
    return marked if marked is not None else current


def _group_resource(resource: str) -> str:
    """How the namespace controller names a resource type ("configmaps.", "roles.rbac...")."""
    return f"{resource}.{by_plural(resource).group}"


def remaining_conditions(remaining: list[tuple[str, Obj]],
                         old: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The status conditions of a Terminating namespace whose `remaining` (resource, object)
    pairs still exist; `old` conditions keep their lastTransitionTime when unchanged."""
    counts: dict[str, int] = {}
    held: dict[str, int] = {}
    for resource, obj in remaining:
        counts[_group_resource(resource)] = counts.get(_group_resource(resource), 0) + 1
        for finalizer in finalizers(obj):
            held[finalizer] = held.get(finalizer, 0) + 1
    content = ", ".join(f"{what} has {n} resource instances" for what, n in sorted(counts.items()))
    by_finalizer = ", ".join(f"{f} in {n} resource instances" for f, n in sorted(held.items()))
    wanted = [
        ("NamespaceDeletionDiscoveryFailure", "False", "ResourcesDiscovered",
         "All resources successfully discovered"),
        ("NamespaceDeletionGroupVersionParsingFailure", "False", "ParsedGroupVersions",
         "All legacy kube types successfully parsed"),
        ("NamespaceDeletionContentFailure", "False", "ContentDeleted",
         "All content successfully deleted, may be waiting on finalization"),
        ("NamespaceContentRemaining", "True", "SomeResourcesRemain",
         f"Some resources are remaining: {content}") if counts else
        ("NamespaceContentRemaining", "False", "ContentRemoved",
         "All content successfully removed"),
        ("NamespaceFinalizersRemaining", "True", "SomeFinalizersRemain",
         f"Some content in the namespace has finalizers remaining: {by_finalizer}") if held else
        ("NamespaceFinalizersRemaining", "False", "ContentHasNoFinalizers",
         "All content-preserving finalizers finished"),
    ]
    before = {c.get("type"): c for c in old if isinstance(c, dict)}
    now = now_rfc3339()
    conditions = []
    for ctype, status, reason, message in wanted:
        previous = before.get(ctype) or {}
        since = previous.get("lastTransitionTime") if previous.get("status") == status else now
        conditions.append({"type": ctype, "status": status, "reason": reason,
                           "message": message, "lastTransitionTime": since or now})
    return conditions


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def node_object(name: str, labels: dict[str, str], index: int,
                kubelet_version: str, taints: list[dict[str, Any]] | None = None,
                allocatable: dict[str, str] | None = None) -> Obj:
    """A Ready node with plenty of capacity (or `allocatable`, merged over the default), as
    the simulator's fake kubelet reports it."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", **labels}
    capacity = {"cpu": "16", "memory": "65536Mi", "pods": "110",
                "ephemeral-storage": "100Gi", **(allocatable or {})}
    now = now_rfc3339()
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {
            "capacity": dict(capacity), "allocatable": dict(capacity),
            "addresses": [{"type": "InternalIP", "address": f"10.0.0.{index + 1}"},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": kubelet_version, "operatingSystem": "linux",
                         "architecture": "amd64", "containerRuntimeVersion": "sim://1.0",
                         "kernelVersion": "sim", "osImage": "nodepool-k8s simulator",
                         "machineID": "", "systemUUID": "", "bootID": "",
                         "kubeProxyVersion": kubelet_version},
        },
    }


def _set_condition(status: dict[str, Any], ctype: str, value: str, reason: str | None = None,
                   message: str | None = None) -> None:
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition.get("type") == ctype:
            if condition.get("status") != value:
                condition["lastTransitionTime"] = now_rfc3339()
            condition["status"] = value
            break
    else:
        condition = {"type": ctype, "status": value, "lastProbeTime": None,
                     "lastTransitionTime": now_rfc3339()}
        conditions.append(condition)
    for field, text in (("reason", reason), ("message", message)):
        if text:
            condition[field] = text
        else:
            condition.pop(field, None)


def _containers(pod: Obj) -> list[dict[str, Any]]:
    return [c for c in (pod.get("spec") or {}).get("containers") or [] if isinstance(c, dict)]


def _waiting_statuses(pod: Obj, reasons: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    """containerStatuses with every container waiting; `reasons` maps name -> (reason, msg)."""
    statuses = []
    for c in _containers(pod):
        reason, message = reasons.get(c["name"], ("ContainerCreating", ""))
        waiting: dict[str, Any] = {"reason": reason}
        if message:
            waiting["message"] = message
        statuses.append({"name": c["name"], "image": c.get("image", ""), "imageID": "",
                         "ready": False, "started": False, "restartCount": 0,
                         "state": {"waiting": waiting}, "lastState": {}})
    return statuses


class Controllers:
    def __init__(self, store: Store, scheduler: Scheduler, faults: FaultInjector,
                 authority: TokenAuthority, config: SimulatorConfig,
                 ca_pem: str | None) -> None:
        self.store = store
        self.scheduler = scheduler
        self.faults = faults
        self.authority = authority
        self.config = config
        self.ca_pem = ca_pem or NO_TLS_CA
        self._ip_lock = threading.Lock()
        self._next_ip = itertools.count(2)
        self._node_turn = itertools.count()
        # Terminating namespaces whose removal the namespace_delete_hang fault held back.
        self._hung: set[tuple[str, str]] = set()
        self._hung_lock = threading.Lock()
        # Terminating namespaces the namespace controller has started on (name -> uid): a
        # change of anything inside has it look again. `_queued`: a look is scheduled.
        self._terminating: dict[str, str] = {}
        self._queued: set[str] = set()
        # Namespaces whose ResourceQuotas' status is to be computed again (coalesced).
        self._quota_queued: set[str] = set()

    def start(self) -> None:
        self.store.subscribe(self.on_event)

    def later(self, delay: float, step: Callable[[], None]) -> None:
        self.scheduler.call_later(delay, step)

    # -- dispatch (runs under the store lock: only schedule here) ----------------------------
    def on_event(self, event: Event) -> None:
        obj, meta = event.obj, event.obj["metadata"]
        ns, name, uid = meta.get("namespace"), meta["name"], meta["uid"]
        if event.resource == "pods" and event.type == ADDED:
            if (obj.get("spec") or {}).get("nodeName"):
                self.later(self.config.start_delay, lambda: self._start_pod(ns, name, uid))
            else:
                self.later(self.config.schedule_delay, lambda: self._schedule_pod(ns, name, uid))
        elif event.resource == "pods" and event.type == MODIFIED:
            old_meta = (event.old or {}).get("metadata", {})
            grace = int(meta.get("deletionGracePeriodSeconds") or 0)
            if meta.get("deletionTimestamp") and grace > 0 and (
                    not old_meta.get("deletionTimestamp")
                    or grace < int(old_meta.get("deletionGracePeriodSeconds") or 0)):
                # Deleted, or its grace period shortened: the kubelet stops it in time.
                self.later(pod_stop_delay(self.config, self.faults, grace),
                           lambda: self._pod_stopped(ns, name, uid, grace))
            if meta.get("deletionTimestamp") and not old_meta.get("deletionTimestamp"):
                if (obj.get("spec") or {}).get("nodeName"):
                    self.later(0, self.reconsider)  # its node's resources free up
        elif event.resource == "pods" and event.type == DELETED:
            if (obj.get("spec") or {}).get("nodeName"):
                self.later(0, self.reconsider)  # its node's resources free up
        elif event.resource == "secrets" and event.type in (ADDED, MODIFIED):
            if self._wants_token(obj):
                self.later(self.config.token_delay, lambda: self._fill_token(ns, name, uid))
        elif event.resource == "serviceaccounts" and event.type == ADDED:
            # Secrets created before their service account get filled once it exists.
            self.later(self.config.token_delay, lambda: self._fill_tokens_for(ns, name))
        elif event.resource == "namespaces" and event.type == ADDED:
            if self.config.namespace_defaults:
                self.later(0, lambda: self._namespace_defaults(name, uid))
        elif event.resource == "namespaces" and event.type == MODIFIED:
            if meta.get("deletionTimestamp") and not (event.old or {}).get(
                    "metadata", {}).get("deletionTimestamp"):
                self.later(self.config.namespace_delete_delay,
                           lambda: self._finalize_namespace(name, uid))
        elif event.resource == "namespaces" and event.type == DELETED:
            self._terminating.pop(name, None)
        elif event.resource == "nodes" and event.type in (ADDED, MODIFIED):
            self.later(0, self.reconsider)
        if ns and (event.resource in admission.USAGE or (
                event.resource == QUOTAS.plural and event.type != DELETED)):
            self._queue_quota_status(ns)  # what a quota counts changed, or its spec
        if ns and event.type in (MODIFIED, DELETED) and ns in self._terminating \
                and ns not in self._queued:
            # Content of a Terminating namespace changed (a finalizer went, a pod stopped).
            self._queued.add(ns)
            self.later(0, functools.partial(self._finalize_namespace, ns,
                                            self._terminating[ns]))

    def _queue_quota_status(self, ns: str) -> None:
        if ns in self._quota_queued:
            return
        if not self.store.list(QUOTAS.plural, ns)[0]:
            return
        self._quota_queued.add(ns)
        self.later(0, functools.partial(self._quota_status, ns))

    def _quota_status(self, ns: str) -> None:
        """Every ResourceQuota of `ns` with `status` from its spec and the objects now (an
        unchanged status is not written, so this settles)."""
        with self.store.lock:
            self._quota_queued.discard(ns)
            objects = {plural: self.store.list(plural, ns)[0] for plural in admission.USAGE}
            for quota in self.store.list(QUOTAS.plural, ns)[0]:
                status = {"hard": dict((quota.get("spec") or {}).get("hard") or {}),
                          "used": admission.quota_used(quota, objects)}

                def refresh(draft: Obj, status: dict[str, Any] = status) -> None:
                    draft["status"] = status
                self.store.mutate(QUOTAS, ns, quota["metadata"]["name"], refresh,
                                  quota["metadata"]["uid"])

    def reconsider(self) -> None:
        """Retry everything a fault may have been holding back (runs on the scheduler)."""
        for pod in self.store.list(PODS.plural)[0]:
            meta, status = pod["metadata"], pod.get("status") or {}
            if meta.get("deletionTimestamp") or status.get("phase") != "Pending":
                continue
            ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
            if not (pod.get("spec") or {}).get("nodeName") and any(
                    c.get("type") == "PodScheduled" and c.get("status") == "False"
                    for c in status.get("conditions") or []):
                self.later(0, functools.partial(self._schedule_pod, ns, name, uid))
            elif self._pull_failures(pod) == {} and any(
                    (s.get("state") or {}).get("waiting", {}).get("reason")
                    in ("ErrImagePull", "ImagePullBackOff")
                    for s in status.get("containerStatuses") or []):
                self.later(0, functools.partial(self._start_pod, ns, name, uid))
        with self._hung_lock:
            hung, self._hung = self._hung, set()
        for name, uid in hung:
            self.later(0, functools.partial(self._finalize_namespace, name, uid))

    # -- pods -------------------------------------------------------------------------------
    def _live_pod(self, ns: str, name: str, uid: str) -> Obj | None:
        pod = self.store.get(PODS.plural, ns, name)
        if pod is None or pod["metadata"]["uid"] != uid or pod["metadata"].get(
                "deletionTimestamp"):
            return None
        return pod

    def _pick_node(self, pod: Obj) -> tuple[str | None, str]:
        """(node name, "") or (None, the scheduler's FitError message)."""
        nodes = self.store.list(NODES.plural)[0]
        total = len(nodes)
        if self.faults.faults.unschedulable:
            return None, (f"0/{total} nodes are available: {total} Insufficient cpu. "
                          f"preemption: 0/{total} nodes are available: {total} No preemption "
                          "victims found for incoming pod.")
        if not nodes:
            return DEFAULT_NODE, ""  # a cluster without Node objects: schedule anywhere
        candidates, why = filters.feasible(pod, nodes, self.store.list(PODS.plural)[0])
        if not candidates:
            return None, why
        best = filters.best(pod, candidates)
        return str(best[next(self._node_turn) % len(best)]["metadata"]["name"]), ""

    def _schedule_pod(self, ns: str, name: str, uid: str) -> None:
        pod = self._live_pod(ns, name, uid)
        if pod is None or (pod.get("spec") or {}).get("nodeName") or (
                pod.get("status") or {}).get("phase") != "Pending":
            return
        node_name, why = self._pick_node(pod)
        if node_name is None:
            def unschedulable(draft: Obj) -> None:
                _set_condition(draft.setdefault("status", {}), "PodScheduled", "False",
                               "Unschedulable", why)
            self.store.mutate(PODS, ns, name, unschedulable, uid)
            return  # reconsider() retries when faults or nodes change

        def bind(draft: Obj) -> None:
            draft.setdefault("spec", {})["nodeName"] = node_name
            status = draft.setdefault("status", {})
            _set_condition(status, "PodScheduled", "True")
            status["containerStatuses"] = _waiting_statuses(draft, {})
        if self.store.mutate(PODS, ns, name, bind, uid) is not None:
            self.later(self.config.start_delay, lambda: self._start_pod(ns, name, uid))

    def _pull_failures(self, pod: Obj) -> dict[str, str]:
        return {c["name"]: c.get("image", "") for c in _containers(pod)
                if self.faults.image_pull_fails(str(c.get("image", "")))}

    def _start_pod(self, ns: str, name: str, uid: str) -> None:
        pod = self._live_pod(ns, name, uid)
        if pod is None or (pod.get("status") or {}).get("phase") != "Pending":
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name:
            return
        failures = self._pull_failures(pod)
        if failures:
            self._image_pull_failed(ns, name, uid, failures)
            return
        node = self.store.get(NODES.plural, None, node_name)
        host_ip = "10.0.0.1"
        if node is not None:
            for address in (node.get("status") or {}).get("addresses") or []:
                if address.get("type") == "InternalIP":
                    host_ip = address["address"]
        pod_ip = self._allocate_ip()
        started = now_rfc3339()

        def run(draft: Obj) -> None:
            status = draft.setdefault("status", {})
            status.update({"phase": "Running", "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
                           "podIP": pod_ip, "podIPs": [{"ip": pod_ip}]})
            status.setdefault("startTime", started)
            for ctype in ("PodReadyToStartContainers", "Initialized", "Ready",
                          "ContainersReady", "PodScheduled"):
                _set_condition(status, ctype, "True")
            status["containerStatuses"] = [self._running_status(c, started)
                                           for c in _containers(draft)]
        self.store.mutate(PODS, ns, name, run, uid)

    @staticmethod
    def _running_status(container: dict[str, Any], started: str) -> dict[str, Any]:
        image = str(container.get("image", ""))
        digest = hashlib.sha256(image.encode()).hexdigest()
        return {"name": container["name"], "image": image,
                "imageID": f"{image.split('@')[0]}@sha256:{digest}",
                "containerID": f"containerd://{secrets.token_hex(32)}",
                "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": started}}, "lastState": {}}

    def _image_pull_failed(self, ns: str, name: str, uid: str, failures: dict[str, str]) -> None:
        def pull_error(draft: Obj) -> None:
            reasons = {cname: ("ErrImagePull",
                               f'failed to pull and unpack image "{image}": failed to resolve '
                               f'reference "{image}": not found (simulated)')
                       for cname, image in failures.items()}
            draft.setdefault("status", {})["containerStatuses"] = _waiting_statuses(
                draft, reasons)
        if self.store.mutate(PODS, ns, name, pull_error, uid) is None:
            return

        def back_off() -> None:
            def set_backoff(draft: Obj) -> None:
                reasons = {cname: ("ImagePullBackOff", f'Back-off pulling image "{image}"')
                           for cname, image in failures.items()}
                draft.setdefault("status", {})["containerStatuses"] = _waiting_statuses(
                    draft, reasons)
            pod = self._live_pod(ns, name, uid)
            if pod is not None and (pod.get("status") or {}).get("phase") == "Pending":
                self.store.mutate(PODS, ns, name, set_backoff, uid)
        self.later(self.config.image_pull_backoff_delay, back_off)

    def _allocate_ip(self) -> str:
        with self._ip_lock:
            n = next(self._next_ip) % (254 * 254)
        return f"10.244.{n // 254}.{n % 254 + 1}"

    def _pod_stopped(self, ns: str, name: str, uid: str, grace: int) -> None:
        """The kubelet stopped a deleted pod: remove it, unless finalizers hold it (then it
        goes when the last one is removed)."""
        with self.store.lock:
            pod = self.store.get(PODS.plural, ns, name)
            if pod is None or pod["metadata"]["uid"] != uid or int(
                    pod["metadata"].get("deletionGracePeriodSeconds") or 0) != grace:
                return  # gone, replaced, or its grace period changed (another step runs)
            if finalizers(pod):
                def stopped(draft: Obj) -> None:
                    draft["metadata"]["deletionGracePeriodSeconds"] = 0
                self.store.mutate(PODS, ns, name, stopped, uid)
                return
            self._remove_any(PODS.plural, ns, name)

    # -- service-account tokens -------------------------------------------------------------
    @staticmethod
    def _wants_token(secret: Obj) -> bool:
        annotations = secret["metadata"].get("annotations") or {}
        return (secret.get("type") == SA_TOKEN_TYPE and bool(annotations.get(SA_NAME_ANNOTATION))
                and not (secret.get("data") or {}).get("token"))

    def _fill_tokens_for(self, ns: str, sa_name: str) -> None:
        for secret in self.store.list(SECRETS.plural, ns)[0]:
            annotations = secret["metadata"].get("annotations") or {}
            if self._wants_token(secret) and annotations.get(SA_NAME_ANNOTATION) == sa_name:
                self._fill_token(ns, secret["metadata"]["name"], secret["metadata"]["uid"])

    def _fill_token(self, ns: str, name: str, uid: str) -> None:
        with self.store.lock:
            secret = self.store.get(SECRETS.plural, ns, name)
            if secret is None or secret["metadata"]["uid"] != uid or not self._wants_token(
                    secret):
                return
            sa_name = secret["metadata"]["annotations"][SA_NAME_ANNOTATION]
            sa = self.store.get(SAS.plural, ns, sa_name)
            if sa is None:
                return  # filled when the service account appears (see on_event)
            sa_uid = sa["metadata"]["uid"]
            token = self.authority.issue_secret_token(ns, sa_name, sa_uid, name, uid)

            def fill(draft: Obj) -> None:
                draft["metadata"].setdefault("annotations", {})[SA_UID_ANNOTATION] = sa_uid
                data = draft.get("data") or {}
                data.update({"token": _b64(token), "ca.crt": _b64(self.ca_pem),
                             "namespace": _b64(ns)})
                draft["data"] = data
            self.store.mutate(SECRETS, ns, name, fill, uid)

    # -- namespaces -------------------------------------------------------------------------
    def _namespace_defaults(self, name: str, uid: str) -> None:
        with self.store.lock:
            ns = self.store.get(NAMESPACES.plural, None, name)
            if ns is None or ns["metadata"]["uid"] != uid or ns["metadata"].get(
                    "deletionTimestamp"):
                return
            for resource, obj in (
                    (SAS, {"metadata": {"name": "default", "namespace": name}}),
                    (by_plural("configmaps"),
                     {"metadata": {"name": "kube-root-ca.crt", "namespace": name},
                      "data": {"ca.crt": self.ca_pem}})):
                try:
                    self.store.create(resource, obj)
                except errors.ApiError:
                    pass  # the user created it first

    def _finalize_namespace(self, name: str, uid: str) -> None:
        with self.store.lock:
            self._queued.discard(name)
        if self.faults.faults.namespace_delete_hang:
            with self._hung_lock:  # stays Terminating; reconsider() retries when faults change
                self._hung.add((name, uid))
            return
        with self.store.lock:
            ns = self.store.get(NAMESPACES.plural, None, name)
            if ns is None or ns["metadata"]["uid"] != uid or not ns["metadata"].get(
                    "deletionTimestamp"):
                return
            self._terminating[name] = uid
            for resource, obj_name in self.store.namespaced_keys(name):
                self._delete_content(resource, name, obj_name)
            remaining = [(resource, obj) for resource, obj_name in
                         self.store.namespaced_keys(name)
                         if (obj := self.store.get(resource, name, obj_name)) is not None]
            if remaining:
                # Kept until the last object goes (on_event brings us back then).
                def report(draft: Obj) -> None:
                    status = draft.setdefault("status", {})
                    status["conditions"] = remaining_conditions(
                        remaining, list(status.get("conditions") or []))
                self.store.mutate(NAMESPACES, None, name, report, uid)
                return
            try:
                self.store.delete_or_mark(NAMESPACES, None, name, uid)
            except errors.ApiError:
                pass

    def _delete_content(self, resource: str, ns: str, name: str) -> None:
        """What the namespace controller's DELETE of one object does (lock held)."""
        obj = self.store.get(resource, ns, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return  # already going
        try:
            if resource == PODS.plural:
                delete_pod(self.store, self.config, self.faults, obj, None)
            else:
                self.store.delete_or_mark(by_plural(resource), ns, name)
        except errors.ApiError:
            pass

    def _remove_any(self, resource: str, ns: str | None, name: str) -> None:
        try:
            self.store.delete(by_plural(resource), ns, name)
        except errors.ApiError:
            pass
