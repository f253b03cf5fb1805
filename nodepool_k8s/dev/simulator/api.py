"""The Kubernetes REST API: routing, authentication, fault injection and the verb handlers.

Owns: turning one parsed HTTP request into either a JSON `Response` or a `WatchStream` —
URL routing (/api/v1/..., /apis/{group}/{version}/..., the deprecated /watch/ prefix),
bearer-token checks (401), optional RBAC (403), counting calls per "verb resource", applying
injected faults (latency, errors, stalls, quota 403), and the verbs create, get, list (with
selectors and limit/continue), watch, update, patch, delete, deletecollection, plus the
serviceaccounts/token, */status and tokenreviews endpoints, discovery and Table output.

Failure modes: every refusal is an `ApiError` that the caller renders as a `Status` body;
malformed JSON bodies are 400 BadRequest; unexpected exceptions are left to the HTTP layer,
which answers 500 InternalError and logs the traceback.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import parse_qs, unquote

import yaml

from nodepool_k8s.dev.simulator import (admission, discovery, errors, openapi, patch, protobuf,
                                        policy, tables, validation)
from nodepool_k8s.dev.simulator.auth import Identity, TokenAuthority
from nodepool_k8s.dev.simulator.config import SimulatorConfig
from nodepool_k8s.dev.simulator.controllers import delete_pod
from nodepool_k8s.dev.simulator.data import clone, dumps
from nodepool_k8s.dev.simulator.faults import Decision, FaultInjector
from nodepool_k8s.dev.simulator.resources import ResourceType, lookup
from nodepool_k8s.dev.simulator.selectors import combined
from nodepool_k8s.dev.simulator.store import Obj, Store, now_rfc3339
from nodepool_k8s.dev.simulator.watch import WatchStream

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
UNDELETABLE_NAMESPACES = ("default", "kube-system", "kube-public")
ANONYMOUS_PATHS = ("/version", "/healthz", "/livez", "/readyz")
DEBUG_COUNTERS_PATH = "/debug/counters"  # the admin reads `Counters` here (JSON)
# status is only written via /status
_STATUS_KINDS = ("pods", "namespaces", "nodes", "services", "resourcequotas")
_SUBRESOURCE_VERBS = {"status": ("get", "update", "patch"), "token": ("create",)}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes = b""

    @classmethod
    def from_target(cls, method: str, target: str, headers: dict[str, str],
                    body: bytes) -> "Request":
        path, _, query = target.partition("?")
        params = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        return cls(method.upper(), unquote(path), params,
                   {k.lower(): v for k, v in headers.items()}, body)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")


@dataclass
class Response:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    def encode(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode()
        return dumps(self.body)


@dataclass
class Route:
    resource: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


class Counters:
    """API calls by "verb resource" plus "total"; thread-safe."""

    def __init__(self, on_add: Callable[[str], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._on_add = on_add

    def add(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1
            self._counts["total"] += 1
        if self._on_add is not None:
            self._on_add(key)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


def _qos_class(pod: Obj) -> str:
    containers = (pod.get("spec") or {}).get("containers") or []
    requests_seen, guaranteed = False, True
    for c in containers:
        resources = c.get("resources") or {}
        req, lim = resources.get("requests") or {}, resources.get("limits") or {}
        if req or lim:
            requests_seen = True
        for res in ("cpu", "memory"):
            if res not in lim or (res in req and str(req[res]) != str(lim[res])):
                guaranteed = False
    if not requests_seen:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class Api:
    def __init__(self, store: Store, authority: TokenAuthority, faults: FaultInjector,
                 config: SimulatorConfig, counters: Counters, stop: threading.Event,
                 server_address: Callable[[], str]) -> None:
        self.store = store
        self.authority = authority
        self.faults = faults
        self.config = config
        self.counters = counters
        self.stop = stop
        self.server_address = server_address

    # -- entry point ------------------------------------------------------------------------
    def handle(self, req: Request) -> Response | WatchStream:
        path = req.path.rstrip("/") or "/"
        if path in ANONYMOUS_PATHS:
            # As a real API server: authentication comes first, so a request without
            # credentials is anonymous (allowed here) but one whose token is refused is 401.
            header = req.headers.get("authorization")
            if header and self.authority.authenticate(header) is None:
                self.authority.count_rejected(req.method, path)
                raise errors.unauthorized()
            if path == "/version":
                return Response(200, discovery.version(self.config.server_version))
            return Response(200, "ok", content_type="text/plain")
        header = req.headers.get("authorization")
        identity = self.authority.authenticate(header)
        if identity is None and not header and self._anonymous_admin():
            identity = self.authority.admin
        if identity is None:
            self.authority.count_rejected(req.method, path)
            raise errors.unauthorized()
        if path == DEBUG_COUNTERS_PATH:
            # For benchmarks running the simulator in its own process: not counted, no faults.
            if req.method != "GET":
                raise errors.method_not_allowed()
            if not identity.admin:
                raise errors.forbidden("counters", "", "only the admin may read the counters")
            return Response(200, self.counters.snapshot())
        document = self._discovery(path)
        if document is not None:
            self.counters.add("get discovery")
            self._sleep(self.faults.faults.latency)
            return document
        route = self._route(path)
        verb = self._verb(req, route)
        resource_key = route.resource.plural + (f"/{route.subresource}" if route.subresource
                                                else "")
        self.counters.add(f"{verb} {resource_key}")
        allowed = (route.resource.verbs if route.subresource is None
                   else _SUBRESOURCE_VERBS[route.subresource])
        if verb not in allowed:
            raise errors.method_not_allowed()
        # Everyone may ask who they are (the real default role system:basic-user).
        if self.config.enforce_rbac and route.resource.plural != "selfsubjectreviews" \
                and not self.authority.authorize(
                identity, verb, route.resource.group, resource_key, route.namespace, route.name):
            raise self._rbac_forbidden(identity, verb, route, resource_key)
        decision = self.faults.decide(verb, resource_key)
        self._sleep(decision.latency)
        if decision.error_code is not None:
            if decision.error_code == 403 and verb == "create" and route.resource.plural == "pods":
                raise self._quota_error(req)
            raise errors.for_code(decision.error_code, route.resource.plural,
                                  route.name or "", route.resource.group,
                                  retry_after=decision.retry_after)
        if verb == "watch":
            self._sleep(decision.stall)
            return self._watch(req, route)
        result = self._dispatch(verb, req, route, decision, identity)
        if decision.rewrite is not None:
            body = result.body
            if not isinstance(body, (bytes, str)):
                body = clone(body)
            result = Response(result.status, decision.rewrite(body), dict(result.headers),
                              result.content_type)
        self._sleep(decision.stall)  # applied, but the answer comes too late for the client
        return result

    def _anonymous_admin(self) -> bool:
        if self.config.anonymous_admin is None:
            return not self.config.tls
        return self.config.anonymous_admin

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.stop.wait(seconds)  # interrupted by shutdown

    # -- routing ----------------------------------------------------------------------------
    def _discovery(self, path: str) -> Response | None:
        if path == "/openapi/v3":
            return Response(200, openapi.index())
        if path.startswith("/openapi/v3/"):
            spec = openapi.document_for_path(path)
            if spec is None:
                raise errors.no_such_path()
            return Response(200, spec)
        if path == "/api":
            return Response(200, discovery.api_versions(self.server_address()))
        if path == "/apis":
            return Response(200, discovery.api_group_list())
        parts = path.strip("/").split("/")
        doc: Obj | None = None
        if parts == ["api", "v1"]:
            doc = discovery.resource_list("v1")
        elif len(parts) == 2 and parts[0] == "apis":
            doc = discovery.api_group(parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            doc = discovery.resource_list(f"{parts[1]}/{parts[2]}")
        else:
            return None
        if doc is None:
            raise errors.no_such_path()
        return Response(200, doc)

    def _route(self, path: str) -> Route:
        parts = path.strip("/").split("/")
        if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
            group_version, rest = "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            raise errors.no_such_path()
        watch_path = bool(rest) and rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        namespace = None
        # /namespaces/{ns}/{plural}... is namespaced unless {plural} is a namespace subresource.
        if (len(rest) >= 3 and rest[0] == "namespaces"
                and lookup(group_version, rest[2]) is not None):
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise errors.no_such_path()
        resource = lookup(group_version, rest[0])
        if resource is None or (namespace is not None and not resource.namespaced):
            raise errors.no_such_path()
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        if sub is not None and sub not in resource.subresources:
            raise errors.no_such_path()
        if resource.namespaced and namespace is None and name is not None:
            raise errors.no_such_path()  # namespaced objects are only addressable in their ns
        return Route(resource, namespace, name, sub, watch_path)

    @staticmethod
    def _verb(req: Request, route: Route) -> str:
        method, named = req.method, route.name is not None
        if route.watch_path:
            if method != "GET":
                raise errors.method_not_allowed()
            return "watch"
        if method == "GET":
            if named:
                return "get"
            return "watch" if req.flag("watch") else "list"
        if method == "POST":
            if named and route.subresource != "token":
                raise errors.method_not_allowed()
            return "create"
        if method in ("PUT", "PATCH"):
            if not named:
                raise errors.method_not_allowed()
            return "update" if method == "PUT" else "patch"
        if method == "DELETE":
            return "delete" if named else "deletecollection"
        raise errors.method_not_allowed()

    def _dispatch(self, verb: str, req: Request, route: Route, decision: Decision,
                  identity: Identity) -> Response:
        resource = route.resource
        if route.subresource == "token":
            return self._token_request(req, route)
        if resource.plural == "tokenreviews":
            return self._token_review(req)
        if resource.plural == "selfsubjectreviews":
            return Response(201, {"kind": "SelfSubjectReview",
                                  "apiVersion": "authentication.k8s.io/v1",
                                  "metadata": {"creationTimestamp": None},
                                  "status": {"userInfo": identity.as_user_info()}})
        if verb == "get":
            obj = self.store.require(resource, route.namespace, str(route.name))
            return self._maybe_table(req, resource, obj)
        if verb == "list":
            return self._list(req, route)
        if verb == "create":
            return self._create(req, route, decision, identity)
        if verb in ("update", "patch"):
            return self._update(req, route, verb, identity)
        if verb == "delete":
            return self._delete(req, resource, route.namespace, str(route.name))
        if verb == "deletecollection":
            return self._delete_collection(req, route)
        raise errors.method_not_allowed()

    # -- bodies -----------------------------------------------------------------------------
    @staticmethod
    def _body(req: Request, required: bool = True) -> Any:
        if not req.body.strip():
            if required:
                raise errors.bad_request("the request body is empty")
            return None
        media = req.headers.get("content-type", "application/json").split(";")[0].strip()
        if media == protobuf.MEDIA_TYPE:
            return protobuf.decode(req.body)  # kubectl's typed clients (create ns/sa/...)
        try:
            if media in ("application/yaml", "application/apply-patch+yaml"):
                return yaml.safe_load(req.body)
            return json.loads(req.body)
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the body of the request could not be decoded: {exc}") \
                from None

    def _object_body(self, req: Request, route: Route) -> Obj:
        obj = self._body(req)
        if not isinstance(obj, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        resource = route.resource
        kind = obj.get("kind")
        if kind and kind != resource.kind:
            raise errors.bad_request(
                f"the kind in the body ({kind}) does not match the resource "
                f"({resource.kind}) of the request URL")
        meta = obj.get("metadata")
        if meta is None:
            meta = obj["metadata"] = {}
        if not isinstance(meta, dict):
            raise errors.bad_request("metadata must be an object")
        if resource.namespaced:
            if meta.get("namespace") and route.namespace and meta["namespace"] != route.namespace:
                raise errors.bad_request("the namespace of the provided object does not match "
                                         "the namespace sent on the request")
            meta["namespace"] = route.namespace
        else:
            meta.pop("namespace", None)
        return obj

    # -- verbs ------------------------------------------------------------------------------
    def _maybe_table(self, req: Request, resource: ResourceType, obj: Obj) -> Response:
        accept = req.headers.get("accept")
        if tables.wants_table(accept):
            return Response(200, tables.table(
                resource, [obj], {"resourceVersion": obj["metadata"]["resourceVersion"]},
                req.query.get("includeObject", "Metadata"), tables.table_version(accept)))
        return Response(200, obj)

    def _list(self, req: Request, route: Route) -> Response:
        resource = route.resource
        matcher = combined(req.query.get("labelSelector"), req.query.get("fieldSelector"),
                           resource)
        items, rv = self.store.list(resource.plural, route.namespace, matcher)
        token = req.query.get("continue")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                start, rv = decoded["start"], int(decoded["rv"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("continue key is not valid") from None
            if rv < self.store.compacted_rv:
                # As the real server once its snapshot is compacted away: the client must
                # list again from the start.
                raise errors.expired(
                    "The provided continue parameter is too old to display a consistent "
                    "list result. You can start a new list without the continue parameter.")
            # Every page names the first page's resourceVersion (the real server's snapshot):
            # a watch from it replays whatever changed since, also under later pages.
            items = [o for o in items
                     if [o["metadata"].get("namespace") or "", o["metadata"]["name"]] > start]
        list_meta: Obj = {"resourceVersion": str(rv)}
        limit = int(req.query.get("limit") or 0)
        if limit > 0 and len(items) > limit:
            last = items[limit - 1]["metadata"]
            list_meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "start": [last.get("namespace") or "", last["name"]]}).encode()
            ).decode()
            list_meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        accept = req.headers.get("accept")
        if tables.wants_table(accept):
            return Response(200, tables.table(resource, items, list_meta,
                                              req.query.get("includeObject", "Metadata"),
                                              tables.table_version(accept)))
        return Response(200, {"kind": resource.list_kind, "apiVersion": resource.api_version,
                              "metadata": list_meta, "items": items})

    def _watch(self, req: Request, route: Route) -> WatchStream:
        resource = route.resource
        field_selector = req.query.get("fieldSelector")
        if route.name:  # deprecated /watch/.../{name} form
            by_name = f"metadata.name={route.name}"
            field_selector = f"{field_selector},{by_name}" if field_selector else by_name
        matcher = combined(req.query.get("labelSelector"), field_selector, resource)
        rv_text = req.query.get("resourceVersion", "")
        send_initial = req.query.get("sendInitialEvents", "").lower()
        bookmarks = req.flag("allowWatchBookmarks")
        try:
            since = int(rv_text) if rv_text else None
        except ValueError:
            raise errors.bad_request(f"invalid resource version: {rv_text!r}") from None
        initial = since in (None, 0) if send_initial == "" else send_initial == "true"
        timeout = float(req.query.get("timeoutSeconds") or self.config.default_watch_timeout)
        accept = req.headers.get("accept")
        table_version = tables.table_version(accept) if tables.wants_table(accept) else None
        try:
            watcher = self.store.watch(resource.plural, route.namespace, matcher,
                                       None if initial else since, initial)
        except errors.ApiError as exc:
            # Like the real server: 200, then a single ERROR event carrying the Status.
            return WatchStream(resource, None, timeout, bookmarks, 0, self.stop, error=exc)
        return WatchStream(resource, watcher, timeout, bookmarks,
                           self.config.bookmark_interval, self.stop,
                           initial_events_end=bookmarks and send_initial == "true",
                           table_version=table_version)

    def _check_namespace(self, resource: ResourceType, namespace: str | None,
                         name: str) -> None:
        """Creating needs an existing namespace that is not being deleted (lock held)."""
        if not resource.namespaced:
            return
        ns = self.store.get("namespaces", None, str(namespace))
        if ns is None:
            raise errors.not_found("namespaces", str(namespace))
        if ns["metadata"].get("deletionTimestamp"):
            raise errors.namespace_terminating(resource.plural, name, str(namespace),
                                               resource.group)

    def _admit(self, resource: ResourceType, namespace: str | None, obj: Obj) -> None:
        """Built-in admission (lock held): see `admission`."""
        if resource.plural == "pods":
            admission.check_pod_security(obj, self.store.get("namespaces", None,
                                                             str(namespace)))
            ranges, _ = self.store.list("limitranges", namespace)
            admission.apply_limit_ranges(obj, ranges)
        if resource.plural in admission.USAGE:
            quotas, _ = self.store.list("resourcequotas", namespace)
            if quotas:
                existing, _ = self.store.list(resource.plural, namespace)
                admission.check_quota(resource.plural, obj, quotas, existing)
        if resource.plural == "resourcequotas":
            objects = {plural: self.store.list(plural, namespace)[0]
                       for plural in admission.USAGE}
            obj["status"] = {"hard": dict((obj.get("spec") or {}).get("hard") or {}),
                             "used": admission.quota_used(obj, objects)}

    def _admit_policies(self, operation: str, resource: ResourceType, namespace: str | None,
                        obj: Obj, old: Obj | None, identity: Identity) -> None:
        """ValidatingAdmissionPolicies (lock held): see `policy`."""
        bindings, _ = self.store.list(policy.BINDINGS, None)
        if not bindings:
            return
        if resource.namespaced:
            ns = self.store.get("namespaces", None, str(namespace))
            ns_labels = dict(((ns or {}).get("metadata") or {}).get("labels") or {})
        elif resource.plural == "namespaces":
            ns_labels = dict((obj.get("metadata") or {}).get("labels") or {})
        else:
            ns_labels = None
        attrs = policy.Attributes(
            operation=operation, group=resource.group, version=resource.version,
            plural=resource.plural, kind=resource.kind, namespace=namespace,
            name=str((obj.get("metadata") or {}).get("name") or ""), obj=obj, old=old,
            user=identity.as_user_info(), namespace_labels=ns_labels)
        policy.admit(attrs, lambda plural, name: self.store.get(plural, None, name), bindings)

    def _check_escalation(self, identity: Identity, resource: ResourceType,
                          namespace: str | None, obj: Obj) -> None:
        """RBAC escalation prevention for roles and bindings (see `auth`)."""
        if not self.config.enforce_rbac or identity.admin:
            return
        problem: str | None = None
        if resource.plural in ("roles", "clusterroles"):
            problem = self.authority.escalation_problem(identity, resource.plural, namespace,
                                                        obj)
        elif resource.plural in ("rolebindings", "clusterrolebindings"):
            problem = self.authority.binding_problem(identity, namespace, obj)
        if problem:
            raise errors.forbidden(resource.plural, str(obj["metadata"].get("name") or ""),
                                   f'user "{identity.username}" (groups='
                                   f'{list(identity.groups)}) is attempting to grant RBAC '
                                   f"permissions not currently held: {problem}",
                                   resource.group)

    def _create(self, req: Request, route: Route, decision: Decision,
                identity: Identity) -> Response:
        resource = route.resource
        obj = self._object_body(req, route)
        obj.pop("status", None)
        validation.apply_defaults(resource, obj)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "xxxxx"  # validated; store picks the real one
            generated = True
        else:
            generated = False
        validation.validate(resource, obj)
        if generated:
            del meta["name"]
        if resource.plural == "pods":
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj)}
        elif resource.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        with self.store.lock:
            self._check_namespace(resource, route.namespace, meta.get("name", ""))
            self._check_escalation(identity, resource, route.namespace, obj)
            self._admit(resource, route.namespace, obj)
            self._admit_policies("CREATE", resource, route.namespace, obj, None, identity)
            if resource.plural == "pods":
                obj["status"]["qosClass"] = _qos_class(obj)  # after LimitRange defaults
            if decision.quota_exceeded:
                raise self._quota_error(req, obj)
            if req.query.get("dryRun"):
                existing = self.store.get(resource.plural, route.namespace, meta.get("name", ""))
                if existing is not None:
                    raise errors.already_exists(resource.plural, meta["name"], resource.group)
                return Response(201, obj)
            return Response(201, self.store.create(resource, obj))

    def _update(self, req: Request, route: Route, verb: str,
                identity: Identity) -> Response:
        resource, name = route.resource, str(route.name)
        with self.store.lock:
            current = self.store.require(resource, route.namespace, name)
            if verb == "patch":
                body = self._body(req)
                content_type = req.headers.get("content-type", "")
                new = patch.apply(content_type, current, body)
                expect_rv = (new.get("metadata") or {}).get("resourceVersion")
            else:
                new = self._object_body(req, route)
                expect_rv = new["metadata"].get("resourceVersion")
            meta = new.setdefault("metadata", {})
            if not isinstance(meta, dict):
                raise errors.bad_request("metadata must be an object")
            if meta.get("name") and meta["name"] != name:
                raise errors.bad_request(f"the name of the object ({meta['name']}) does not "
                                         f"match the name on the URL ({name})")
            meta["name"] = name
            if resource.namespaced:
                meta["namespace"] = route.namespace
            if route.subresource == "status":
                # /status writes only the status; everything else stays as stored.
                merged = clone(current)
                merged["status"] = new.get("status")
                merged["metadata"]["resourceVersion"] = meta.get(
                    "resourceVersion") or current["metadata"]["resourceVersion"]
                new = merged
            elif resource.plural in _STATUS_KINDS:
                if "status" in current:
                    new["status"] = current["status"]
                else:
                    new.pop("status", None)
            validation.apply_defaults(resource, new)
            validation.validate(resource, new)
            validation.validate_update(resource, current, new)
            self._check_escalation(identity, resource, route.namespace, new)
            if route.subresource is None:
                self._admit_policies("UPDATE", resource, route.namespace, new, current,
                                     identity)
            if req.query.get("dryRun"):
                return Response(200, new)
            return Response(200, self.store.replace(resource, new, expect_rv or None))

    def _delete(self, req: Request, resource: ResourceType, namespace: str | None,
                name: str) -> Response:
        options = self._body(req, required=False) or {}
        if not isinstance(options, dict):
            raise errors.bad_request("DeleteOptions must be an object")
        dry_run = bool(req.query.get("dryRun") or options.get("dryRun"))
        grace = options.get("gracePeriodSeconds", req.query.get("gracePeriodSeconds"))
        policy = options.get("propagationPolicy", req.query.get("propagationPolicy"))
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise errors.bad_request(f"propagationPolicy {policy!r} is not supported")
        with self.store.lock:
            current = self.store.require(resource, namespace, name)
            preconditions = options.get("preconditions") or {}
            for field_name in ("uid", "resourceVersion"):
                wanted = preconditions.get(field_name)
                if wanted and wanted != current["metadata"].get(field_name):
                    raise errors.conflict(resource.plural, name, resource.group)
            if dry_run:
                return Response(200, current)
            return self._delete_locked(resource, current, grace)

    def _delete_locked(self, resource: ResourceType, current: Obj, grace: Any) -> Response:
        meta = current["metadata"]
        namespace, name, uid = meta.get("namespace"), meta["name"], meta["uid"]
        if resource.plural == "namespaces":
            if name in UNDELETABLE_NAMESPACES:
                raise errors.forbidden("namespaces", name, "this namespace may not be deleted")
            if meta.get("deletionTimestamp"):
                return Response(200, current)

            def terminate(draft: Obj) -> None:
                draft["metadata"]["deletionTimestamp"] = now_rfc3339()
                draft["metadata"]["deletionGracePeriodSeconds"] = 0
                draft.setdefault("status", {})["phase"] = "Terminating"
            # The namespace controller finishes the job (see controllers.py).
            return Response(200, self.store.mutate(resource, None, name, terminate, uid))
        if resource.plural == "pods":
            # The kubelet's part (graceful stop, then removal) is in controllers.py.
            return Response(200, delete_pod(self.store, self.config, self.faults, current,
                                            grace))
        obj, removed = self.store.delete_or_mark(resource, namespace, name, uid)
        if not removed:
            return Response(200, obj)  # finalizers hold it: marked, still readable
        return Response(200, errors.success_status(name, resource.plural, obj["metadata"]["uid"],
                                                   resource.group))

    def _delete_collection(self, req: Request, route: Route) -> Response:
        resource = route.resource
        matcher = combined(req.query.get("labelSelector"), req.query.get("fieldSelector"),
                           resource)
        options = self._body(req, required=False) or {}
        grace = options.get("gracePeriodSeconds") if isinstance(options, dict) else None
        deleted = []
        with self.store.lock:
            items, _ = self.store.list(resource.plural, route.namespace, matcher)
            for obj in items:
                if resource.plural == "namespaces" and obj["metadata"]["name"] in \
                        UNDELETABLE_NAMESPACES:
                    continue
                if req.query.get("dryRun"):
                    deleted.append(obj)
                    continue
                response = self._delete_locked(resource, obj, grace)
                deleted.append(response.body if response.body.get("kind") == resource.kind
                               else obj)
            rv = self.store.current_rv
        return Response(200, {"kind": resource.list_kind, "apiVersion": resource.api_version,
                              "metadata": {"resourceVersion": str(rv)}, "items": deleted})

    # -- special endpoints ------------------------------------------------------------------
    def _token_request(self, req: Request, route: Route) -> Response:
        sa = self.store.require(route.resource, route.namespace, str(route.name))
        body = self._body(req, required=False) or {}
        spec = dict(body.get("spec") or {}) if isinstance(body, dict) else {}
        audiences = spec.get("audiences") or ["https://kubernetes.default.svc.cluster.local"]
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise errors.invalid("TokenRequest", str(route.name), [
                ("spec.expirationSeconds", "FieldValueInvalid",
                 f"Invalid value: {seconds}: may not specify a duration less than 10 minutes")],
                "authentication.k8s.io")
        if seconds > 2 ** 32:
            raise errors.invalid("TokenRequest", str(route.name), [
                ("spec.expirationSeconds", "FieldValueTooLong",
                 f"Invalid value: {seconds}: may not specify a duration larger than 2^32"
                 " seconds")], "authentication.k8s.io")
        token, expires = self.authority.issue_request_token(
            str(route.namespace), str(route.name), sa["metadata"]["uid"], list(audiences),
            seconds)
        spec.update({"audiences": list(audiences), "expirationSeconds": seconds})
        spec.setdefault("boundObjectRef", None)
        stamp = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return Response(201, {
            "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": route.name, "namespace": route.namespace,
                         "creationTimestamp": now_rfc3339()},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": stamp},
        })

    def _token_review(self, req: Request) -> Response:
        body = self._body(req)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be a JSON object")
        token = (body.get("spec") or {}).get("token", "")
        who = self.authority.authenticate_token(str(token)) if token else None
        status: Obj = {"authenticated": who is not None}
        if who is not None:
            status["user"] = who.as_user_info()
        else:
            status["error"] = "invalid bearer token"
        return Response(201, {"kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
                              "metadata": {"creationTimestamp": None},
                              "spec": body.get("spec") or {}, "status": status})

    # -- errors -----------------------------------------------------------------------------
    @staticmethod
    def _quota_error(req: Request, obj: Obj | None = None) -> errors.ApiError:
        name = ""
        if obj is not None:
            name = obj["metadata"].get("name", "")
        else:
            try:
                name = json.loads(req.body or b"{}").get("metadata", {}).get("name", "")
            except (ValueError, AttributeError):
                pass
        return errors.forbidden(
            "pods", name,
            "exceeded quota: compute-quota, requested: limits.cpu=1,pods=1, "
            "used: limits.cpu=16,pods=10, limited: limits.cpu=16,pods=10")

    @staticmethod
    def _rbac_forbidden(identity: Identity, verb: str, route: Route,
                        resource_key: str) -> errors.ApiError:
        where = (f' in the namespace "{route.namespace}"' if route.namespace
                 else " at the cluster scope")
        return errors.forbidden(
            route.resource.plural, route.name or "",
            f'User "{identity.username}" cannot {verb} resource "{resource_key}" in API group '
            f'"{route.resource.group}"{where}', route.resource.group)


def system_namespace_objects() -> list[Obj]:
    return [{"metadata": {"name": name}} for name in SYSTEM_NAMESPACES]
