"""Pure builders for every Kubernetes object a node needs, as plain JSON-ready dicts.

Owns: naming (namespace, pod, container), ownership labels, `dynamic-labels` formatting,
the RBAC rules per label type (and `allow-job-secrets`) and the pod body for both label
forms (with the `imagePullSecrets` of the label's pull Secrets). Nothing here does I/O or
mutates its inputs (config mappings are deep-copied into the bodies). The only failure is
a `dynamic-labels` template that cannot be formatted: it is logged and that key skipped.

Bodies are dicts, not client model objects: the classic client (kubernetes==36.0.3) sends
dicts verbatim, and tests can compare them to what the API server stored.
"""

from __future__ import annotations

import copy
import logging
import re
from decimal import Decimal
from typing import Any, Mapping

from nodepool_k8s.config.model import PoolLabel
from nodepool_k8s.driver.base import LaunchSpec, RequestInfo
from nodepool_k8s.driver.kubernetes.bodies import (
    Container, Namespace, NodeAffinity, NodeSelectorRequirement,
    ObjectMeta, Pod, PodSpec, PolicyRule, ResourceRequirements, Role, RoleBinding,
    ServiceAccount, Subject, TokenRequest, VerbatimPodSpec)

log = logging.getLogger(__name__)

# -- fixed names (Zuul's executor reads `user`; operators know the rest from Nodepool) --------

SERVICE_ACCOUNT = "zuul-worker"
ROLE_BINDING = "zuul-role"
NAMESPACE_ROLE = "zuul"
POD_ROLE = "zuul-restricted"
# The audience a TokenRequest token is issued for: the API server's own (its default).
TOKEN_AUDIENCE = "https://kubernetes.default.svc.cluster.local"

# Ownership labels: list_resources and the shared watches select on PROVIDER_LABEL and
# INSTALLATION_LABEL together; a delete requires both (and NODE_ID_LABEL for a node's).
NODE_ID_LABEL = "nodepool_node_id"
PROVIDER_LABEL = "nodepool_provider_name"
INSTALLATION_LABEL = "nodepool_installation_id"
POOL_LABEL = "nodepool_pool_name"
NODE_LABEL_LABEL = "nodepool_node_label"

SLEEP_COMMAND = ["/bin/sh", "-c"]
SLEEP_ARGS = ["while true; do sleep 30; done;"]

ALL_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
READ_VERBS = ["get", "list", "watch"]

# `namespace` labels: the job owns the namespace and deploys workloads into it. A subset of
# upstream's `edit` role (doc/security.md lists every right and why): workload kinds a CI job
# plausibly deploys; no RBAC objects (a job cannot widen its own rights); no
# resourcequotas/limitranges/networkpolicies (it cannot lift its fences); endpoints and
# endpointslices read-only (written by hand they point a Service, and so an Ingress or load
# balancer, at any address: CVE-2021-25740); no serviceaccounts or serviceaccounts/token
# (it cannot mint tokens). Secrets are a separate rule, granted only with
# `allow-job-secrets`: a job that may create Secrets may create a
# `kubernetes.io/service-account-token` one, which the token controller fills with a token
# that never expires (etc/kubernetes/job-policy.yaml refuses those where it is applied).
NAMESPACE_RULES: list[PolicyRule] = [
    {"apiGroups": [""],
     "resources": ["pods", "pods/exec", "pods/portforward", "pods/attach", "services",
                   "configmaps", "persistentvolumeclaims"],
     "verbs": ALL_VERBS},
    {"apiGroups": [""], "resources": ["pods/log", "endpoints", "events"],
     "verbs": READ_VERBS},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ_VERBS},
    {"apiGroups": ["apps"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"],
     "verbs": ALL_VERBS},
    {"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": ALL_VERBS},
]
SECRETS_RULE: PolicyRule = {"apiGroups": [""], "resources": ["secrets"], "verbs": ALL_VERBS}
# `namespace` labels with `allow-job-secrets: true`.
NAMESPACE_RULES_WITH_SECRETS: list[PolicyRule] = [*NAMESPACE_RULES, SECRETS_RULE]

# `pod` labels: the job only drives the one pod Nodepool made (Ansible's kubectl connection
# execs into it, the executor port-forwards for log streaming, kubectl logs reads pods/log).
POD_RULES: list[PolicyRule] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": READ_VERBS},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/portforward"], "verbs": ["create", "get"]},
]

