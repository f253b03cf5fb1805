"""Pure builders for the objects that fence a node's namespace in (see doc/security.md).

Owns: the Pod Security admission labels of the namespace, the ResourceQuota and LimitRange
derived from the label's requests and limits (what the launcher counted against max-cores
and max-ram is what the namespace may use) plus its object counts (`object-quota`), the
optional default-deny egress NetworkPolicy, and the RoleBinding to a pre-created
ClusterRole (`job-role: cluster-role`, the ClusterRole chosen by label type and
`allow-job-secrets`). Like `manifests`, nothing here does I/O; a builder returns None when
its object is not wanted.
"""

from __future__ import annotations

from typing import Mapping

from nodepool_k8s.config.model import PoolLabel
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.bodies import (
    LimitRange, LimitRangeItem, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer,
    NetworkPolicyPort, ResourceQuota, RoleBinding)

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
WARN_LABEL = "pod-security.kubernetes.io/warn"
QUOTA_NAME = "nodepool-quota"
LIMIT_RANGE_NAME = "nodepool-defaults"
NETWORK_POLICY_NAME = "nodepool-egress"
# The ClusterRoles etc/kubernetes/launcher-rbac.yaml ships (same rules as the Roles).
CLUSTER_ROLES = {"namespace": "nodepool-zuul", "namespace-secrets": "nodepool-zuul-with-secrets",
                 "pod": "nodepool-zuul-restricted"}


def cluster_role_name(label: PoolLabel) -> str:
    """The shipped ClusterRole whose rules are `manifests.job_rules(label)`."""
    if label.type == "pod":
        return CLUSTER_ROLES["pod"]
    return CLUSTER_ROLES["namespace-secrets" if label.allow_job_secrets else "namespace"]


# Container defaults for pods a job creates without requests/limits (capped by the quota):
# small requests so several such pods fit, limits so that one cannot take everything.
DEFAULT_REQUEST = {"cpu": 0.1, "memory": 128, "storage": 100}
DEFAULT_LIMIT = {"cpu": 1.0, "memory": 512, "storage": 1000}

# kube-dns / CoreDNS in kube-system, as every distribution labels it.
DNS_PEER: NetworkPolicyPeer = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS: list[NetworkPolicyPort] = [{"protocol": "UDP", "port": 53},
                                      {"protocol": "TCP", "port": 53}]


def namespace_labels(label: PoolLabel) -> dict[str, str]:
    """Pod Security admission: enforce the label's level (and warn at it, for kubectl)."""
    return {ENFORCE_LABEL: label.pod_security, WARN_LABEL: label.pod_security}


def _amounts(label: PoolLabel) -> tuple[dict[str, float], dict[str, float]]:
    """(requests, limits) by cpu/memory/storage; a limit not configured is the request."""
    requests = {k: float(v) for k, v in (("cpu", label.cpu), ("memory", label.memory),
                                         ("storage", label.storage)) if v is not None}
    configured = {"cpu": label.cpu_limit, "memory": label.memory_limit,
                  "storage": label.storage_limit}
    limits = dict(requests)
    for key, value in configured.items():
        if value is not None:
            limits[key] = float(value)
    return requests, limits


