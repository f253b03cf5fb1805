"""The simulated kube-scheduler's filters: which nodes a pod may run on, and why not.

Owns: the per-node feasibility checks the default scheduler profile runs, in its order
(NodeUnschedulable, TaintToleration, NodeAffinity: `nodeSelector` plus required node
affinity with In/NotIn/Exists/DoesNotExist/Gt/Lt), the preferred node affinity score that
picks among feasible nodes, the NodeResourcesFit filter (requests of the pod plus those of
the pods already bound to a node must stay within its `status.allocatable`: "Insufficient
cpu"), and the FitError text the real scheduler puts into a pod's
PodScheduled=False condition ("0/3 nodes are available: 1 node(s) had untolerated taint
{gpu: true}, 2 node(s) didn't match Pod's node affinity/selector. preemption: ...").

Pure functions over plain objects (the store's dicts); the controllers call `feasible` and
`best` and bind the pod.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Iterable, Mapping

from nodepool_k8s.dev.simulator.validation import parse_quantity

Obj = Mapping[str, Any]

UNSCHEDULABLE = "node(s) were unschedulable"
NO_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
FILTERED_EFFECTS = ("NoSchedule", "NoExecute")


def _spec(obj: Obj) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ToleratesTaint: effect (empty = all), key (empty + Exists = all), value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or ""))
    return False


def untolerated_taint(tolerations: Iterable[Mapping[str, Any]],
                      taints: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration tolerates, or None."""
    tolerations = list(tolerations)
    for taint in taints:
        if taint.get("effect") not in FILTERED_EFFECTS:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _integer(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def requirement_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present, value = key in labels, labels.get(str(key))
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        have, limit = _integer(value), _integer(values[0])
        if have is None or limit is None:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def term_matches(term: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    # An empty term matches nothing (as in Kubernetes); matchFields are not simulated.
    return bool(expressions) and all(requirement_matches(e, labels) for e in expressions)


def affinity_matches(pod: Obj, node: Obj) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    spec = _spec(pod)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(term_matches(term, labels) for term in terms)


def why_not(pod: Obj, node: Obj) -> str | None:
    """The first failing filter's reason for this node, or None when the pod fits."""
    spec, node_spec = _spec(pod), _spec(node)
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not any(
            tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
            for t in tolerations):
        return UNSCHEDULABLE
    taint = untolerated_taint(tolerations, node_spec.get("taints") or [])
    if taint is not None:
        return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    if not affinity_matches(pod, node):
        return NO_AFFINITY
    return None


def pod_requests(pod: Obj) -> dict[str, Decimal]:
    """The summed container requests of a pod (init containers are not simulated)."""
    total: dict[str, Decimal] = {}
    for container in _spec(pod).get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        for key, value in requests.items():
            amount = parse_quantity(value)
            if amount is not None:
                total[str(key)] = total.get(str(key), Decimal(0)) + amount
    return total


def occupies(pod: Obj) -> bool:
    """Whether a pod holds its node's resources (bound, not finished, not deleted)."""
    return bool(_spec(pod).get("nodeName")) \
        and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed") \
        and not (pod.get("metadata") or {}).get("deletionTimestamp")


def insufficient(pod: Obj, node: Obj, bound: Iterable[Obj]) -> str | None:
    """NodeResourcesFit: the first resource the pod's requests do not fit in (None: fits).

    A node without `status.allocatable` for a resource is not limited in it."""
    need = pod_requests(pod)
    if not need:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    used: dict[str, Decimal] = {}
    for other in bound:
        for key, amount in pod_requests(other).items():
            used[key] = used.get(key, Decimal(0)) + amount
    for key in sorted(need):
        if key not in allocatable:
            continue
        have = parse_quantity(allocatable[key])
        if have is not None and used.get(key, Decimal(0)) + need[key] > have:
            return f"Insufficient {key}"
    return None


def feasible(pod: Obj, nodes: Iterable[Obj],
             pods: Iterable[Obj] = ()) -> tuple[list[Obj], str]:
    """(nodes the pod fits, the FitError message when there are none). `pods`: every pod
    in the cluster (those bound to a node use its allocatable)."""
    nodes = list(nodes)
    by_node: dict[str, list[Obj]] = {}
    for other in pods:
        if occupies(other):
            by_node.setdefault(str(_spec(other)["nodeName"]), []).append(other)
    fits: list[Obj] = []
    reasons: dict[str, int] = {}
    for node in nodes:
        reason = why_not(pod, node)
        if reason is None:
            name = str((node.get("metadata") or {}).get("name") or "")
            reason = insufficient(pod, node, by_node.get(name, ()))
        if reason is None:
            fits.append(node)
        else:
            reasons[reason] = reasons.get(reason, 0) + 1
    if fits:
        return fits, ""
    total = len(nodes)
    shown = ", ".join(sorted(f"{count} {reason}" for reason, count in reasons.items()))
    return [], (f"0/{total} nodes are available: {shown}. preemption: 0/{total} nodes are"
                f" available: {total} Preemption is not helpful for scheduling.")


def preference(pod: Obj, node: Obj) -> int:
    """The summed weights of the preferred node affinity terms the node matches."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    preferred = (((_spec(pod).get("affinity") or {}).get("nodeAffinity") or {})
                 .get("preferredDuringSchedulingIgnoredDuringExecution") or [])
    return sum(int(p.get("weight") or 0) for p in preferred
               if term_matches(p.get("preference") or {}, labels))


def best(pod: Obj, nodes: list[Obj]) -> list[Obj]:
    """The feasible nodes with the highest preference score (ties: the caller rotates)."""
    if not nodes:
        return []
    scores = [preference(pod, node) for node in nodes]
    top = max(scores)
    return [node for node, score in zip(nodes, scores) if score == top]