# What the launcher may do inside a node namespace to clear it when it stays Terminating
# (`job-role: cluster-role`; see doc/security.md): a RoleBinding there grants the shipped
# ClusterRole CLEANUP_CLUSTER_ROLE to the launcher itself, and HOLD_FINALIZER keeps that
# binding (and so those rights) until the launcher is done with the namespace.
CLEANUP_BINDING = "nodepool-cleanup"
CLEANUP_CLUSTER_ROLE = "nodepool-launcher-cleanup"
HOLD_FINALIZER = "nodepool-k8s.zuul-ci.org/cleanup-rights"
RBAC_GROUP = "rbac.authorization.k8s.io"

_DNS_LABEL_MAX = 63
_LABEL_VALUE_MAX = 63
# \Z, not $: $ also matches before a trailing newline, which the API server refuses.
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")


# -- naming ------------------------------------------------------------------------------------

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")


def is_namespace_name(name: str) -> bool:
    """Whether `name` can name a namespace at all (an RFC 1123 label, <= 63 characters)."""
    return len(name) <= _DNS_LABEL_MAX and _DNS_LABEL.match(name) is not None


def dns_label(text: str, max_len: int = _DNS_LABEL_MAX) -> str:
    """`text` as an RFC 1123 label: lower case, [a-z0-9-], alphanumeric at both ends."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", text.lower())[:max_len].strip("-")
    return cleaned or "x"


def label_value(value: Any) -> str:
    """`value` as a valid label value (<= 63 chars of [A-Za-z0-9_.-], alnum at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(value))[:_LABEL_VALUE_MAX]
    return cleaned.strip("_.-")


def namespace_name(pool: str, node_id: str, attempt: int = 1, suffix: str = "") -> str:
    """`<pool>-<node id>` on attempt 1, `<pool>-<node id>-<attempt>` afterwards.

    A retry must never reuse a name whose namespace may still be Terminating (Nodepool got
    409s there). `suffix` (random, "r" + hex) is added only if even that name is taken.
    The pool part is shortened, never the node id, so `parse_namespace_name` still recovers
    the id.
    """
    tail = "-" + dns_label(node_id)
    if attempt > 1:
        tail += f"-{attempt}"
    if suffix:
        tail += "-" + dns_label(suffix)
    prefix = dns_label(pool, max(1, _DNS_LABEL_MAX - len(tail)))
    return prefix + tail


# Greedy pool, 10+ digit node id: "pool-1-0000000000-2" is pool "pool-1", attempt 2.
_NAME_RE = re.compile(r"^(?P<pool>.+)-(?P<node>\d{10,})(?:-(?P<attempt>\d+))?"
                      r"(?:-(?P<suffix>r[0-9a-f]+))?$")


def parse_namespace_name(name: str) -> tuple[str, str, int] | None:
    """(pool, node id, attempt) of a name made by `namespace_name`, or None."""
    match = _NAME_RE.match(name)
    if not match:
        return None
    return match["pool"], match["node"], int(match["attempt"] or 1)


def pod_name(label: PoolLabel) -> str:
    """The pod is named after the label (Zuul's executor reads it back as `pod`)."""
    if len(label.name) <= 253 and _DNS_SUBDOMAIN.match(label.name):
        return label.name
    return dns_label(label.name)


# -- labels ------------------------------------------------------------------------------------

