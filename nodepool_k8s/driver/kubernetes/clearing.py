"""Clearing one node namespace that stays Terminating: what holds it, and removing that.

Owns: reading what the namespace controller reports as remaining in a Terminating namespace
(its `NamespaceContentRemaining` / `NamespaceFinalizersRemaining` conditions), deleting the
pods left in it with a bounded grace period, removing the finalizers of the objects left in
it (only the kinds a job can create, `manifests.job_resource_types`, and only objects that
are being deleted), and removing the launcher's own hold (HOLD_FINALIZER on the cleanup
RoleBinding, `job-role: cluster-role`) last.

Scope: every call names one namespace, which the caller has just proved ours (labels with
the node id, uid, Terminating). Nothing here lists or patches outside that namespace.

How it fails: each object is tried on its own. 404 counts as done (gone meanwhile); a 409
(the object changed since it was listed) reads it again and retries, at most PATCH_ROUNDS
times; a kind the server does not serve (404 on the list) is skipped. Any other failure
(403 without the rights, API errors) is collected and raised as one `ClearingFailed` (a
DeletionBlocked, a TemporaryError) once the rest was tried; the hold is then kept, so the
next try still has the rights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.client import KubeClient
from nodepool_k8s.driver.kubernetes.errors import Conflict
from nodepool_k8s.driver.kubernetes.waiter import metadata, object_uid, resource_version
from nodepool_k8s.core.errors import DeletionBlocked, NodepoolError, NotFound, TemporaryError

log = logging.getLogger(__name__)

CONTENT_REMAINING = "NamespaceContentRemaining"
FINALIZERS_REMAINING = "NamespaceFinalizersRemaining"
# How the namespace controller names the resource type of the cleanup RoleBinding.
HOLD_RESOURCE = f"rolebindings.{manifests.RBAC_GROUP}"
PATCH_ROUNDS = 3
LIST_PAGE_SIZE = 500
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ClearingFailed(DeletionBlocked):
    """Some of what holds a Terminating namespace could not be removed (retried later)."""


@dataclass
class Cleared:
    """What one clear-up removed."""

    finalizers: list[tuple[str, str, list[str]]] = field(default_factory=list)  # kind, name,
    pods: list[tuple[str, Any]] = field(default_factory=list)  # name, its grace period before
    hold_released: bool = False


def _items(message: str, separator: str) -> list[str]:
    """The names in a controller message "...: a has 1 ..., b has 2 ..." (before `separator`)."""
    _, _, listed = message.partition(": ")
    return [part.split(separator, 1)[0].strip() for part in listed.split(", ")
            if separator in part]


def remaining(namespace: Mapping[str, Any]) -> tuple[list[str], list[str]] | None:
    """(resource types, finalizers) the namespace controller last reported as remaining in
    `namespace`, or None when it has reported nothing (yet)."""
    status = namespace.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    found = {c.get("type"): c for c in conditions or [] if isinstance(c, Mapping)}
    content, held = found.get(CONTENT_REMAINING), found.get(FINALIZERS_REMAINING)
    if content is None or held is None:
        return None
    kinds = _items(str(content.get("message") or ""), " has ") \
        if content.get("status") == "True" else []
    finalizers = _items(str(held.get("message") or ""), " in ") \
        if held.get("status") == "True" else []
    return kinds, finalizers


def only_own_hold(namespace: Mapping[str, Any]) -> bool:
    """Whether the launcher's cleanup RoleBinding is all that is left in `namespace`: time
    to remove HOLD_FINALIZER so the namespace can go."""
    left = remaining(namespace)
    return left is not None and left == ([HOLD_RESOURCE], [manifests.HOLD_FINALIZER])


def describe(namespace: Mapping[str, Any]) -> str:
    """What the namespace controller says still holds `namespace`, for logs and conditions."""
    left = remaining(namespace)
    if left is None:
        return "the namespace controller reports nothing remaining yet"
    kinds, finalizers = left
    text = "remaining: " + (", ".join(kinds) or "nothing")
    if finalizers:
        text += "; finalizers: " + ", ".join(finalizers)
    return text


def _path(group: str, resource: str, namespace: str, name: str | None = None) -> str:
    base = "/api/v1" if not group else f"/apis/{group}/v1"
    path = f"{base}/namespaces/{namespace}/{resource}"
    return f"{path}/{name}" if name else path


def _request(client: KubeClient, what: str, method: str, path: str,
             query: Mapping[str, Any] | None = None, body: Any = None,
             content_type: str | None = None) -> dict[str, Any]:
    """One call to a path of the API (kinds the typed client has no method table for)."""
    headers = {"Accept": "application/json"}
    if content_type:
        headers["Content-Type"] = content_type

    def send(_preload_content: bool = False, _request_timeout: Any = None) -> Any:
        return client.api_client.call_api(
            path, method, query_params=list((query or {}).items()), header_params=headers,
            body=body, auth_settings=["BearerToken"], _preload_content=_preload_content,
            _request_timeout=_request_timeout)
    return client.call(what, send)


def _list(client: KubeClient, group: str, resource: str,
          namespace: str) -> Iterator[dict[str, Any]]:
    """Every `resource` object in `namespace`, a page at a time (nothing when the server
    does not serve the kind). A job may have made many big objects: only one page is held."""
    token: str | None = None
    while True:
        query: dict[str, Any] = {"limit": LIST_PAGE_SIZE}
        if token:
            query["continue"] = token
        try:
            body = _request(client, f"list {resource} in {namespace}", "GET",
                            _path(group, resource, namespace), query)
        except NotFound:
            return  # not served by this cluster (no such kind), or the namespace went
        yield from (i for i in body.get("items") or [] if isinstance(i, dict))
        token = metadata(body).get("continue")
        if not token:
            return


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    found = metadata(obj).get("finalizers")
    return [str(f) for f in found] if isinstance(found, list) else []


def _drop_finalizers(client: KubeClient, group: str, resource: str, namespace: str,
                     obj: dict[str, Any]) -> list[str] | None:
    """Remove the finalizers of one deleting object, guarded by its resourceVersion; the
    finalizers removed (None: nothing to do any more)."""
    name = str(metadata(obj).get("name") or "")
    path = _path(group, resource, namespace, name)
    for _ in range(PATCH_ROUNDS):
        held = _finalizers(obj)
        if not held or not metadata(obj).get("deletionTimestamp"):
            return None
        patch = {"metadata": {"finalizers": None, "resourceVersion": resource_version(obj)}}
        try:
            _request(client, f"remove the finalizers of {resource} {namespace}/{name}",
                     "PATCH", path, body=patch, content_type=MERGE_PATCH)
            return held
        except NotFound:
            return None
        except Conflict:
            try:  # changed since it was listed: judge what is there now
                obj = _request(client, f"read {resource} {namespace}/{name}", "GET", path)
            except NotFound:
                return None
    raise TemporaryError(f"{resource} {namespace}/{name} kept changing")


def _bound_pods(client: KubeClient, namespace: str, max_grace: int,
                cleared: Cleared) -> None:
    """Delete the pods of `namespace` whose grace period is longer than `max_grace` (read a
    page at a time, like every other kind: a job may have made many big pods)."""
    for pod in _list(client, "", "pods", namespace):
        meta = metadata(pod)
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and isinstance(grace, int) and grace <= max_grace:
            continue
        name = str(meta.get("name") or "")
        options = {"gracePeriodSeconds": max_grace,
                   "preconditions": {"uid": object_uid(pod)}}
        try:
            client.call(f"delete pod {namespace}/{name}", client.core.delete_namespaced_pod,
                        name, namespace, body=options)
        except (NotFound, Conflict):
            continue  # gone, or another pod of that name (the namespace takes none new)
        cleared.pods.append((name, grace))


def release_hold(client: KubeClient, namespace: str) -> bool:
    """Remove HOLD_FINALIZER from the cleanup RoleBinding (exactly that finalizer list);
    False when there is no such binding (any more)."""
    patch = [{"op": "test", "path": "/metadata/finalizers",
              "value": [manifests.HOLD_FINALIZER]},
             {"op": "remove", "path": "/metadata/finalizers"}]
    try:
        _request(client, f"release rolebinding {namespace}/{manifests.CLEANUP_BINDING}",
                 "PATCH", _path(manifests.RBAC_GROUP, "rolebindings", namespace,
                                manifests.CLEANUP_BINDING),
                 body=patch, content_type=JSON_PATCH)
    except NotFound:
        return False
    return True


def clear(client: KubeClient, namespace: str, max_pod_grace: int, holds: bool) -> Cleared:
    """Remove what keeps `namespace` (proved ours, Terminating) from going: pods get at most
    `max_pod_grace` seconds, deleting objects of the job's kinds lose their finalizers, and
    (`holds`: the namespace has the launcher's cleanup binding) the hold goes last, only
    when everything else worked. Raises ClearingFailed naming what did not."""
    cleared = Cleared()
    failures: list[str] = []
    try:
        _bound_pods(client, namespace, max_pod_grace, cleared)
    except NodepoolError as exc:
        failures.append(f"pods: {exc}")
    for group, resource in manifests.job_resource_types():
        try:
            for obj in _list(client, group, resource, namespace):
                try:
                    removed = _drop_finalizers(client, group, resource, namespace, obj)
                except NodepoolError as exc:
                    failures.append(f"{resource}/{metadata(obj).get('name')}: {exc}")
                    continue
                if removed:
                    cleared.finalizers.append(
                        (resource, str(metadata(obj).get("name") or ""), removed))
        except NodepoolError as exc:
            failures.append(f"{resource}: {exc}")
    if failures:
        raise ClearingFailed(f"clearing namespace {namespace}: " + "; ".join(failures[:5])
                             + (f" (and {len(failures) - 5} more)" if len(failures) > 5
                                else ""))
    if holds:
        try:
            cleared.hold_released = release_hold(client, namespace)
        except NodepoolError as exc:
            raise ClearingFailed(f"clearing namespace {namespace}: releasing the hold: {exc}") \
                from exc
    return cleared
