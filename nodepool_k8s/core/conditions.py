"""Node lifecycle conditions: what happened to a node, when, and why it failed.

Owns: the condition types a node record carries under the extra key `conditions` (Zuul
ignores keys it does not know), the bounded set of machine-readable reasons (`REASONS`,
each with what an operator should do about it), the update rules (a condition's
`last_transition_time` changes only when its status changes) and the phase timings derived
from the transition times. Pure: no I/O, time is passed in.

A launch walks `Launched` (the cloud resource exists; its external id is recorded),
`Registered` (access in place: service account, role, binding, token), `Initialized` (the
workload runs: pod scheduled, image pulled, running; on which Kubernetes node) and `Ready`
(handed to Zuul). A failure sets the first condition that is not yet True to False with the
cause. Deletion adds `Deleting` (and `Deleted` in the event log, the record being gone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

KEY = "conditions"

LAUNCHED = "Launched"
REGISTERED = "Registered"
INITIALIZED = "Initialized"
READY = "Ready"
DELETING = "Deleting"
DELETED = "Deleted"
LAUNCH_TYPES = (LAUNCHED, REGISTERED, INITIALIZED, READY)
TYPES = LAUNCH_TYPES + (DELETING, DELETED)

TRUE = "True"
FALSE = "False"
UNKNOWN = "Unknown"

MESSAGE_LIMIT = 400  # characters of a condition message kept on the record

# The bounded reason values: reason -> what to do about it. Progress reasons first.
REASONS: dict[str, str] = {
    # progress (True / Unknown conditions)
    "Pending": "Nothing: the phase has not started yet.",
    "Retrying": "Nothing: an earlier attempt failed (see the message); a fresh one runs.",
    "NamespaceCreated": "Nothing: the namespace exists.",
    "ResourceCreated": "Nothing: the cloud resource exists.",
    "AccessGranted": "Nothing: service account, role, binding and token are in place.",
    "PodRunning": "Nothing: the pod is scheduled, its image pulled and it runs.",
    "NoWorkload": "Nothing: a namespace label has no pod to wait for.",
    "HandedToZuul": "Nothing: the node is ready for (or in use by) Zuul.",
    "DeletionStarted": "Nothing: the launcher deletes the node's resources.",
    "ResourceDeleted": "Nothing: the resources are gone and the record removed.",
    # failures (False conditions), from the pod
    "ErrImagePull": "Check the image name and tag in the label and the registry's "
                    "reachability and credentials (imagePullSecrets).",
    "ImagePullBackOff": "As ErrImagePull: the kubelet gave up pulling the image for now.",
    "InvalidImageName": "Fix the label's image reference.",
    "ErrImageNeverPull": "The pod's imagePullPolicy is Never and the image is not on the "
                         "node: change the policy or pre-load the image.",
    "CreateContainerConfigError": "A referenced ConfigMap/Secret is missing: fix the spec.",
    "CreateContainerError": "The container runtime refused the container: see the message.",
    "Unschedulable": "No Kubernetes node fits the pod (see the scheduler's message): add "
                     "capacity, fix node selectors/tolerations, or lower the requests.",
    "PodFailed": "The pod exited: its command must keep running (see the message).",
    "PodDeleted": "Someone deleted the pod while it started: check admission/cleanup tools.",
    "BootTimeout": "The node was not usable within boot-timeout: look at the Initialized "
                   "message and `kubectl describe`; raise boot-timeout if pulls are slow.",
    # failures from the API
    "Forbidden": "The launcher's service account lacks a permission: apply "
                 "etc/kubernetes/launcher-rbac.yaml.",
    "Unauthorized": "The API server refuses the launcher's own credentials (expired, rotated, "
                    "revoked), even after loading them again. Not a failed launch: the node "
                    "is aborted and the request waits. Fix the kubeconfig, its exec plugin "
                    "or the service account; the launcher picks that up by itself (or at "
                    "once with a reload, SIGHUP).",
    "QuotaExceeded": "The cluster refused for quota: the pool pauses and retries; raise the "
                     "ResourceQuota or lower max-servers.",
    "LabelQuota": "The pod asks for more than its label is counted for: align the spec's "
                  "requests with the label's cpu/memory.",
    "Invalid": "The API rejected an object as invalid: fix the label (see the message).",
    "InvalidLabel": "The label is not usable as configured: fix the configuration.",
    "NamespaceExists": "Namespace names kept colliding: remove the stale namespaces.",
    "NotFound": "An object vanished during the launch: check for other cleanup tools.",
    "Conflict": "An object was changed during the launch: check for other controllers.",
    "BadCA": "The cluster CA bundle the launcher trusts is too large to put in node "
             "records (over 128 KiB): trim the kubeconfig's certificate-authority-data.",
    "BadToken": "The TokenRequest answer had no usable token (none, or over 64 KiB): "
                "check the API server.",
    "ApiError": "The API kept failing past api-retries (5xx, timeouts): check the API server "
                "and the network; the launch is retried.",
    "NotOwned": "The resource is not provably this installation's: it was left alone; "
                "inspect it by hand.",
    "DeleteFailed": "Deletion could not be confirmed yet: it is retried with backoff.",
    "DeletionStuck": "The namespace stayed Terminating past terminating-grace (a finalizer "
                     "or a long pod grace period holds it): the launcher removes the "
                     "finalizers left in it and bounds its pods' grace period; its WARNING "
                     "names each object. Nothing to do unless it stays (then see the log).",
    "Cancelled": "The launcher stopped or lost its ZooKeeper session: nothing to do.",
    # other drivers and the engine
    "FakeFail": "A fake label configured to fail (tests).",
    "Injected": "An injected failure (tests).",
    "LaunchFailed": "The driver reported a failure: see the message.",
    "Unknown": "An unexpected error: see the message and the launcher's log.",
    # request declines (`declined_reasons`)
    "PoolDisabled": "The pool has max-servers 0: nothing to do unless it should serve.",
    "LabelNotServed": "The pool does not serve every requested label: another pool must.",
    "ExceedsQuota": "The request can never fit the pool's limits: raise them or split it.",
    "NotConfigured": "The pool was removed from the configuration.",
    "AtQuota": "A min-ready request met the pool at quota: nothing to do.",
    "LabelSuspended": "The circuit breaker holds the label after repeated failed launches "
                      "(see the pool's Suspended condition): fix the cause; it probes again "
                      "by itself.",
}
FAILURE_REASONS = frozenset(list(REASONS)[list(REASONS).index("ErrImagePull"):])


def reason(value: str | None) -> str:
    """`value` if it is one of the documented reasons, else `Unknown` (bounded values)."""
    return value if value in REASONS else "Unknown"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "status": self.status, "reason": self.reason,
                "message": self.message, "last_transition_time": self.last_transition_time}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Condition":
        t = data.get("last_transition_time")
        return cls(type=str(data.get("type") or ""), status=str(data.get("status") or UNKNOWN),
                   reason=str(data.get("reason") or ""), message=str(data.get("message") or ""),
                   last_transition_time=float(t) if isinstance(t, (int, float)) else None)


def parse(value: Any) -> list[Condition]:
    """The conditions of a record's `conditions` value; odd entries are skipped."""
    if not isinstance(value, list):
        return []
    return [Condition.from_dict(item) for item in value if isinstance(item, dict)]


