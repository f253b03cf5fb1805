"""The resource types the simulator serves and how they appear in discovery.

Owns: one `ResourceType` per served resource (plural, kind, group/version, scope, verbs, short
names, field labels usable in fieldSelector, subresources) and lookup helpers. Everything else
(routing, discovery documents, store) is driven by this table, so adding a resource mostly
means adding a row here and, if it needs checks, a validator in `validation.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

RBAC_GROUP = "rbac.authorization.k8s.io"
AUTHN_GROUP = "authentication.k8s.io"
NETWORKING_GROUP = "networking.k8s.io"
ADMISSION_GROUP = "admissionregistration.k8s.io"

_CRUD = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_COMMON_FIELDS = ("metadata.name", "metadata.namespace")


@dataclass(frozen=True)
class ResourceType:
    plural: str
    kind: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = _CRUD
    categories: tuple[str, ...] = ()
    # Extra field paths (beyond metadata.name/namespace) the real server accepts in fieldSelector.
    field_labels: tuple[str, ...] = ()
    # Subresources that read/write part of the parent object (e.g. pods/status).
    subresources: tuple[str, ...] = ()
    # Deleting returns the object itself (pods, namespaces) rather than a Status.
    returns_deleted_object: bool = False
    # Names follow the RBAC "path segment" rule instead of DNS-1123.
    path_segment_names: bool = False
    singular: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    def supports_field(self, path: str) -> bool:
        if path == "metadata.namespace" and not self.namespaced:
            return True  # the real server accepts it (always matches "") for cluster scope
        return path in _COMMON_FIELDS or path in self.field_labels


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("namespaces", "Namespace", namespaced=False, short_names=("ns",),
                 verbs=("create", "delete", "get", "list", "patch", "update", "watch"),
                 field_labels=("status.phase",), subresources=("status",),
                 returns_deleted_object=True),
    ResourceType("pods", "Pod", short_names=("po",), categories=("all",),
                 field_labels=("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                               "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
                               "status.podIP", "status.nominatedNodeName"),
                 subresources=("status",), returns_deleted_object=True),
    ResourceType("serviceaccounts", "ServiceAccount", short_names=("sa",),
                 subresources=("token",)),
    ResourceType("secrets", "Secret", field_labels=("type",)),
    ResourceType("configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("endpoints", "Endpoints", short_names=("ep",), singular="endpoints"),
    ResourceType("persistentvolumeclaims", "PersistentVolumeClaim", short_names=("pvc",),
                 subresources=("status",)),
    ResourceType("nodes", "Node", namespaced=False, short_names=("no",),
                 field_labels=("spec.unschedulable",), subresources=("status",)),
    ResourceType("services", "Service", short_names=("svc",), categories=("all",),
                 field_labels=("spec.clusterIP", "spec.type"), subresources=("status",)),
    ResourceType("events", "Event", short_names=("ev",),
                 field_labels=("involvedObject.kind", "involvedObject.name",
                               "involvedObject.namespace", "reason", "type")),
    ResourceType("resourcequotas", "ResourceQuota", short_names=("quota",),
                 subresources=("status",)),
    ResourceType("limitranges", "LimitRange", short_names=("limits",)),
    ResourceType("networkpolicies", "NetworkPolicy", group=NETWORKING_GROUP,
                 short_names=("netpol",)),
    ResourceType("deployments", "Deployment", group="apps", short_names=("deploy",),
                 categories=("all",), subresources=("status",)),
    ResourceType("roles", "Role", group=RBAC_GROUP, path_segment_names=True),
    ResourceType("rolebindings", "RoleBinding", group=RBAC_GROUP, path_segment_names=True),
    ResourceType("clusterroles", "ClusterRole", group=RBAC_GROUP, namespaced=False,
                 path_segment_names=True),
    ResourceType("clusterrolebindings", "ClusterRoleBinding", group=RBAC_GROUP,
                 namespaced=False, path_segment_names=True),
    ResourceType("validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 group=ADMISSION_GROUP, namespaced=False, subresources=("status",)),
    ResourceType("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                 group=ADMISSION_GROUP, namespaced=False),
    ResourceType("tokenreviews", "TokenReview", group=AUTHN_GROUP, namespaced=False,
                 verbs=("create",)),
    ResourceType("selfsubjectreviews", "SelfSubjectReview", group=AUTHN_GROUP,
                 namespaced=False, verbs=("create",)),
)

BY_PLURAL: dict[str, ResourceType] = {r.plural: r for r in RESOURCES}

# Kinds answered, never stored.
REVIEWS = ("tokenreviews", "selfsubjectreviews")
# Kinds that live in the object store.
STORED: tuple[str, ...] = tuple(r.plural for r in RESOURCES if r.plural not in REVIEWS)

# group/version -> resources served under it
GROUP_VERSIONS: dict[str, tuple[ResourceType, ...]] = {}
for _r in RESOURCES:
    GROUP_VERSIONS[_r.api_version] = GROUP_VERSIONS.get(_r.api_version, ()) + (_r,)


def lookup(group_version: str, plural: str) -> ResourceType | None:
    """The resource `plural` served under `group_version` ("v1", "rbac.../v1"), if any."""
    for r in GROUP_VERSIONS.get(group_version, ()):
        if r.plural == plural:
            return r
    return None


def by_plural(plural: str) -> ResourceType:
    """The resource type for a plural name; KeyError for resources the simulator lacks."""
    try:
        return BY_PLURAL[plural]
    except KeyError:
        raise KeyError(f"the simulator does not serve {plural!r}; known: "
                       f"{', '.join(STORED)}") from None
