"""The Kubernetes objects the driver sends, as TypedDicts holding exactly what it sets.

Owns: the shapes of the bodies `manifests`, `guards` and `pull_secrets` build for a node
(Namespace, ServiceAccount, TokenRequest, Role, RoleBinding, Pod, ResourceQuota,
LimitRange, NetworkPolicy, the copy of an image pull Secret) and the Events `events`
sends, so mypy checks every key and value the driver writes. The only Secrets the driver
creates are those copies (a node's token comes from a TokenRequest).

Pure types: the classic client sends these dicts verbatim, and nothing checks them at run
time. What the API server answers is not one of these (it adds uid, status, defaults, and
anybody may have changed the object): answers are read as plain mappings, defensively.
Operator data passed through as is (a verbatim pod spec, env entries, volumes,
tolerations) stays a plain JSON object: its shape is the schema's and the API server's
business, not ours.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

# A verbatim pod spec (a label's `spec`): the operator's, passed through unchanged.
VerbatimPodSpec = dict[str, Any]
# Kubernetes-shaped config entries copied into a body as they are (env, volumes, ...).
JsonObject = dict[str, Any]


class ObjectMeta(TypedDict):
    name: str
    labels: dict[str, str]
    namespace: NotRequired[str]
    annotations: NotRequired[dict[str, str]]
    finalizers: NotRequired[list[str]]


class _Object(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta


class Namespace(_Object):
    pass


class ServiceAccount(_Object):
    pass


class TokenRequestSpec(TypedDict):
    audiences: list[str]
    expirationSeconds: int


class TokenRequest(TypedDict):
    apiVersion: str
    kind: str
    spec: TokenRequestSpec


class PolicyRule(TypedDict):
    apiGroups: list[str]
    resources: list[str]
    verbs: list[str]
    resourceNames: NotRequired[list[str]]


class Role(_Object):
    rules: list[PolicyRule]


class RoleRef(TypedDict):
    apiGroup: str
    kind: str
    name: str


class Subject(TypedDict):
    kind: str  # "ServiceAccount" | "User"
    name: str
    namespace: NotRequired[str]  # a service account's
    apiGroup: NotRequired[str]  # a user's


class RoleBinding(_Object):
    roleRef: RoleRef
    subjects: list[Subject]


class ResourceRequirements(TypedDict, total=False):
    requests: dict[str, str]
    limits: dict[str, str]


class SecurityContext(TypedDict):
    privileged: bool


class Container(TypedDict):
    name: str
    image: str | None
    imagePullPolicy: str
    command: list[str]
    args: list[str]
    env: NotRequired[list[JsonObject]]
    resources: NotRequired[ResourceRequirements]
    volumeMounts: NotRequired[list[JsonObject]]
    securityContext: NotRequired[SecurityContext]


class NodeSelectorRequirement(TypedDict):
    key: str
    operator: str
    values: NotRequired[list[str]]


class NodeSelectorTerm(TypedDict):
    matchExpressions: list[NodeSelectorRequirement]


class NodeSelector(TypedDict):
    nodeSelectorTerms: list[NodeSelectorTerm]


class PreferredSchedulingTerm(TypedDict):
    weight: int
    preference: NodeSelectorTerm


class NodeAffinity(TypedDict, total=False):
    requiredDuringSchedulingIgnoredDuringExecution: NodeSelector
    preferredDuringSchedulingIgnoredDuringExecution: list[PreferredSchedulingTerm]


class Affinity(TypedDict):
    nodeAffinity: NodeAffinity


class LocalObjectReference(TypedDict):
    name: str


class PodSpec(TypedDict):
    """The spec of a form-A pod: one sleeping container."""

    containers: list[Container]
    restartPolicy: str
    nodeSelector: NotRequired[JsonObject]
    schedulerName: NotRequired[str]
    tolerations: NotRequired[list[JsonObject]]
    affinity: NotRequired[Affinity]
    volumes: NotRequired[list[JsonObject]]
    imagePullSecrets: NotRequired[list[LocalObjectReference]]


class Pod(_Object):
    spec: PodSpec | VerbatimPodSpec


class Secret(_Object):
    """The copy of an operator's image pull Secret: its type and data, our labels."""

    type: str
    data: dict[str, str]


class ResourceQuotaSpec(TypedDict):
    hard: dict[str, str]


class ResourceQuota(_Object):
    spec: ResourceQuotaSpec


class LimitRangeItem(TypedDict):
    type: str
    default: NotRequired[dict[str, str]]
    defaultRequest: NotRequired[dict[str, str]]


class LimitRangeSpec(TypedDict):
    limits: list[LimitRangeItem]


class LimitRange(_Object):
    spec: LimitRangeSpec


class LabelSelector(TypedDict, total=False):
    matchLabels: dict[str, str]


class IPBlock(TypedDict):
    cidr: str


class NetworkPolicyPeer(TypedDict, total=False):
    namespaceSelector: LabelSelector
    podSelector: LabelSelector
    ipBlock: IPBlock


class NetworkPolicyPort(TypedDict):
    protocol: str
    port: int


class NetworkPolicyEgressRule(TypedDict):
    to: list[NetworkPolicyPeer]
    ports: NotRequired[list[NetworkPolicyPort]]


class NetworkPolicySpec(TypedDict):
    podSelector: LabelSelector
    policyTypes: list[str]
    egress: list[NetworkPolicyEgressRule]


class NetworkPolicy(_Object):
    spec: NetworkPolicySpec


class ObjectReference(TypedDict):
    apiVersion: str
    kind: str  # "Pod" | "Namespace"
    name: str
    namespace: NotRequired[str]


class EventSource(TypedDict):
    component: str
    host: str


class Event(_Object):
    involvedObject: ObjectReference
    reason: str
    message: str
    type: str  # "Normal" | "Warning"
    source: EventSource
    reportingComponent: str
    reportingInstance: str
    firstTimestamp: str
    lastTimestamp: str
    count: int


# An object the driver creates inside a node's namespace (every one has metadata).
NamespacedBody = (ServiceAccount | Role | RoleBinding | Pod | ResourceQuota | LimitRange
                  | NetworkPolicy | Secret)
