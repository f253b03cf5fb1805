"""Conditions: what happened to a node or a pool, since when, and why.

Owns: the one `Condition` type, carried by node records under the extra key `conditions`
(Zuul ignores keys it does not know) and by the pool status records (`launcher.reporting.
pool_status`); the one update rule for both (a condition's transition time moves when its
status or its reason changes, and only then); the one registry of reason codes (`REASONS`,
each with what an operator should do about it: node progress and failures, request
declines, pool conditions); and the phase timings derived from a node's transition times.
Pure: no I/O, time is passed in.

The two records spell the transition time differently (node records
`last_transition_time`, pool status records `last_transition`): `to_dict`, `parse` and
`serialise` take the key, so each record keeps its format.

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
NODE_TIME_KEY = "last_transition_time"
POOL_TIME_KEY = "last_transition"

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

# The bounded reason values of nodes and requests: reason -> what to do about it.
# Progress reasons first, then failures (`FAILURE_REASONS`) and request declines.
_NODE_REASONS: dict[str, str] = {
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
    # a node's `Drifted` condition, derived by readers (`views.node_detail`), never stored
    "ConfigurationCurrent": "Nothing: the node was built from its label's configuration now.",
    "ConfigurationChanged": "The node was built from an older configuration of its label: "
                            "a spare is replaced within the pool's drift-budget, a node in "
                            "use is deleted as usual once Zuul returns it. Nothing to do.",
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
                    "revoked), even after loading them again (a node's launch, or the "
                    "pool's ApiReachable condition). Not a failed launch: the node "
                    "is aborted and the request waits. Fix the kubeconfig, its exec plugin "
                    "or the service account; the launcher picks that up by itself (or at "
                    "once with a reload, SIGHUP).",
    "QuotaExceeded": "The cluster refused for quota: the pool pauses and retries; raise the "
                     "ResourceQuota or lower max-servers.",
    "LabelQuota": "The pod asks for more than its label is counted for: align the spec's "
                  "requests with the label's cpu/memory.",
    "Invalid": "The API rejected an object as invalid: fix the label (see the message).",
    "InvalidLabel": "The label is not usable as configured: fix the configuration.",
    "PullSecretMissing": "A Secret the label's image-pull-secrets names does not exist (the "
                         "message says which): create it there or fix the label.",
    "PullSecretRefused": "A Secret the label's image-pull-secrets names is not copied: not "
                         "of type kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg, "
                         "or its data is over 64 KiB (the message says which and why).",
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
    "HandedBack": "The pool held the request but could not serve it for hand-back-after "
                  "seconds (its API server unusable, the pool paused or drained, the "
                  "cluster refusing for quota; the message says which) while another pool "
                  "could: released for that pool. Fix the cause if it lasts.",
    "RecentlyFailed": "The pool handed this label back lately (see HandedBack): for "
                      "recently-failed-ttl seconds it leaves the label's requests to other "
                      "pools that can take them.",
    # why a request waits (`waiting_reasons`, and what `request-list` computes)
    "WaitingForQuota": "The pool holds the request until its nodes fit a limit (the message "
                       "names it; see the pool's Quota condition): it goes on when nodes are "
                       "returned; raise the limit if it should not wait.",
    "QueuedInPool": "The pool holds the request behind an earlier one that waits: requests "
                    "are served in order; see why the first one waits.",
    "LaunchBackoff": "A launch was aborted (the message names the reason, e.g. QuotaExceeded "
                     "or Unauthorized): the pool launches again after quota-retry.",
    "PoolPaused": "An operator (`nodepool pause`) or a maintenance window paused the pool: "
                  "`nodepool resume` it, or wait for the window to end.",
    "PoolDraining": "An operator (`nodepool drain`) or a maintenance window drained the "
                    "pool: `nodepool resume` it, or wait for the window to end.",
    "ProviderUnhealthy": "The pool's API server cannot be used (see the pool's ApiReachable "
                         "condition): the pool launches nothing and holds the request "
                         "until it answers again, or hands it to another pool that can "
                         "serve it after hand-back-after.",
    "TenantAtLimit": "The request's tenant uses all of its tenant-resource-limits: it waits "
                     "until the tenant's nodes are returned.",
    "PoolWaiting": "The pool is paused while a request it holds waits for capacity: it "
                   "takes this one once that one goes on (see the pool's Quota condition).",
    "NoPoolServesLabel": "No registered pool serves the label(s) (`nodepool label-list`): "
                         "start a launcher whose configuration serves them, or fix the "
                         "label name in the job.",
}
FAILURE_REASONS = frozenset(list(_NODE_REASONS)[list(_NODE_REASONS).index("ErrImagePull"):])

# The reasons of a pool's conditions (`launcher.reporting.pool_status`; Capacity,
# Credentials and ApiReachable as the provider reports them). `Unknown`, `Unauthorized` and
# `LabelSuspended` above serve pools too.
POOL_REASONS: dict[str, str] = {
    "Valid": "Nothing: every label of the pool can fit.",
    "Disabled": "Off by configuration, not a fault: the pool has max-servers 0 and takes no "
                "requests (Validated), or capacity awareness is off (Capacity, see the "
                "provider's `capacity` key). Nothing to do unless it should be on.",
    "LabelExceedsLimits": "A label never fits even in an empty pool: raise the limits or "
                          "shrink the label.",
    "TargetMet": "Nothing: the spare nodes match min-ready.",
    "UnderTarget": "Fewer spare nodes than min-ready: the launcher builds more; if it stays, "
                   "look at Quota, Capacity and Suspended.",
    "OverTarget": "More spare nodes than min-ready: nothing to do (they are used or age out "
                  "with max-ready-age).",
    "Draining": "The operator (or a maintenance window) drains the pool, or it is disabled: "
                "it accepts nothing and its spare nodes are deleted. Nothing to do; "
                "`nodepool resume` ends an operator's drain.",
    "Paused": "The operator (or a maintenance window) paused the pool: it accepts nothing, "
              "so min-ready is not looked at. Nothing to do; `nodepool resume` ends an "
              "operator's pause.",
    "Under": "Nothing: usage is below every limit.",
    "AtLimit": "A limit binds: requests wait until nodes are returned; raise the limit if it "
               "should not.",
    "Sufficient": "Nothing: the cluster has room for every label.",
    "Constrained": "The cluster has room for some labels only: add capacity or lower the "
                   "labels' requests.",
    "NoneAvailable": "The cluster has room for no label: add capacity.",
    "NoneSuspended": "Nothing: no label is held by the circuit breaker.",
    "NoneDrifted": "Nothing: every spare node was built from its label's configuration now.",
    "SparesDrifted": "Spare nodes were built from an older configuration of their label (the "
                     "message says how many): the launcher replaces them within the pool's "
                     "drift-budget, by itself. Nothing to do unless it stays (then see "
                     "drift-budget's window and max-servers).",
    "Accepted": "Nothing: the API server accepts the launcher's credentials.",
    "Reachable": "Nothing: the API server answers, its certificate is trusted and it accepts "
                 "the launcher's credentials.",
    "Unreachable": "Nobody answers at the API server's address (connection refused or "
                   "reset, a timeout, a name that does not resolve), or the probe gets a "
                   "5xx (a load balancer with nothing behind it): check the API server, "
                   "its load balancer and the network from the launcher. Launches fail "
                   "meanwhile; the condition turns True by itself with the next answer.",
    "TLSUntrusted": "The API server's certificate does not verify against the CA the launcher "
                    "trusts (the cluster CA was rotated, or something else answers): write "
                    "the new CA into the kubeconfig (certificate-authority-data or the CA "
                    "file); the launcher follows a changed CA file by itself, no reload "
                    "needed.",
    "Rejected": "The API server refuses the launcher's credentials (see Unauthorized).",
}

# Reasons of a state the operator chose (a pause, a drain, something switched off): shown
# as neutral, neither healthy nor a fault (the published pool condition's `neutral`).
NEUTRAL_REASONS = frozenset({"Paused", "Draining", "Disabled"})

# The one registry: every reason a condition, an event, a decline or a launch failure
# carries is a key of it.
REASONS: dict[str, str] = {**_NODE_REASONS, **POOL_REASONS}


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

    def to_dict(self, time_key: str = NODE_TIME_KEY,
                message_limit: int | None = None) -> dict[str, Any]:
        message = self.message if message_limit is None else self.message[:message_limit]
        return {"type": self.type, "status": self.status, "reason": self.reason,
                "message": message, time_key: self.last_transition_time}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  time_key: str = NODE_TIME_KEY) -> "Condition":
        t = data.get(time_key)
        return cls(type=str(data.get("type") or ""), status=str(data.get("status") or UNKNOWN),
                   reason=str(data.get("reason") or ""), message=str(data.get("message") or ""),
                   last_transition_time=float(t) if isinstance(t, (int, float)) else None)


def parse(value: Any, time_key: str = NODE_TIME_KEY) -> list[Condition]:
    """The conditions of a record's `conditions` value; odd entries are skipped."""
    if not isinstance(value, list):
        return []
    return [Condition.from_dict(item, time_key) for item in value if isinstance(item, dict)]


