"""Admission the way the real API server's built-in plugins do it, for what our driver relies on.

Owns, at the creation of pods, services, secrets, configmaps and claims (called with the store
lock held, after validation):

- Pod Security admission: the namespace label `pod-security.kubernetes.io/enforce` names the
  level (privileged, baseline, restricted; no label = privileged, as on a cluster without a
  configured default). `baseline` refuses privileged containers, host namespaces
  (hostNetwork/hostPID/hostIPC), hostPath volumes, host ports and added capabilities outside
  the baseline set; `restricted` adds the checks of the restricted profile that CI pods
  usually trip on (allowPrivilegeEscalation, runAsNonRoot, seccompProfile, dropping ALL
  capabilities, volume types). Answer: 403 `violates PodSecurity "baseline:latest": ...`.
- LimitRanger: `type: Container` limit ranges fill in default requests/limits for containers
  that give none (before quota is checked, as on a real server).
- ResourceQuota: the sum of the namespace's live pods plus the new one must stay within every
  quota's `hard` for requests.*/limits.* (and bare cpu/memory/ephemeral-storage, meaning
  requests) and `pods`; a container that lacks a request/limit a quota constrains is refused
  ("must specify"). Services count against `services`, `services.loadbalancers` and
  `services.nodeports`; secrets and configmaps against their counts; persistent volume
  claims against `persistentvolumeclaims` and `requests.storage`. Answer: 403 `exceeded
  quota: <name>, requested: ..., used: ..., limited: ...`.

Not modelled: quota scopes and scope selectors, `count/<resource>` keys, per storage class
keys, the quota check on updates (a claim resized), pod overhead, LimitRange
min/max/ratio, Pod Security `audit`/`warn` modes and exemptions. Admission computes usage
from the store on every request, so it has no quota-controller lag; the quota's
`status.used` follows asynchronously, as on a real cluster (see `controllers`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Iterable

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.validation import parse_quantity

Obj = dict[str, Any]

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
# Capabilities a baseline pod may add (the Pod Security Standards' list).
BASELINE_CAPABILITIES = frozenset({
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"})
RESTRICTED_VOLUME_TYPES = frozenset({
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret"})
_COMPUTE = ("cpu", "memory", "ephemeral-storage")
_FINISHED_PHASES = ("Succeeded", "Failed")


# -- Pod Security ------------------------------------------------------------------------------

def _containers(spec: Obj) -> Iterable[tuple[str, Obj]]:
    for section in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(section) or []:
            if isinstance(container, dict):
                yield str(container.get("name", "")), container


def baseline_violations(pod: Obj) -> list[str]:
    spec = pod.get("spec") or {}
    found: list[str] = []
    hosts = [f"{key}=true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    if hosts:
        found.append(f"host namespaces ({', '.join(hosts)})")
    privileged = [n for n, c in _containers(spec)
                  if (c.get("securityContext") or {}).get("privileged")]
    if privileged:
        found.append("privileged (" + ", ".join(
            f'container "{n}" must not set securityContext.privileged=true'
            for n in privileged) + ")")
    host_path = [str(v.get("name")) for v in spec.get("volumes") or []
                 if isinstance(v, dict) and "hostPath" in v]
    if host_path:
        found.append("hostPath volumes (" + ", ".join(f'volume "{n}"' for n in host_path) + ")")
    ports = [n for n, c in _containers(spec)
             if any(isinstance(p, dict) and p.get("hostPort") for p in c.get("ports") or [])]
    if ports:
        found.append("hostPort (" + ", ".join(f'container "{n}" uses hostPort'
                                              for n in ports) + ")")
    added = sorted({cap for _, c in _containers(spec)
                    for cap in ((c.get("securityContext") or {}).get("capabilities") or {}
                                ).get("add") or [] if cap not in BASELINE_CAPABILITIES})
    if added:
        found.append(f"non-default capabilities ({', '.join(added)})")
    return found


def restricted_violations(pod: Obj) -> list[str]:
    spec = pod.get("spec") or {}
    pod_context = spec.get("securityContext") or {}
    found = baseline_violations(pod)
    containers = list(_containers(spec))
    escalation = [n for n, c in containers
                  if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False]
    if escalation:
        found.append("allowPrivilegeEscalation != false (" + ", ".join(
            f'container "{n}" must set securityContext.allowPrivilegeEscalation=false'
            for n in escalation) + ")")
    not_dropped = [n for n, c in containers
                   if "ALL" not in (((c.get("securityContext") or {}).get("capabilities") or {}
                                     ).get("drop") or [])]
    if not_dropped:
        found.append("unrestricted capabilities (" + ", ".join(
            f'container "{n}" must set securityContext.capabilities.drop=["ALL"]'
            for n in not_dropped) + ")")
    if not pod_context.get("runAsNonRoot"):
        non_root = [n for n, c in containers
                    if not (c.get("securityContext") or {}).get("runAsNonRoot")]
        if non_root:
            found.append("runAsNonRoot != true (pod or containers " + ", ".join(
                f'"{n}"' for n in non_root) + " must set securityContext.runAsNonRoot=true)")
    seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if seccomp not in ("RuntimeDefault", "Localhost"):
        unset = [n for n, c in containers
                 if ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
                 not in ("RuntimeDefault", "Localhost")]
        if unset:
            found.append("seccompProfile (pod or containers " + ", ".join(
                f'"{n}"' for n in unset) + ' must set securityContext.seccompProfile.type to'
                ' "RuntimeDefault" or "Localhost")')
    bad_volumes = [str(v.get("name")) for v in spec.get("volumes") or [] if isinstance(v, dict)
                   and "hostPath" not in v  # reported by baseline already
                   and not any(k in RESTRICTED_VOLUME_TYPES for k in v if k != "name")]
    if bad_volumes:
        found.append("restricted volume types (" + ", ".join(
            f'volume "{n}"' for n in bad_volumes) + ")")
    return found


def check_pod_security(pod: Obj, namespace: Obj | None) -> None:
    """403 when `pod` violates the enforce level of `namespace`."""
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    level = labels.get(ENFORCE_LABEL, "privileged")
    if level == "baseline":
        found = baseline_violations(pod)
    elif level == "restricted":
        found = restricted_violations(pod)
    else:
        return
    if found:
        name = str((pod.get("metadata") or {}).get("name") or "")
        raise errors.forbidden("pods", name, f'violates PodSecurity "{level}:latest": '
                               + ", ".join(found))


# -- LimitRanger ---------------------------------------------------------------------------------

def apply_limit_ranges(pod: Obj, limit_ranges: list[Obj]) -> None:
    """Fill default requests/limits of containers from `type: Container` limit ranges."""
    for limit_range in limit_ranges:
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if not isinstance(item, dict) or item.get("type") != "Container":
                continue
            default_limits = item.get("default") or {}
            default_requests = item.get("defaultRequest") or {}
            for _, container in _containers(pod.get("spec") or {}):
                resources = container.get("resources")
                if not isinstance(resources, dict):
                    resources = container["resources"] = {}
                limits = resources.setdefault("limits", {})
                requests = resources.setdefault("requests", {})
                for res, value in limits.items():
                    requests.setdefault(res, value)  # API defaulting: request = limit
                for res, value in default_limits.items():
                    limits.setdefault(res, value)
                for res, value in default_requests.items():
                    requests.setdefault(res, value)
                if not limits:
                    del resources["limits"]
                if not requests:
                    del resources["requests"]


# -- ResourceQuota -------------------------------------------------------------------------------

def _quantity(value: Any) -> Decimal:
    number = parse_quantity(value)
    return number if number is not None else Decimal(0)


def _format(value: Decimal) -> str:
    return format(value.normalize(), "f")


def pod_usage(pod: Obj) -> dict[str, Decimal]:
    """What a pod counts against quota: requests.* and limits.* (containers summed, each
    init container's amount if larger) and pods=1."""
    spec = pod.get("spec") or {}
    usage: dict[str, Decimal] = {"pods": Decimal(1)}
    for section in ("requests", "limits"):
        totals: dict[str, Decimal] = {}
        for container in spec.get("containers") or []:
            amounts = ((container.get("resources") or {}).get(section) or {}) \
                if isinstance(container, dict) else {}
            for res, value in amounts.items():
                totals[res] = totals.get(res, Decimal(0)) + _quantity(value)
        for container in spec.get("initContainers") or []:
            amounts = ((container.get("resources") or {}).get(section) or {}) \
                if isinstance(container, dict) else {}
            for res, value in amounts.items():
                totals[res] = max(totals.get(res, Decimal(0)), _quantity(value))
        for res, value in totals.items():
            usage[f"{section}.{res}"] = value
    return usage


def service_usage(service: Obj) -> dict[str, Decimal]:
    spec = service.get("spec") or {}
    kind = spec.get("type") or "ClusterIP"
    usage = {"services": Decimal(1)}
    if kind == "LoadBalancer":
        usage["services.loadbalancers"] = Decimal(1)
    if kind == "NodePort" or (kind == "LoadBalancer"
                              and spec.get("allocateLoadBalancerNodePorts") is not False):
        usage["services.nodeports"] = Decimal(len(spec.get("ports") or []))
    return usage


def claim_usage(claim: Obj) -> dict[str, Decimal]:
    """A PersistentVolumeClaim: one claim and the storage it requests."""
    requests = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {})
    return {"persistentvolumeclaims": Decimal(1),
            "requests.storage": _quantity(requests.get("storage", 0))}


