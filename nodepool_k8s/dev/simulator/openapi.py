"""Minimal OpenAPI v3 documents (/openapi/v3 and /openapi/v3/{api|apis/g}/{version}).

Owns: just enough OpenAPI for kubectl. Before `kubectl create/apply/replace` sends an object
it checks whether the server validates fields itself: it reads the /openapi/v3 index, then
the group-version document, and looks for a PATCH operation tagged with the object's
group/version/kind that accepts the `fieldValidation` query parameter. Finding it, kubectl
skips client-side schema validation (which would need the full, huge schema) and sends
`fieldValidation=Strict`. The documents therefore list every served path and operation with
the Kubernetes vendor extensions, but schemas are a permissive placeholder.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nodepool_k8s.dev.simulator.resources import GROUP_VERSIONS, ResourceType

_QUERY_PARAMS = {
    "get": ("pretty",),
    "list": ("labelSelector", "fieldSelector", "limit", "continue", "resourceVersion",
             "resourceVersionMatch", "timeoutSeconds", "watch", "allowWatchBookmarks",
             "sendInitialEvents"),
    "post": ("dryRun", "fieldManager", "fieldValidation"),
    "put": ("dryRun", "fieldManager", "fieldValidation"),
    "patch": ("dryRun", "fieldManager", "fieldValidation", "force"),
    "delete": ("dryRun", "gracePeriodSeconds", "propagationPolicy"),
    "deletecollection": ("labelSelector", "fieldSelector", "dryRun", "gracePeriodSeconds",
                         "propagationPolicy"),
}
_SCHEMA = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _prefix(group_version: str) -> str:
    return "api/v1" if group_version == "v1" else f"apis/{group_version}"


def _operation(r: ResourceType, action: str, op_id: str) -> dict[str, Any]:
    params = [{"name": name, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
              for name in _QUERY_PARAMS.get(action, ())]
    op: dict[str, Any] = {
        "operationId": op_id,
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/object"}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version,
                                            "kind": r.kind},
    }
    if action in ("post", "put", "patch"):
        media = ("application/merge-patch+json", "application/json-patch+json",
                 "application/strategic-merge-patch+json") if action == "patch" else (
                     "application/json",)
        op["requestBody"] = {"content": {m: {"schema": {"$ref": "#/components/schemas/object"}}
                                         for m in media}, "required": True}
    return op


def _paths(r: ResourceType, group_version: str) -> dict[str, Any]:
    base = f"/{_prefix(group_version)}"
    scope = f"{base}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"{base}/{r.plural}"
    name = r.kind
    paths: dict[str, Any] = {}
    collection: dict[str, Any] = {}
    if "list" in r.verbs:
        collection["get"] = _operation(r, "list", f"list{name}")
    if "create" in r.verbs:
        collection["post"] = _operation(r, "post", f"create{name}")
    if "deletecollection" in r.verbs:
        collection["delete"] = _operation(r, "deletecollection", f"deleteCollection{name}")
    paths[scope] = collection
    if "get" in r.verbs:
        paths[f"{scope}/{{name}}"] = {
            "get": _operation(r, "get", f"read{name}"),
            "put": _operation(r, "put", f"replace{name}"),
            "patch": _operation(r, "patch", f"patch{name}"),
            "delete": _operation(r, "delete", f"delete{name}"),
        }
    return paths


def group_version_document(group_version: str) -> dict[str, Any] | None:
    served = GROUP_VERSIONS.get(group_version)
    if served is None:
        return None
    paths: dict[str, Any] = {}
    for r in served:
        paths.update(_paths(r, group_version))
    return {"openapi": "3.0.0",
            "info": {"title": "Kubernetes (nodepool-k8s simulator)", "version": "unversioned"},
            "paths": paths,
            "components": {"schemas": {"object": _SCHEMA}}}


def _hash(document: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()[:64].upper()


def index() -> dict[str, Any]:
    paths = {}
    for group_version in GROUP_VERSIONS:
        doc = group_version_document(group_version)
        prefix = _prefix(group_version)
        paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={_hash(doc or {})}"}
    return {"paths": paths}


def document_for_path(path: str) -> dict[str, Any] | None:
    """The document for "/openapi/v3/api/v1" or "/openapi/v3/apis/{group}/{version}"."""
    rest = path[len("/openapi/v3/"):].strip("/")
    if rest == "api/v1":
        return group_version_document("v1")
    parts = rest.split("/")
    if len(parts) == 3 and parts[0] == "apis":
        return group_version_document(f"{parts[1]}/{parts[2]}")
    return None