class _RequestView(dict):  # type: ignore[type-arg]
    """The request for `str.format`: both `{request.tenant_name}` and `{request[id]}` work."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def request_view(request: RequestInfo) -> _RequestView:
    return _RequestView(
        id=request.id, labels=list(request.labels), requestor=request.requestor,
        requestor_data=request.requestor_data, relative_priority=request.relative_priority,
        event_id=request.event_id, created_time=request.created_time,
        tenant_name=request.tenant_name)


def format_dynamic_labels(templates: Mapping[str, str], request: RequestInfo) -> dict[str, str]:
    """Each template formatted with `request`; a template that fails is logged and skipped."""
    view = request_view(request)
    out: dict[str, str] = {}
    for key, template in templates.items():
        try:
            out[key] = str(template).format(request=view)
        except (KeyError, AttributeError, IndexError, ValueError, TypeError) as exc:
            log.warning("Skipping dynamic label %s=%r for request %s: %s: %s", key, template,
                        request.id, type(exc).__name__, exc)
    return out


def ownership_labels(spec: LaunchSpec) -> dict[str, str]:
    """The labels that mark an object as ours (installation, provider) and whose node it is."""
    return {
        NODE_ID_LABEL: label_value(spec.node_id),
        PROVIDER_LABEL: label_value(spec.provider.name),
        INSTALLATION_LABEL: label_value(spec.provider.installation_id),
        POOL_LABEL: label_value(spec.pool.name),
        NODE_LABEL_LABEL: label_value(spec.label.name),
    }


def object_labels(spec: LaunchSpec) -> dict[str, str]:
    """Label `labels` + formatted `dynamic-labels` + ownership labels (ours win)."""
    labels = {key: label_value(value) for key, value in spec.label.labels.items()}
    for key, value in format_dynamic_labels(spec.label.dynamic_labels, spec.request).items():
        labels[key] = label_value(value)
    labels.update(ownership_labels(spec))
    return labels


def provider_selector(provider_name: str, installation_id: str) -> str:
    """Selects the objects of this provider of this installation only."""
    return (f"{PROVIDER_LABEL}={label_value(provider_name)},"
            f"{INSTALLATION_LABEL}={label_value(installation_id)}")


def ownership_problem(obj: Mapping[str, Any], provider_name: str, installation_id: str,
                      node_id: str | None = None) -> str | None:
    """Why `obj` (a namespace as read) is not provably ours; None when it is.

    Ours = our provider label and our installation label, and, when `node_id` is given,
    the node-id label naming that node. Used before every DELETE.
    """
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    labels = (meta.get("labels") if isinstance(meta, Mapping) else None) or {}
    if not isinstance(labels, Mapping):
        # What the server answered is data from outside too: not provably ours.
        return f"its labels are not a mapping ({type(labels).__name__})"
    wanted = [(PROVIDER_LABEL, label_value(provider_name)),
              (INSTALLATION_LABEL, label_value(installation_id))]
    if node_id is not None:
        wanted.append((NODE_ID_LABEL, label_value(node_id)))
    for key, value in wanted:
        found = labels.get(key)
        if found != value:
            return (f"label {key} is {found!r}, not {value!r}" if found is not None
                    else f"it has no label {key} (want {value!r})")
    return None


def _labels(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    return str(meta.get("name") or ""), labels if isinstance(labels, Mapping) else {}


def created_namespace_problem(obj: Mapping[str, Any], provider_name: str,
                              installation_id: str) -> str | None:
    """Why `obj` is not a namespace the launcher created for a node; None when it is.

    Created = our provider and installation labels, a node-id label, and a name as
    `namespace_name` makes it for that node id. Nothing but the launcher can create
    namespaces with our labels (the node Roles grant no namespaces), and this holds after a
    restart too: it needs nothing but the object.
    """
    problem = ownership_problem(obj, provider_name, installation_id)
    if problem is not None:
        return problem
    name, labels = _labels(obj)
    node_id = labels.get(NODE_ID_LABEL)
    parsed = parse_namespace_name(name)
    if parsed is None or parsed[1] != node_id:
        return (f"its name {name[:80]!r} is not one made for its node-id label "
                f"{str(node_id)[:80]!r}")
    return None


def created_pod_problem(obj: Mapping[str, Any], provider_name: str, installation_id: str,
                        expected_name: str | None) -> str | None:
    """Why `obj` is not the pod the launcher created for a node; None when it is.

    `expected_name`: the name the launcher gave the pod of the node whose namespace `obj`
    is in (None: the launcher made no pod there, as for a `namespace` label's node, whose
    job may create any pod with any labels in it). Besides that name: our provider and
    installation labels, and a node-id label naming the node of the namespace's name.
    """
    problem = ownership_problem(obj, provider_name, installation_id)
    if problem is not None:
        return problem
    name, labels = _labels(obj)
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    namespace = str(meta.get("namespace") or "") if isinstance(meta, Mapping) else ""
    if expected_name is None:
        return f"the launcher made no pod in namespace {namespace[:80]!r}"
    if name != expected_name:
        return f"its name {name[:80]!r} is not {expected_name!r}"
    parsed = parse_namespace_name(namespace)
    if parsed is None or parsed[1] != labels.get(NODE_ID_LABEL):
        return f"its node-id label does not name the node of namespace {namespace[:80]!r}"
    return None


# -- namespace and access objects --------------------------------------------------------------

def _meta(name: str, labels: Mapping[str, str], namespace: str | None = None,
          annotations: Mapping[str, str] | None = None) -> ObjectMeta:
    meta: ObjectMeta = {"name": name, "labels": dict(labels)}
    if namespace is not None:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


CONFIG_HASH_ANNOTATION = "nodepool_config_hash"


def namespace_body(name: str, labels: Mapping[str, str],
                   annotations: Mapping[str, str] | None = None) -> Namespace:
    """The node's namespace; a namespace label's `annotations` are set on it."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": _meta(name, labels, annotations=annotations)}