def _count_usage(plural: str) -> Callable[[Obj], dict[str, Decimal]]:
    return lambda obj: {plural: Decimal(1)}


# Kinds a quota constrains -> what one object of that kind uses.
USAGE: dict[str, Callable[[Obj], dict[str, Decimal]]] = {
    "pods": pod_usage, "services": service_usage, "persistentvolumeclaims": claim_usage,
    "secrets": _count_usage("secrets"), "configmaps": _count_usage("configmaps"),
}


def _hard_key(key: str) -> str:
    """Bare compute names in `hard` mean requests."""
    return f"requests.{key}" if key in _COMPUTE else key


def _constrains(plural: str, internal: str) -> bool:
    """Whether the quota key `internal` (after `_hard_key`) counts objects of `plural`."""
    if plural == "pods":
        # requests.storage is the claims' (the pod evaluator has no `storage` resource).
        return internal == "pods" or (internal.startswith(("requests.", "limits."))
                                      and internal != "requests.storage")
    if plural == "services":
        return internal.startswith("services")
    if plural == "persistentvolumeclaims":
        return internal in ("persistentvolumeclaims", "requests.storage")
    return internal == plural


def live_pods(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if (p.get("status") or {}).get("phase") not in _FINISHED_PHASES]


def _counted(plural: str, objects: list[Obj]) -> list[Obj]:
    return live_pods(objects) if plural == "pods" else objects