def serialise(conditions: Iterable[Condition], time_key: str = NODE_TIME_KEY,
              message_limit: int | None = MESSAGE_LIMIT) -> list[dict[str, Any]]:
    """The JSON of `conditions`; messages cut to `message_limit` characters (None: whole).
    A node record keeps `MESSAGE_LIMIT` of each; a pool's status keeps its messages."""
    return [c.to_dict(time_key, message_limit) for c in conditions]


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    for c in conditions:
        if c.type == type_:
            return c
    return None


def transitioned(old: Condition | None, new: Condition) -> bool:
    """Whether `new` replacing `old` is a transition: the status or the reason changed (a
    new message alone is not). The one rule for node and pool conditions."""
    return old is None or (old.status, old.reason) != (new.status, new.reason)


def update(conditions: Sequence[Condition], new: Condition) -> list[Condition]:
    """`conditions` with `new` set (node conditions in `TYPES` order, others after them in
    their order); the transition time moves only on a transition (`transitioned`)."""
    out: list[Condition] = []
    replaced = False
    for c in conditions:
        if c.type != new.type:
            out.append(c)
            continue
        replaced = True
        when = new.last_transition_time if transitioned(c, new) else c.last_transition_time
        out.append(Condition(new.type, new.status, new.reason, new.message, when))
    if not replaced:
        out.append(new)
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