def service_account_body(namespace: str, labels: Mapping[str, str]) -> ServiceAccount:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _meta(SERVICE_ACCOUNT, labels, namespace)}


def token_request_body(lifetime: int) -> TokenRequest:
    """A TokenRequest for the service account: a bound token expiring after `lifetime` s."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"audiences": [TOKEN_AUDIENCE], "expirationSeconds": int(lifetime)}}


def role_name(label: PoolLabel) -> str:
    return POD_ROLE if label.type == "pod" else NAMESPACE_ROLE


def role_rules(label: PoolLabel) -> list[PolicyRule]:
    # A fresh copy per Role (callers may change it), made by hand: each rule is flat
    # (lists of strings), and `copy.deepcopy` cost more than the rest of the Role's body.
    return [_copy_rule(rule) for rule in job_rules(label)]


def _copy_rule(rule: PolicyRule) -> PolicyRule:
    copied: PolicyRule = {"apiGroups": list(rule["apiGroups"]),
                          "resources": list(rule["resources"]), "verbs": list(rule["verbs"])}
    if "resourceNames" in rule:
        copied["resourceNames"] = list(rule["resourceNames"])
    return copied


def job_rules(label: PoolLabel) -> list[PolicyRule]:
    """The shared (not copied) rules of a job of `label`: see the constants above."""
    if label.type == "pod":
        return POD_RULES
    return NAMESPACE_RULES_WITH_SECRETS if label.allow_job_secrets else NAMESPACE_RULES


def role_body(namespace: str, label: PoolLabel, labels: Mapping[str, str]) -> Role:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _meta(role_name(label), labels, namespace),
            "rules": role_rules(label)}


def job_resource_types() -> list[tuple[str, str]]:
    """(API group, resource) of every object a job can create in its namespace, read off
    the job Roles' rules (whatever can hold a finalizer the job set)."""
    found: list[tuple[str, str]] = []
    for rule in NAMESPACE_RULES_WITH_SECRETS + POD_RULES:
        if "create" not in rule["verbs"]:
            continue
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if "/" not in resource and (group, resource) not in found:
                    found.append((group, resource))
    return found


def cleanup_rules() -> list[PolicyRule]:
    """The rules of CLEANUP_CLUSTER_ROLE, the launcher's own rights inside a node namespace:
    list, get and patch (to remove finalizers) the job's kinds, delete pods (with a bounded
    grace period), and patch the binding that grants all this (to remove HOLD_FINALIZER
    last); and create Secrets there, the copies of a pod label's `image-pull-secrets` (the
    right stays inside node namespaces: held cluster-wide it would let the launcher create
    a service-account-token Secret for any account). Bound only inside node namespaces."""
    groups: dict[str, list[str]] = {}
    for group, resource in job_resource_types():
        groups.setdefault(group, []).append(resource)
    rules: list[PolicyRule] = [{"apiGroups": [group], "resources": resources,
                                "verbs": ["get", "list", "patch"]}
                               for group, resources in groups.items()]
    rules.append({"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]})
    rules.append({"apiGroups": [RBAC_GROUP], "resources": ["rolebindings"],
                  "verbs": ["patch"], "resourceNames": [CLEANUP_BINDING]})
    rules.append({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]})
    return rules


def cleanup_binding_body(namespace: str, labels: Mapping[str, str],
                         subject: Subject) -> RoleBinding:
    """The RoleBinding granting the launcher (`subject`) CLEANUP_CLUSTER_ROLE in the node's
    namespace, held by HOLD_FINALIZER until the launcher removes it."""
    meta = _meta(CLEANUP_BINDING, labels, namespace)
    meta["finalizers"] = [HOLD_FINALIZER]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole",
                        "name": CLEANUP_CLUSTER_ROLE},
            "subjects": [subject.copy()]}


def subject_of(username: str) -> Subject:
    """The RBAC subject for an authenticated user name (a service account's, or a user)."""
    parts = username.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"] and all(parts[2:]):
        return {"kind": "ServiceAccount", "name": parts[3], "namespace": parts[2]}
    return {"kind": "User", "apiGroup": RBAC_GROUP, "name": username}


def role_binding_body(namespace: str, label: PoolLabel,
                      labels: Mapping[str, str]) -> RoleBinding:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _meta(ROLE_BINDING, labels, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": role_name(label)},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT,
                          "namespace": namespace}]}


