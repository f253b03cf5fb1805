"""The simulated kube-scheduler's filters: which nodes a pod may run on, and why not.

Owns: the per-node feasibility checks the default scheduler profile runs, in its order
(NodeUnschedulable, TaintToleration, NodeAffinity: `nodeSelector` plus required node
affinity with In/NotIn/Exists/DoesNotExist/Gt/Lt), the preferred node affinity score that
picks among feasible nodes, and the FitError text the real scheduler puts into a pod's
PodScheduled=False condition ("0/3 nodes are available: 1 node(s) had untolerated taint
{gpu: true}, 2 node(s) didn't match Pod's node affinity/selector. preemption: ...").

Pure functions over plain objects (the store's dicts); the controllers call `feasible` and
`best` and bind the pod. Resources (requests versus allocatable) are not filtered here.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

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


def feasible(pod: Obj, nodes: Iterable[Obj]) -> tuple[list[Obj], str]:
    """(nodes the pod fits, the FitError message when there are none)."""
    nodes = list(nodes)
    fits: list[Obj] = []
    reasons: dict[str, int] = {}
    for node in nodes:
        reason = why_not(pod, node)
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
