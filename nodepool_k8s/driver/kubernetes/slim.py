"""Slim copies: what of a watched object the shared caches keep.

Owns: one function per watched kind (pods, namespaces, nodes, resource quotas) that copies
only the fields the driver reads (`readiness.PodCheck`, `capacity`, the provider's ownership
and deletion checks), and `encoded_size`, which `waiter.ObjectWatch` compares with its
per-object bound. Annotations, managedFields, unread labels, the pod spec beyond the node
name and the containers' requests, a node's image list: none of it is kept. Whoever can
write an object (a job can write pods in its namespace) then decides little about what the
launcher holds: a 100 KB annotation costs nothing past the moment it is decoded.

How it fails: never raises. A field of an unexpected shape is left out (readers treat a
missing field as absent), free texts (messages, reasons) are clipped to `TEXT_CHARS`.
Adding a reader of another field means adding that field here, or it will be missing.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable

from nodepool_k8s.driver.kubernetes import manifests

# A reason or message a reader may put into an error or a condition (they clip to less).
TEXT_CHARS = 1024
# The labels the driver checks on its pods and namespaces (ownership, node, pool, label).
OWNERSHIP_LABELS = (manifests.PROVIDER_LABEL, manifests.INSTALLATION_LABEL,
                    manifests.NODE_ID_LABEL, manifests.POOL_LABEL, manifests.NODE_LABEL_LABEL)

Slim = Callable[[dict[str, Any]], dict[str, Any]]


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _objects(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] \
        if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value)
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS]


def _pick(source: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The scalar fields `keys` of `source`, as clipped texts (bools kept as they are)."""
    out: dict[str, Any] = {}
    for key in keys:
        value = source.get(key)
        if isinstance(value, bool):
            out[key] = value
        else:
            text = _text(value)
            if text is not None:
                out[key] = text
    return out


def _strings(value: Any) -> dict[str, str]:
    """A string-to-string map (labels, quantities), other entries dropped."""
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(value, dict) else {}


def _quantities(value: Any) -> dict[str, Any]:
    """A map of resource name to quantity (a string, or a number as some servers send)."""
    return {k: v for k, v in value.items() if isinstance(k, str)
            and isinstance(v, (str, int, float)) and not isinstance(v, bool)} \
        if isinstance(value, dict) else {}


def _metadata(obj: dict[str, Any], labels: Iterable[str] | None) -> dict[str, Any]:
    """Identity, version and deletion of `obj`; of its labels only `labels` (None: all)."""
    meta = _obj(obj.get("metadata"))
    out = _pick(meta, ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp"))
    found = _strings(meta.get("labels"))
    if labels is not None:
        found = {key: found[key] for key in labels if key in found}
    if found:
        out["labels"] = found
    return out


def _container_status(status: dict[str, Any]) -> dict[str, Any]:
    out = _pick(status, ("name",))
    waiting = _obj(_obj(status.get("state")).get("waiting"))
    if waiting:
        out["state"] = {"waiting": _pick(waiting, ("reason", "message"))}
    return out


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    """Metadata, node name, the containers' requests (capacity), phase, conditions and
    waiting reasons (readiness)."""
    spec, status = _obj(obj.get("spec")), _obj(obj.get("status"))
    slim_spec = _pick(spec, ("nodeName",))
    slim_spec["containers"] = [
        {"resources": {"requests": _quantities(_obj(c.get("resources")).get("requests"))}}
        for c in _objects(spec.get("containers"))]
    slim_status = _pick(status, ("phase", "reason", "message"))
    slim_status["conditions"] = [_pick(c, ("type", "status", "reason", "message"))
                                 for c in _objects(status.get("conditions"))]
    for key in ("initContainerStatuses", "containerStatuses"):
        slim_status[key] = [_container_status(c) for c in _objects(status.get(key))]
    return {"metadata": _metadata(obj, OWNERSHIP_LABELS), "spec": slim_spec,
            "status": slim_status}


def namespace(obj: dict[str, Any]) -> dict[str, Any]:
    """Metadata with the ownership labels (deletion proves ownership from them), phase, and
    the namespace controller's conditions (what still holds a Terminating namespace)."""
    status = _obj(obj.get("status"))
    slim_status = _pick(status, ("phase",))
    conditions = [_pick(c, ("type", "status", "reason", "message"))
                  for c in _objects(status.get("conditions"))]
    if conditions:
        slim_status["conditions"] = conditions
    return {"metadata": _metadata(obj, OWNERSHIP_LABELS), "status": slim_status}


def node(obj: dict[str, Any]) -> dict[str, Any]:
    """What kube-scheduler's filters and the room arithmetic read: all labels (selectors and
    affinity match any of them), cordon, taints, Ready, allocatable."""
    spec, status = _obj(obj.get("spec")), _obj(obj.get("status"))
    slim_spec = _pick(spec, ("unschedulable",))
    slim_spec["taints"] = [_pick(t, ("key", "value", "effect"))
                           for t in _objects(spec.get("taints"))]
    return {"metadata": _metadata(obj, None), "spec": slim_spec,
            "status": {"conditions": [_pick(c, ("type", "status"))
                                      for c in _objects(status.get("conditions"))],
                       "allocatable": _quantities(status.get("allocatable"))}}


def resource_quota(obj: dict[str, Any]) -> dict[str, Any]:
    """The quota's hard limits and what is used of them."""
    spec, status = _obj(obj.get("spec")), _obj(obj.get("status"))
    return {"metadata": _metadata(obj, ()), "spec": {"hard": _quantities(spec.get("hard"))},
            "status": {"hard": _quantities(status.get("hard")),
                       "used": _quantities(status.get("used"))}}


def encoded_size(obj: dict[str, Any]) -> int:
    """Bytes of `obj` as compact JSON: the measure of a copy's size."""
    return len(json.dumps(obj, separators=(",", ":"), default=str))