# -- pod -----------------------------------------------------------------------------------------

def plain(value: Any) -> Any:
    """A deep copy as plain JSON types (config mappings may be read-only views or tuples)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return copy.deepcopy(value)


def quantity(value: float) -> str:
    """A number as a Kubernetes quantity string: 2.0 -> "2", 0.5 -> "0.5"."""
    if float(value).is_integer():
        return str(int(value))
    return format(Decimal(str(value)).normalize(), "f")


def container_resources(label: PoolLabel) -> ResourceRequirements:
    """requests/limits: cpu as given, memory `<n>Mi`, ephemeral-storage `<n>M`, gpu in both."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if label.cpu is not None:
        requests["cpu"] = quantity(label.cpu)
    if label.memory is not None:
        requests["memory"] = f"{int(label.memory)}Mi"
    if label.storage is not None:
        requests["ephemeral-storage"] = f"{int(label.storage)}M"
    if label.cpu_limit is not None:
        limits["cpu"] = quantity(label.cpu_limit)
    if label.memory_limit is not None:
        limits["memory"] = f"{int(label.memory_limit)}Mi"
    if label.storage_limit is not None:
        limits["ephemeral-storage"] = f"{int(label.storage_limit)}M"
    if label.gpu is not None and label.gpu_resource:
        # Extended resources must be equal in requests and limits.
        requests[label.gpu_resource] = limits[label.gpu_resource] = quantity(label.gpu)
    resources: ResourceRequirements = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def _expression(requirement: Mapping[str, Any]) -> NodeSelectorRequirement:
    expression: NodeSelectorRequirement = {"key": requirement["key"],
                                           "operator": requirement["operator"]}
    if requirement.get("values"):
        expression["values"] = [str(v) for v in requirement["values"]]
    return expression


def node_affinity(label: PoolLabel) -> NodeAffinity:
    """`node-requirements` as one required term (all must hold), each
    `preferred-node-requirements` entry as its own weighted preferred term."""
    affinity: NodeAffinity = {}
    if label.node_requirements:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [
            {"matchExpressions": [_expression(r) for r in label.node_requirements]}]}
    if label.preferred_node_requirements:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": int(r["weight"]), "preference": {"matchExpressions": [_expression(r)]}}
            for r in label.preferred_node_requirements]
    return affinity


def pod_spec(label: PoolLabel) -> PodSpec | VerbatimPodSpec:
    """Form B: the configured spec, deep-copied verbatim. Form A: one sleeping container."""
    if label.spec is not None:
        verbatim: VerbatimPodSpec = plain(label.spec)
        if label.image_pull_secrets:
            # The spec's own entries stay first; the copies are added unless already named.
            named = verbatim.get("imagePullSecrets")
            refs = list(named) if isinstance(named, list) else []
            names = {ref.get("name") for ref in refs if isinstance(ref, dict)}
            refs += [{"name": pull.name} for pull in label.image_pull_secrets
                     if pull.name not in names]
            verbatim["imagePullSecrets"] = refs
        return verbatim
    container: Container = {
        "name": dns_label(label.name),
        "image": label.image,
        "imagePullPolicy": label.image_pull,
        "command": list(SLEEP_COMMAND),
        "args": list(SLEEP_ARGS),
    }
    if label.env:
        container["env"] = plain(label.env)
    resources = container_resources(label)
    if resources:
        container["resources"] = resources
    if label.volume_mounts:
        container["volumeMounts"] = plain(label.volume_mounts)
    if label.privileged is not None:
        container["securityContext"] = {"privileged": bool(label.privileged)}
    # restartPolicy belongs inside the spec (Nodepool put it beside it, where it is ignored):
    # a sleeping CI container that dies must surface as a failed pod, not restart quietly.
    spec: PodSpec = {"containers": [container], "restartPolicy": "Never"}
    if label.node_selector:
        spec["nodeSelector"] = plain(label.node_selector)
    if label.scheduler_name:
        spec["schedulerName"] = label.scheduler_name
    if label.tolerations:
        spec["tolerations"] = plain(label.tolerations)
    affinity = node_affinity(label)
    if affinity:
        spec["affinity"] = {"nodeAffinity": affinity}
    if label.volumes:
        spec["volumes"] = plain(label.volumes)
    if label.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": pull.name} for pull in label.image_pull_secrets]
    return spec


def pod_body(namespace: str, label: PoolLabel, labels: Mapping[str, str]) -> Pod:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(pod_name(label), labels, namespace, dict(label.annotations)),
            "spec": pod_spec(label)}