def quota_used(quota: Obj, objects: dict[str, list[Obj]]) -> dict[str, str]:
    """`status.used` of `quota`, from the namespace's objects by plural."""
    hard = (quota.get("spec") or {}).get("hard") or {}
    totals: dict[str, Decimal] = {}
    for plural, items in objects.items():
        for obj in _counted(plural, items):
            for key, value in USAGE[plural](obj).items():
                if _constrains(plural, key):
                    totals[key] = totals.get(key, Decimal(0)) + value
    return {key: _format(totals.get(_hard_key(key), Decimal(0))) for key in hard}


def check_quota(plural: str, obj: Obj, quotas: list[Obj], existing: list[Obj]) -> None:
    """403 when creating `obj` (any kind of `USAGE`) would exceed one of `quotas`;
    `existing` are the namespace's objects of that kind."""
    usage_of = USAGE[plural]
    new = usage_of(obj)
    others = _counted(plural, existing)
    name = str((obj.get("metadata") or {}).get("name") or "")
    for quota in quotas:
        quota_name = quota["metadata"]["name"]
        hard = (quota.get("spec") or {}).get("hard") or {}
        relevant = {key: _hard_key(key) for key in hard if _constrains(plural, _hard_key(key))}
        if plural == "pods":
            missing = sorted(k for k in relevant.values()
                             if k.startswith(("requests.", "limits.")) and k not in new)
            if missing:
                containers = ",".join(n for n, _ in _containers(obj.get("spec") or {}))
                raise errors.forbidden(plural, name, f"failed quota: {quota_name}: must specify "
                                       + "; ".join(f"{k} for: {containers}" for k in missing))
        used: dict[str, Decimal] = {}
        for other in others:
            for key, value in usage_of(other).items():
                used[key] = used.get(key, Decimal(0)) + value
        over = [(key, internal) for key, internal in relevant.items()
                if internal in new and used.get(internal, Decimal(0)) + new[internal]
                > _quantity(hard[key])]
        if over:
            requested = ",".join(f"{k}={_format(new[i])}" for k, i in over)
            in_use = ",".join(f"{k}={_format(used.get(i, Decimal(0)))}" for k, i in over)
            limited = ",".join(f"{k}={hard[k]}" for k, _ in over)
            raise errors.forbidden(plural, name, f"exceeded quota: {quota_name}, requested: "
                                   f"{requested}, used: {in_use}, limited: {limited}")