def serialise(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in conditions]


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    for c in conditions:
        if c.type == type_:
            return c
    return None


def update(conditions: Sequence[Condition], new: Condition) -> list[Condition]:
    """`conditions` with `new` set; the transition time only moves when the status does."""
    message = new.message[:MESSAGE_LIMIT]
    out: list[Condition] = []
    replaced = False
    for c in conditions:
        if c.type != new.type:
            out.append(c)
            continue
        replaced = True
        when = c.last_transition_time if c.status == new.status else new.last_transition_time
        out.append(Condition(new.type, new.status, new.reason, message, when))
    if not replaced:
        out.append(Condition(new.type, new.status, new.reason, message,
                             new.last_transition_time))
    order = {t: i for i, t in enumerate(TYPES)}
    return sorted(out, key=lambda c: order.get(c.type, len(order)))


def initial(now: float) -> list[Condition]:
    """A new node: every launch condition Unknown/Pending."""
    return [Condition(t, UNKNOWN, "Pending", "", now) for t in LAUNCH_TYPES]


def restart(conditions: Sequence[Condition], now: float, why: str) -> list[Condition]:
    """A new launch attempt: every launch condition back to Unknown (earlier failure noted)."""
    out = list(conditions)
    for t in LAUNCH_TYPES:
        out = update(out, Condition(t, UNKNOWN, "Retrying", why, now))
    return out


def fail(conditions: Sequence[Condition], why: str, message: str,
         now: float) -> list[Condition]:
    """Set the first launch condition that is not True to False with reason `why`."""
    for t in LAUNCH_TYPES:
        current = find(conditions, t)
        if current is None or current.status != TRUE:
            return update(conditions, Condition(t, FALSE, reason(why), message, now))
    return list(conditions)


def failure(conditions: Sequence[Condition]) -> Condition | None:
    """The False condition that explains a failure (the last one set), if any."""
    false = [c for c in conditions if c.status == FALSE]
    return max(false, key=lambda c: c.last_transition_time or 0.0) if false else None


# Phase name -> (start condition or None for created_time, end condition).
PHASES: tuple[tuple[str, str | None, str], ...] = (
    ("launch", None, LAUNCHED),
    ("register", LAUNCHED, REGISTERED),
    ("initialize", REGISTERED, INITIALIZED),
    ("ready", INITIALIZED, READY),
    ("total", None, READY),
    ("deletion", DELETING, DELETED),
)


def timings(conditions: Sequence[Condition], created_time: float | None) -> dict[str, float]:
    """Seconds per phase, from True transition times (phases not completed are left out)."""
    times = {c.type: c.last_transition_time for c in conditions
             if c.status == TRUE and c.last_transition_time is not None}
    out: dict[str, float] = {}
    for name, start, end in PHASES:
        begin = created_time if start is None else times.get(start)
        finish = times.get(end)
        if begin is not None and finish is not None:
            out[name] = max(0.0, finish - begin)
    return out
