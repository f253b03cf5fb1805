"""Server-side printing: `meta.k8s.io/v1 Table` answers for `Accept: ...;as=Table`.

Owns: the columns kubectl shows for each served resource (NAME, STATUS, AGE, ...; `-o wide`
columns have priority 1) and turning objects into Table rows. kubectl asks for Tables on
`get`; without them it would fall back to printing only NAME and AGE.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

from nodepool_k8s.dev.simulator.resources import ResourceType

Obj = dict[str, Any]
Column = tuple[str, str, int, Callable[[Obj], Any]]  # name, type, priority, cell


def human_age(obj: Obj) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    seconds = max(0, int((datetime.now(timezone.utc) - then).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _pod_status(pod: Obj) -> str:
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating"):
            return str(waiting["reason"])
    phase = status.get("phase") or "Pending"
    if phase == "Pending" and (pod.get("spec") or {}).get("nodeName"):
        return "ContainerCreating"
    return str(phase)


def _pod_ready(pod: Obj) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _node_status(node: Obj) -> str:
    ready = "Unknown"
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            ready = "Ready" if condition.get("status") == "True" else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        ready += ",SchedulingDisabled"
    return ready


def _node_ip(node: Obj, kind: str) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == kind:
            return str(address.get("address"))
    return "<none>"


def _subjects(binding: Obj, kind: str) -> str:
    names = [(f"{s.get('namespace')}/{s['name']}" if kind == "ServiceAccount" else s["name"])
             for s in binding.get("subjects") or [] if s.get("kind") == kind]
    return ", ".join(names)


_AGE: Column = ("Age", "string", 0, human_age)
_COLUMNS: dict[str, list[Column]] = {
    "namespaces": [("Status", "string", 0,
                    lambda o: (o.get("status") or {}).get("phase", "Active")), _AGE],
    "pods": [
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "string", 0, lambda o: str(sum(
            s.get("restartCount", 0) for s in (o.get("status") or {}).get(
                "containerStatuses") or []))),
        _AGE,
        ("IP", "string", 1, lambda o: (o.get("status") or {}).get("podIP") or "<none>"),
        ("Node", "string", 1, lambda o: (o.get("spec") or {}).get("nodeName") or "<none>"),
        ("Nominated Node", "string", 1, lambda o: "<none>"),
        ("Readiness Gates", "string", 1, lambda o: "<none>"),
    ],
    "serviceaccounts": [("Secrets", "integer", 0, lambda o: len(o.get("secrets") or [])), _AGE],
    "secrets": [("Type", "string", 0, lambda o: o.get("type", "Opaque")),
                ("Data", "integer", 0, lambda o: len(o.get("data") or {})), _AGE],
    "configmaps": [("Data", "integer", 0,
                    lambda o: len(o.get("data") or {}) + len(o.get("binaryData") or {})), _AGE],
    "nodes": [
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, lambda o: "<none>"),
        _AGE,
        ("Version", "string", 0,
         lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")),
        ("Internal-IP", "string", 1, lambda o: _node_ip(o, "InternalIP")),
        ("External-IP", "string", 1, lambda o: _node_ip(o, "ExternalIP")),
        ("OS-Image", "string", 1,
         lambda o: ((o.get("status") or {}).get("nodeInfo") or {}).get("osImage", "")),
    ],
    "roles": [("Created At", "date", 0, lambda o: o["metadata"].get("creationTimestamp"))],
    "rolebindings": [
        ("Role", "string", 0, lambda o: "{kind}/{name}".format(**{
            "kind": (o.get("roleRef") or {}).get("kind", ""),
            "name": (o.get("roleRef") or {}).get("name", "")})),
        _AGE,
        ("Users", "string", 1, lambda o: _subjects(o, "User")),
        ("Groups", "string", 1, lambda o: _subjects(o, "Group")),
        ("ServiceAccounts", "string", 1, lambda o: _subjects(o, "ServiceAccount")),
    ],
}


def wants_table(accept: str | None) -> bool:
    """Does the Accept header ask for a Table (kubectl get's server-side printing)?"""
    if not accept:
        return False
    for media in accept.split(","):
        params = [p.strip() for p in media.split(";")[1:]]
        if "as=Table" in params and any(p.startswith("g=meta.k8s.io") for p in params):
            return True
    return False


def table_version(accept: str | None) -> str:
    for media in (accept or "").split(","):
        params = [p.strip() for p in media.split(";")[1:]]
        if "as=Table" in params:
            for p in params:
                if p.startswith("v="):
                    return p[2:]
    return "v1"


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": obj["metadata"]}


def table(resource: ResourceType, objects: list[Obj], list_meta: dict[str, Any],
          include: str = "Metadata", version: str = "v1") -> Obj:
    columns = [("Name", "string", 0, _name)] + _COLUMNS.get(resource.plural, [_AGE])
    definitions = [{"name": name, "type": ctype, "format": "name" if name == "Name" else "",
                    "description": "", "priority": priority}
                   for name, ctype, priority, _ in columns]
    rows = []
    for obj in objects:
        row: Obj = {"cells": [cell(obj) for _, _, _, cell in columns]}
        row_object = _row_object(obj, include)
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}", "metadata": list_meta,
            "columnDefinitions": definitions, "rows": rows}
