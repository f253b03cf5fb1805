"""Capacity awareness (the provider's `capacity` key; off by default): what the cluster has
room for, per label, read from shared watches (never polled per request).

Owns: `CapacityTracker`, which keeps
- with `nodes: true`, a watch on Node objects and one on every pod of the cluster (needs
  list/watch on nodes and on pods in all namespaces), and computes per label the allocatable
  cpu/memory/gpu of the schedulable nodes the label's pod could run on (its `nodeSelector`,
  required node affinity and tolerations, matched here like kube-scheduler's filters) minus
  the requests of the pods bound to them. Namespace labels use every schedulable node.
- with `resource-quota: <namespace>/<name>`, a watch on that ResourceQuota: its `hard` is
  the launcher's share and its `used` what others already take of it (our nodes live in
  their own namespaces, so they never count in it).

The pod watch keeps the pods that hold node resources (`occupies`: bound, not finished, not
being deleted), whoever made them, as slim copies (`slim.pod`: node name, requests, phase;
never annotations), at most `waiter.MAX_OBJECTS`; pending pods are not kept.
"Our own" pods are only the ones the provider created (its `ours` predicate: the pod of a
pod node, by name and namespace), never a pod a job made with our labels.

`limits(label)` turns this into the core's quota terms (`cores`, `ram` in MiB, the gpu
resource, `instances`): the free room on nodes where at least one more pod of the label
fits plus what our own bound pods already request, so the core's check "our usage + need
<= limit" is "need fits in what is free" (launches not yet bound count conservatively).
When no node can take one more pod of the label, `instances` is 0: the core pauses (quota
scope `cloud`) instead of launching a pod that would sit Unschedulable. Until the watches
have listed once the nodes part is unlimited. `condition(labels)` is the pool's
`Capacity` condition: Sufficient, Constrained (some labels fit, some do not) or
NoneAvailable.

How it fails: a broken watch restarts with back-off (see `waiter.ObjectWatch`) and keeps
its last cache meanwhile; a change listener that raises is logged, never propagated.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.model import PoolLabel
from nodepool_k8s.driver.kubernetes import manifests, slim
from nodepool_k8s.driver.kubernetes.client import KubeClient
from nodepool_k8s.driver.kubernetes.waiter import ObjectWatch
from nodepool_k8s.core.model import Resources
from nodepool_k8s.core.pool_records import CapacityCondition
from nodepool_k8s.core.quota import tightest

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]
SUFFIXES = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
            "E": 1e18, "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40,
            "Pi": 2.0 ** 50, "Ei": 2.0 ** 60}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([a-zA-Z]*)$")
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# Coalesces bursts of watch events into one wake of the pool workers.
NOTIFY_COALESCE = 0.1

SUFFICIENT, CONSTRAINED, NONE_AVAILABLE = "Sufficient", "Constrained", "NoneAvailable"


def parse_quantity(value: Any) -> float | None:
    """A Kubernetes quantity ("500m", "4Gi", 2) as a float; None when malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in SUFFIXES:
        return None
    try:
        return float(match.group(1)) * SUFFIXES[match.group(2)]
    except ValueError:
        return None


# -- kube-scheduler's filters, on plain objects ------------------------------------------------

def tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def _requirement(expression: Obj, labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key")), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present, value = key in labels, labels.get(key)
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, limit = int(str(value)), int(values[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def node_schedulable(node: Obj) -> bool:
    """Not cordoned and not reported NotReady."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


def node_matches(spec: Obj, node: Obj) -> bool:
    """Whether a pod with `spec` passes the taint, selector and required affinity filters."""
    tolerations = list(spec.get("tolerations") or [])
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") \
                and not any(tolerates(t, taint) for t in tolerations):
            return False
    labels = (node.get("metadata") or {}).get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(
        bool(t.get("matchExpressions"))
        and all(_requirement(e, labels) for e in t.get("matchExpressions") or [])
        for t in terms)


def pod_requests(spec: Obj) -> dict[str, float]:
    total: dict[str, float] = {}
    for container in spec.get("containers") or []:
        for key, value in ((container.get("resources") or {}).get("requests") or {}).items():
            amount = parse_quantity(value)
            if amount is not None:
                total[str(key)] = total.get(str(key), 0.0) + amount
    return total


def occupies(pod: Obj) -> bool:
    """Bound to a node, not finished, not being deleted: its requests hold that node."""
    return bool((pod.get("spec") or {}).get("nodeName")) \
        and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") \
        and not (pod.get("metadata") or {}).get("deletionTimestamp")


def as_quota(amounts: Mapping[str, float]) -> dict[str, float]:
    """Kubernetes resource names to the core's quota keys (cores, ram in MiB, ...)."""
    out: dict[str, float] = {}
    for key, value in amounts.items():
        if key == "cpu":
            out["cores"] = value
        elif key == "memory":
            out["ram"] = value / 2.0 ** 20
        elif key == "ephemeral-storage":
            out["ephemeral-storage"] = value / 1e6
        elif key != "pods":
            out[key] = value
    return out


def _round(value: float) -> float | int | None:
    if math.isinf(value):
        return None
    return int(value) if float(value).is_integer() else round(value, 3)


@dataclass
class LabelRoom:
    """What the cluster has for one label right now."""

    matching: int = 0          # schedulable nodes the label's pod may run on
    fits: float = 0            # how many more pods of the label fit (inf: no requests)
    free: dict[str, float] = field(default_factory=dict)  # on nodes where one more fits

    def public(self) -> dict[str, Any]:
        return {"matching_nodes": self.matching, "fits": _round(self.fits),
                "free": {k: _round(v) for k, v in sorted(as_quota(self.free).items())}}


def quota_limits(quota: Obj | None, subtract_used: bool) -> Resources:
    """A ResourceQuota's hard (minus used) in the core's quota keys (unlimited if none)."""
    if quota is None:
        return Resources.limits()
    status = quota.get("status") or {}
    hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
    used = status.get("used") or {} if subtract_used else {}
    values: dict[str, float] = {}
    for key, text in hard.items():
        amount = parse_quantity(text)
        if amount is None:
            continue
        amount -= parse_quantity(used.get(key, 0)) or 0.0
        name = str(key)[len("requests."):] if str(key).startswith("requests.") else str(key)
        if name == "pods":
            values["instances"] = amount
        elif name in ("cpu", "memory") or "/" in name:
            values.update(as_quota({name: amount}))
    return Resources.limits({k: max(0.0, v) for k, v in values.items()})


class CapacityTracker:
    """The capacity watches of one provider and the arithmetic over them."""

    def __init__(self, client: KubeClient, clock: Clock, *, nodes: bool,
                 resource_quota: str | None, ours: Callable[[Obj], bool],
                 watch_timeout: int = 300, tick: float | None = None) -> None:
        self._ours = ours
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._pending = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.watches: dict[str, ObjectWatch] = {}
        common: dict[str, Any] = {"watch_timeout": watch_timeout, "tick": tick}
        if nodes:
            self.watches["nodes"] = ObjectWatch("nodes", client, client.core.list_node, "",
                                                clock, on_change=self._node_changed,
                                                slim=slim.node, **common)
            # Every pod bound to a node holds its resources, whoever made it: those are kept,
            # as slim copies (what `occupies`, `pod_requests` and `ours` read), never whole.
            # Pending, finished and deleting pods hold nothing and are not kept, so the
            # cache is as large as what the nodes run, not as what anyone has created.
            self.watches["all-pods"] = ObjectWatch(
                "all-pods", client, client.core.list_pod_for_all_namespaces, "", clock,
                on_change=self._pod_changed, slim=slim.pod, keep=occupies, **common)
        self._quota_name: tuple[str, str] | None = None
        if resource_quota:
            namespace, _, name = resource_quota.partition("/")
            self._quota_name = (namespace, name)
            self.watches["resourcequota"] = ObjectWatch(
                "resourcequota", client,
                functools.partial(client.core.list_namespaced_resource_quota, namespace),
                "", clock, on_change=self._node_changed, slim=slim.resource_quota, **common)

    # -- lifecycle and change notification ---------------------------------------------------

    def start(self) -> None:
        for watch in self.watches.values():
            watch.start()
        self._thread = threading.Thread(target=self._notify_loop, name="k8s-capacity",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._pending.set()
        for watch in self.watches.values():
            watch.stop()
        if self._thread is not None:
            self._thread.join(5.0)

    @property
    def synced(self) -> bool:
        return all(w.synced for w in self.watches.values())

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def _node_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._pending.set()

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        # Only a pod that holds (or held) a node's resources changes what is free.
        if (old is None and new is None) or any(
                p is not None and (p.get("spec") or {}).get("nodeName") for p in (old, new)):
            self._pending.set()

    def _notify_loop(self) -> None:
        while not self._stopped.is_set():
            self._pending.wait()
            if self._stopped.is_set():
                return
            self._stopped.wait(NOTIFY_COALESCE)
            self._pending.clear()
            with self._lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener()
                except Exception:  # noqa: BLE001 - a listener must not stop notifications
                    log.exception("capacity listener failed")

    # -- arithmetic ----------------------------------------------------------------------------

    def _quota(self) -> Obj | None:
        watch = self.watches.get("resourcequota")
        if watch is None or self._quota_name is None:
            return None
        return watch.get(*self._quota_name)

    def _nodes_known(self) -> bool:
        return "nodes" in self.watches and self.watches["nodes"].synced \
            and self.watches["all-pods"].synced

    def room(self, label: PoolLabel) -> LabelRoom | None:
        """What the nodes have for `label` (None: nodes not watched or not listed yet)."""
        if not self._nodes_known():
            return None
        spec = manifests.pod_spec(label) if label.type == "pod" else {}
        need = pod_requests(spec)
        used: dict[str, dict[str, float]] = {}
        for pod in self.watches["all-pods"].objects():
            if occupies(pod):
                per_node = used.setdefault(str(pod["spec"]["nodeName"]), {})
                for key, amount in pod_requests(pod.get("spec") or {}).items():
                    per_node[key] = per_node.get(key, 0.0) + amount
        room = LabelRoom()
        for node in self.watches["nodes"].objects():
            if not node_schedulable(node) or (label.type == "pod"
                                              and not node_matches(spec, node)):
                continue
            room.matching += 1
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            taken = used.get(str((node.get("metadata") or {}).get("name")), {})
            free: dict[str, float] = {}
            for key, text in allocatable.items():
                have = parse_quantity(text)
                if have is not None:
                    free[str(key)] = max(0.0, have - taken.get(str(key), 0.0))
            counts = [math.floor(free[k] / v) for k, v in need.items()
                      if v > 0 and k in free]
            fits = min(counts) if counts else math.inf
            if label.type == "namespace":
                fits = math.inf
            if fits < 1:
                continue
            room.fits += fits
            for key, amount in free.items():
                room.free[key] = room.free.get(key, 0.0) + amount
        return room

    def _ours_bound(self) -> dict[str, float]:
        total: dict[str, float] = {}
        for pod in self.watches["all-pods"].objects():
            if occupies(pod) and self._ours(pod):
                for key, amount in pod_requests(pod.get("spec") or {}).items():
                    total[key] = total.get(key, 0.0) + amount
        return as_quota(total)

    def limits(self, label: PoolLabel | None = None) -> Resources:
        """Without a label: the hard ceiling (the ResourceQuota's `hard`), for "never fits".
        With one: what fits now for nodes of that label (see the module docstring)."""
        if label is None:
            return quota_limits(self._quota(), subtract_used=False)
        limit = quota_limits(self._quota(), subtract_used=True)
        room = self.room(label)
        if room is None:
            return limit
        if room.fits < 1:
            return tightest([limit, Resources.limits({"instances": 0})])
        ours = self._ours_bound()
        free = as_quota(room.free)
        keys = [k for k in label.quota() if k != "instances"]
        nodes = Resources.limits({k: free.get(k, 0.0) + ours.get(k, 0.0)
                                  for k in keys if k in free})
        return tightest([limit, nodes])

    def condition(self, labels: Iterable[PoolLabel]) -> CapacityCondition:
        """The pool's `Capacity` condition over its labels, with per-label detail."""
        labels = sorted(labels, key=lambda lb: lb.name)
        if not self.synced:
            return {"status": "Unknown", "reason": "Unknown",
                    "message": "the capacity watches have not listed yet"}
        detail: dict[str, Any] = {}
        short: list[str] = []
        ok: list[str] = []
        quota = quota_limits(self._quota(), subtract_used=True)
        for label in labels:
            room = self.room(label)
            entry: dict[str, Any] = room.public() if room is not None else {}
            fits = room is None or room.fits >= 1
            over = label.quota().exceeded_keys(quota)
            if over:
                fits = False
                entry["quota_short"] = over
            entry["available"] = fits
            detail[label.name] = entry
            (ok if fits else short).append(label.name)
        if not short:
            status, reason = "True", SUFFICIENT
            message = "room for every label" if labels else "no labels"
        else:
            status = "False"
            reason = NONE_AVAILABLE if not ok else CONSTRAINED
            message = "no room for " + ", ".join(
                f"{n} ({_describe(detail[n])})" for n in short)
        return {"status": status, "reason": reason, "message": message, "labels": detail}


def _describe(entry: Mapping[str, Any]) -> str:
    if entry.get("quota_short"):
        return "ResourceQuota short of " + ", ".join(entry["quota_short"])
    if not entry.get("matching_nodes"):
        return "no schedulable node matches"
    return f"{entry['matching_nodes']} matching node(s) full"