def _quantity(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{int(value)}Mi"
    if resource == "storage":
        return f"{int(value)}M"
    return manifests.quantity(value)


_NAMES = {"cpu": "cpu", "memory": "memory", "storage": "ephemeral-storage"}


# `object-quota` entry -> ResourceQuota `hard` key (object counts, and PVC storage in MB).
OBJECT_QUOTA_KEYS = {"pods": "pods", "services": "services", "secrets": "secrets",
                     "configmaps": "configmaps",
                     "persistentvolumeclaims": "persistentvolumeclaims",
                     "storage": "requests.storage"}


def quota_hard(label: PoolLabel) -> dict[str, str]:
    """The ResourceQuota's `hard`: requests.* and limits.* from the label, GPUs (unless
    `resource-quota: false`), the object counts and PVC storage of `object-quota`, and no
    LoadBalancer/NodePort services unless `allow-external-services`."""
    hard: dict[str, str] = {}
    if label.resource_quota:
        hard.update(_compute_hard(label))
    # Its own guard too: counts protect the API server's storage and the volume backend,
    # which `resource-quota: false` (compute) does not speak for.
    for key, value in label.object_quota.items():
        hard[OBJECT_QUOTA_KEYS[key]] = f"{int(value)}M" if key == "storage" else str(value)
    if not label.allow_external_services:
        # Its own guard: `resource-quota: false` lifts the compute limits, not this.
        hard["services.loadbalancers"] = "0"
        hard["services.nodeports"] = "0"
    return hard


def _compute_hard(label: PoolLabel) -> dict[str, str]:
    requests, limits = _amounts(label)
    hard: dict[str, str] = {}
    for key, value in requests.items():
        hard[f"requests.{_NAMES[key]}"] = _quantity(key, value)
    for key, value in limits.items():
        hard[f"limits.{_NAMES[key]}"] = _quantity(key, value)
    if label.gpu is not None and label.gpu_resource:
        # Extended resources are quota'd by request only (requests == limits for them).
        hard[f"requests.{label.gpu_resource}"] = manifests.quantity(label.gpu)
    return hard


def resource_quota_body(namespace: str, label: PoolLabel,
                        labels: Mapping[str, str]) -> ResourceQuota | None:
    hard = quota_hard(label)
    if not hard:
        return None
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": namespace, "labels": dict(labels)},
            "spec": {"hard": hard}}


def limit_range_body(namespace: str, label: PoolLabel,
                     labels: Mapping[str, str]) -> LimitRange | None:
    """Defaults for containers without requests/limits, so the quota does not refuse them
    for "must specify"; None when there is no compute quota."""
    if not label.resource_quota:
        return None
    requests, limits = _amounts(label)
    if not requests and not limits:
        return None
    default_request = {_NAMES[k]: _quantity(k, min(DEFAULT_REQUEST[k], v))
                       for k, v in requests.items()}
    default_limit = {_NAMES[k]: _quantity(k, min(DEFAULT_LIMIT[k], v))
                     for k, v in limits.items()}
    for key, value in requests.items():
        # A default request above the default limit would make such containers invalid.
        if key in limits and min(DEFAULT_REQUEST[key], value) > min(DEFAULT_LIMIT[key],
                                                                    limits[key]):
            default_request[_NAMES[key]] = default_limit[_NAMES[key]]
    item: LimitRangeItem = {"type": "Container"}
    if default_limit:
        item["default"] = default_limit
    if default_request:
        item["defaultRequest"] = default_request
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": LIMIT_RANGE_NAME, "namespace": namespace,
                         "labels": dict(labels)},
            "spec": {"limits": [item]}}


def network_policy_body(namespace: str, label: PoolLabel,
                        labels: Mapping[str, str]) -> NetworkPolicy | None:
    """Default-deny egress for every pod of the namespace, except DNS to kube-dns and the
    label's `egress-allow` CIDRs. Ingress is left alone."""
    if not label.network_policy:
        return None
    egress: list[NetworkPolicyEgressRule] = [{"to": [DNS_PEER], "ports": list(DNS_PORTS)}]
    if label.egress_allow:
        egress.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in label.egress_allow]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": NETWORK_POLICY_NAME, "namespace": namespace,
                         "labels": dict(labels)},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": egress}}


def own_quota_refusal(message: str) -> bool:
    """Whether a 403 "exceeded quota" names the namespace's own quota (not a cluster one)."""
    return f"exceeded quota: {QUOTA_NAME}" in message


def cluster_role_binding_body(namespace: str, label: PoolLabel,
                              labels: Mapping[str, str]) -> RoleBinding:
    """The node's RoleBinding to the pre-created ClusterRole of its label type."""
    body = manifests.role_binding_body(namespace, label, labels)
    body["roleRef"] = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                       "name": cluster_role_name(label)}
    return body
