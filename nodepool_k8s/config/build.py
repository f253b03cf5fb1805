"""Turn schema-valid, checked data into the frozen `config.model` objects.

Owns: the resolution of every default and every cascade (label -> pool -> provider -> built-in
default), using the constants of `config.schema`. Consumers of `Config` never apply defaults
themselves.

How it fails: it does not; it trusts its input to have passed `schema.validate` and
`checks.check`. Feeding it anything else is a programming error (KeyError/TypeError).
"""

from __future__ import annotations

import copy
import hashlib
import os
from typing import Any, Mapping

from nodepool_k8s.config import quantity
from nodepool_k8s.config import schema as S
from nodepool_k8s.config.cron import parse_duration
from nodepool_k8s.config.model import (
    INF, Config, DisruptionBudget, DriftBudget, LabelConfig, MaintenanceWindow, PoolConfig,
    PoolLabel, ProviderConfig, PullSecret, TenantLimit, TracingConfig, WebappConfig,
    ZkAcl, ZkAuth, ZkGrant, ZkServer, ZkTls,
)
from nodepool_k8s.core.model import Resources

Raw = Mapping[str, Any]

# (label key, pool default key) for the three request/limit pairs.
REQUESTS = {"cpu": "default-label-cpu", "memory": "default-label-memory",
            "storage": "default-label-storage"}
LIMITS = {"cpu": ("cpu-limit", "default-label-cpu-limit"),
          "memory": ("memory-limit", "default-label-memory-limit"),
          "storage": ("storage-limit", "default-label-storage-limit")}


def _first(*values: Any, default: Any = None) -> Any:
    return next((v for v in values if v is not None), default)


def _cap(value: int | None) -> float:
    return INF if value is None else value


def label_type(label: Raw, driver: str) -> str:
    if driver == "fake":
        return str(label.get("type", S.FAKE_LABEL_TYPE))
    return str(label["type"])


def has_pod_limits(label: Raw, driver: str) -> bool:
    """Only nodepool-built pods (form A) get requests/limits emitted; namespaces and
    verbatim specs do not, so their limits stay unset."""
    return driver == "kubernetes" and label_type(label, driver) == "pod" and "spec" not in label


def resolve_request(label: Raw, pool: Raw, resource: str) -> tuple[Any, str | None]:
    """(value, key that supplied it) for cpu/memory/storage: label, then pool default."""
    if label.get(resource) is not None:
        return label[resource], resource
    default_key = REQUESTS[resource]
    if pool.get(default_key) is not None:
        return pool[default_key], f"pool {default_key}"
    return None, None


def resolve_limit(label: Raw, pool: Raw, resource: str) -> tuple[Any, str | None]:
    """(value, origin) of a limit: label limit -> pool default limit -> the resolved request."""
    limit_key, default_key = LIMITS[resource]
    if label.get(limit_key) is not None:
        return label[limit_key], limit_key
    if pool.get(default_key) is not None:
        return pool[default_key], f"pool {default_key}"
    value, origin = resolve_request(label, pool, resource)
    return value, (f"the {origin} request" if origin else None)


def resolve_guard(label: Raw, pool: Raw, provider: Raw, key: str) -> tuple[Any, str | None]:
    """(value, where) of a guard key: label, pool default-label-*, provider default-label-*."""
    default_key = f"default-label-{key}"
    for value, where in ((label.get(key), "label"), (pool.get(default_key), "pool"),
                         (provider.get(default_key), "provider")):
        if value is not None:
            return value, where
    return None, None


def object_quota(label: Raw, pool: Raw, provider: Raw) -> dict[str, int]:
    """Every `object-quota` entry: the label's, else the pool's, else the provider's
    `default-label-object-quota` entry, else the built-in one (merged per entry, so raising
    one count does not drop the others)."""
    layers = [label.get("object-quota"), pool.get("default-label-object-quota"),
              provider.get("default-label-object-quota")]
    return {key: int(_first(*(layer.get(key) for layer in layers if layer), default=default))
            for key, default in S.OBJECT_QUOTA.items()}


def scheduling(label: Raw, pool: Raw, provider: Raw, key: str) -> tuple[Any, ...]:
    """A scheduling key (tolerations, node-requirements, ...) of a form A pod label: the
    label's list, else the pool's `default-label-<key>`, else the provider's (first found
    wins, no merging). Namespaces and verbatim specs get none."""
    if label.get("type") != "pod" or "spec" in label:
        return ()
    value, _ = resolve_guard(label, pool, provider, key)
    return tuple(copy.deepcopy(value or ()))


def image_pull_secrets(label: Raw, pool: Raw, provider: Raw) -> tuple[PullSecret, ...]:
    """The pull Secrets of a pod label (either form): the label's list, else the pool's
    `default-label-image-pull-secrets`, else the provider's (first found wins, no merging;
    an empty list on the label means none). Namespace labels get none: their job could
    mount the copy into a pod of its own (`checks` refuses the key on them)."""
    if label.get("type") != "pod":
        return ()
    value, _ = resolve_guard(label, pool, provider, "image-pull-secrets")
    return tuple(PullSecret(name=str(entry["name"]), namespace=str(entry["namespace"]))
                 for entry in value or ())


def permitted(pool: Raw, provider: Raw, key: str) -> bool:
    """A permission key (allow-privileged, ...): the pool's value, else the provider's."""
    return bool(_first(pool.get(key), provider.get(key), default=False))


# (path inside the label, what it is, the permission key that allows it, needs privileged)
Danger = tuple[tuple[Any, ...], str, str, bool]


def dangerous_settings(label: Raw) -> list[Danger]:
    """The pod settings of a kubernetes label that need a pool/provider permission."""
    found: list[Danger] = []
    if label.get("privileged") is True:
        found.append((("privileged",), "privileged: true", "allow-privileged", True))
    for index, volume in enumerate(label.get("volumes") or []):
        if isinstance(volume, dict) and "hostPath" in volume:
            found.append((("volumes", index, "hostPath"), "a hostPath volume",
                          "allow-host-path", True))
    spec = label.get("spec")
    if isinstance(spec, dict):
        found.append((("spec",), "a verbatim pod spec", "allow-verbatim-spec", False))
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key) is True:
                found.append((("spec", key), f"{key}: true", "allow-host-namespaces", True))
        for section in ("initContainers", "containers"):
            for index, container in enumerate(spec.get(section) or []):
                context = container.get("securityContext") if isinstance(container,
                                                                         dict) else None
                if isinstance(context, dict) and context.get("privileged") is True:
                    found.append((("spec", section, index, "securityContext", "privileged"),
                                  "a privileged container", "allow-privileged", True))
        for index, volume in enumerate(spec.get("volumes") or []):
            if isinstance(volume, dict) and "hostPath" in volume:
                found.append((("spec", "volumes", index, "hostPath"), "a hostPath volume",
                              "allow-host-path", True))
    return found


def needs_privileged(label: Raw) -> bool:
    return any(danger[3] for danger in dangerous_settings(label))


def pod_security(label: Raw, pool: Raw, provider: Raw) -> str:
    """The label's own level; else privileged when it needs it; else the defaults."""
    if label.get("pod-security") is not None:
        return str(label["pod-security"])
    if needs_privileged(label):
        return "privileged"
    value, _ = resolve_guard(label, pool, provider, "pod-security")
    return str(value if value is not None else S.POD_SECURITY)


def build_label(label: Raw, pool: Raw, provider: Raw) -> PoolLabel:
    driver = provider["driver"]
    kind = label_type(label, driver)
    values: dict[str, Any] = {
        "name": label["name"],
        "type": kind,
        "extra_resources": {**pool.get("default-label-extra-resources", {}),
                            **label.get("extra-resources", {})},
        "boot_timeout": _first(label.get("boot-timeout"), pool.get("boot-timeout"),
                               provider.get("boot-timeout"), default=S.BOOT_TIMEOUT),
        "min_ready": label.get("min-ready", S.MIN_READY),
    }
    # Every label type counts its (possibly pool-default) requests against quota, as in
    # Nodepool; this includes namespaces and verbatim-spec pods.
    for resource in REQUESTS:
        values[resource] = resolve_request(label, pool, resource)[0]
    if isinstance(label.get("spec"), dict):
        # A verbatim spec counts with what its containers request (pool defaults only for
        # resources no container asks for: the LimitRange applies those).
        for resource, amount in quantity.spec_requests(label["spec"]).items():
            if amount is not None:
                values[resource] = int(amount) if float(amount).is_integer() else amount
    if has_pod_limits(label, driver):
        for resource in LIMITS:
            values[f"{resource}_limit"] = resolve_limit(label, pool, resource)[0]
    if driver == "fake":
        values["fake_launch_delay"] = label.get("launch-delay", S.FAKE_LAUNCH_DELAY)
        values["fake_fail"] = label.get("fail", S.FAKE_FAIL)
        return PoolLabel(**values)
    # Deep copies: YAML anchors may share one object between labels, and consumers may hand
    # these straight to the Kubernetes client.
    values.update(
        image=label.get("image"),
        image_pull=label.get("image-pull", S.IMAGE_PULL),
        python_path=label.get("python-path", S.PYTHON_PATH),
        shell_type=label.get("shell-type"),
        gpu=label.get("gpu"),
        gpu_resource=label.get("gpu-resource"),
        env=tuple(copy.deepcopy(label.get("env", []))),
        node_selector=copy.deepcopy(label.get("node-selector")),
        scheduler_name=label.get("scheduler-name"),
        privileged=label.get("privileged"),
        volumes=tuple(copy.deepcopy(label.get("volumes", []))),
        volume_mounts=tuple(copy.deepcopy(label.get("volume-mounts", []))),
        spec=copy.deepcopy(label.get("spec")),
        image_pull_secrets=image_pull_secrets(label, pool, provider),
        tolerations=scheduling(label, pool, provider, "tolerations"),
        node_requirements=scheduling(label, pool, provider, "node-requirements"),
        preferred_node_requirements=scheduling(label, pool, provider,
                                               "preferred-node-requirements"),
        labels=dict(label.get("labels", {})),
        dynamic_labels=dict(label.get("dynamic-labels", {})),
        annotations=dict(label.get("annotations", {})),
        pod_security=pod_security(label, pool, provider),
        resource_quota=bool(_first(resolve_guard(label, pool, provider, "resource-quota")[0],
                                   default=S.RESOURCE_QUOTA)),
        network_policy=bool(_first(resolve_guard(label, pool, provider, "network-policy")[0],
                                   default=S.NETWORK_POLICY)),
        egress_allow=tuple(resolve_guard(label, pool, provider, "egress-allow")[0] or ()),
        allow_external_services=bool(_first(
            resolve_guard(label, pool, provider, "allow-external-services")[0],
            default=S.ALLOW_EXTERNAL_SERVICES)),
        allow_job_secrets=bool(_first(
            resolve_guard(label, pool, provider, "allow-job-secrets")[0],
            default=S.ALLOW_JOB_SECRETS)),
        object_quota=object_quota(label, pool, provider),
    )
    return PoolLabel(**values)


def build_maintenance(entries: list[Raw] | None) -> tuple[MaintenanceWindow, ...]:
    return tuple(MaintenanceWindow(
        schedule=w["schedule"], duration=parse_duration(w["duration"]),
        action=w.get("action", S.MAINTENANCE_ACTION), timezone=w.get("timezone", S.TIMEZONE))
        for w in entries or ())


def build_drift_budget(budget: Raw | None) -> DriftBudget:
    if not budget:
        return DriftBudget()
    only_percent = budget.get("max-nodes") is None and budget.get("max-percent") is not None
    return DriftBudget(
        max_nodes=None if only_percent else budget.get("max-nodes", S.DRIFT_MAX_NODES),
        max_percent=budget.get("max-percent"),
        schedule=budget.get("schedule"),
        duration=parse_duration(budget["duration"]) if "duration" in budget else None,
        timezone=budget.get("timezone", S.TIMEZONE))


def drift_only_budget(budget: Raw | None) -> DisruptionBudget | None:
    """`drift-budget`, the shorthand of a drift-only disruption budget; with a window,
    drifted spares are replaced only inside it (as the key always meant)."""
    if not budget:
        return None
    drift = build_drift_budget(budget)
    return DisruptionBudget(reasons=("drift",), max_nodes=drift.max_nodes,
                            max_percent=drift.max_percent, schedule=drift.schedule,
                            duration=drift.duration, timezone=drift.timezone,
                            outside_window=0 if drift.schedule is not None else None)


def build_disruption_budget(budget: Raw) -> DisruptionBudget:
    nodes = budget["nodes"]
    percent = isinstance(nodes, str)
    return DisruptionBudget(
        reasons=tuple(budget.get("reasons") or S.DISRUPTION_REASONS),
        max_nodes=None if percent else int(nodes),
        max_percent=float(nodes[:-1]) if percent else None,
        schedule=budget.get("schedule"),
        duration=parse_duration(budget["duration"]) if "duration" in budget else None,
        timezone=budget.get("timezone", S.TIMEZONE))


def build_disruption_budgets(pool: Raw) -> tuple[DisruptionBudget, ...]:
    budgets = [build_disruption_budget(b) for b in pool.get("disruption-budgets") or ()]
    drift = drift_only_budget(pool.get("drift-budget"))
    return tuple(budgets + ([drift] if drift is not None else []))


def label_max_ages(pool: Raw) -> dict[str, float]:
    """Per pool label: its `max-age`, else the pool's `default-label-max-age` (if any)."""
    ages: dict[str, float] = {}
    for label in pool["labels"]:
        age = _first(label.get("max-age"), pool.get("default-label-max-age"))
        if age is not None:
            ages[label["name"]] = float(age)
    return ages


def pool_disabled(pool: Raw, provider: Raw) -> bool:
    """`PoolConfig.disabled` without building the pool (checks use it on unchecked data)."""
    return _cap(_first(pool.get("max-servers"), provider.get("max-servers"))) <= 0


def build_pool(pool: Raw, provider: Raw) -> PoolConfig:
    # Provider limits double as the pool defaults (as in Nodepool) besides being totals.
    return PoolConfig(
        name=pool["name"],
        provider=provider["name"],
        labels={lb["name"]: build_label(lb, pool, provider) for lb in pool["labels"]},
        max_servers=_cap(_first(pool.get("max-servers"), provider.get("max-servers"))),
        max_cores=_cap(_first(pool.get("max-cores"), provider.get("max-cores"))),
        max_ram=_cap(_first(pool.get("max-ram"), provider.get("max-ram"))),
        max_resources={**provider.get("max-resources", {}), **pool.get("max-resources", {})},
        node_attributes=copy.deepcopy(pool.get("node-attributes")),
        priority=_first(pool.get("priority"), provider.get("priority"), default=S.PRIORITY),
        maintenance=build_maintenance(pool.get("maintenance")),
        drift_budget=build_drift_budget(pool.get("drift-budget")),
        disruption_budgets=build_disruption_budgets(pool),
        surplus_delay=float(pool.get("surplus-delay", S.SURPLUS_DELAY)),
        label_max_age=label_max_ages(pool),
        breaker_threshold=_first(pool.get("breaker-threshold"),
                                 provider.get("breaker-threshold"),
                                 default=S.BREAKER_THRESHOLD),
        breaker_backoff=float(_first(pool.get("breaker-backoff"),
                                     provider.get("breaker-backoff"),
                                     default=S.BREAKER_BACKOFF)),
        breaker_backoff_max=float(_first(pool.get("breaker-backoff-max"),
                                         provider.get("breaker-backoff-max"),
                                         default=S.BREAKER_BACKOFF_MAX)),
    )


def installation_id(data: Raw) -> str:
    """`installation-id` if set, else a short hash of the sorted ZooKeeper servers + chroot.

    Stable for one ZooKeeper installation (server order does not matter) and different for
    two installations that share no ensemble or use different chroots.
    """
    if data.get("installation-id"):
        return str(data["installation-id"])
    servers = data.get("zookeeper-servers") or []
    endpoints = sorted(f"{s['host'].lower()}:{s.get('port', S.ZK_PORT)}" for s in servers)
    chroot = next((s.get("chroot") for s in servers if s.get("chroot")), "") or ""
    digest = hashlib.sha256(("\n".join(endpoints) + "\n" + chroot.rstrip("/")).encode())
    return "zk-" + digest.hexdigest()[:12]


def installation_id_file(data: Raw, environ: Mapping[str, str] | None = None) -> str:
    """Where the launcher pins its installation id: `installation-id-file`, else the file
    in systemd's StateDirectory= ($STATE_DIRECTORY), else the default under /var/lib."""
    if data.get("installation-id-file"):
        return str(data["installation-id-file"])
    env = os.environ if environ is None else environ
    state = (env.get(S.STATE_DIRECTORY_ENV) or "").split(":")[0]
    if state:
        return os.path.join(state, S.INSTALLATION_ID_FILE_NAME)
    return S.INSTALLATION_ID_FILE


def build_provider(provider: Raw, installation: str = S.DEFAULT_INSTALLATION_ID
                   ) -> ProviderConfig:
    return ProviderConfig(
        name=provider["name"],
        driver=provider["driver"],
        pools={p["name"]: build_pool(p, provider) for p in provider["pools"]},
        context=provider.get("context") if provider["driver"] == "kubernetes" else None,
        launch_retries=provider.get("launch-retries", S.LAUNCH_RETRIES),
        max_concurrency=provider.get("max-concurrency", S.MAX_CONCURRENCY),
        priority=provider.get("priority", S.PRIORITY),
        max_servers=_cap(provider.get("max-servers")),
        max_cores=_cap(provider.get("max-cores")),
        max_ram=_cap(provider.get("max-ram")),
        max_resources=dict(provider.get("max-resources", {})),
        leak_grace=provider.get("leak-grace", S.LEAK_GRACE),
        api_retries=provider.get("api-retries", S.API_RETRIES),
        api_backoff=tuple(provider.get("api-backoff", S.API_BACKOFF)),
        api_timeout=provider.get("api-timeout", S.API_TIMEOUT),
        api_connect_timeout=provider.get("api-connect-timeout", S.API_CONNECT_TIMEOUT),
        api_read_timeout=provider.get("api-read-timeout", S.API_READ_TIMEOUT),
        hand_back_after=provider.get("hand-back-after", S.HAND_BACK_AFTER),
        recently_failed_ttl=provider.get("recently-failed-ttl", S.RECENTLY_FAILED_TTL),
        credentials_backoff=tuple(provider.get("credentials-backoff",
                                               S.CREDENTIALS_BACKOFF)),
        credentials_exec_timeout=provider.get("credentials-exec-timeout",
                                              S.CREDENTIALS_EXEC_TIMEOUT),
        api_probe_interval=provider.get("api-probe-interval", S.API_PROBE_INTERVAL),
        api_probe_connect_timeout=provider.get("api-probe-connect-timeout",
                                               S.API_PROBE_CONNECT_TIMEOUT),
        api_probe_read_timeout=provider.get("api-probe-read-timeout",
                                            S.API_PROBE_READ_TIMEOUT),
        unschedulable_grace=provider.get("unschedulable-grace", S.UNSCHEDULABLE_GRACE),
        delete_timeout=provider.get("delete-timeout", S.DELETE_TIMEOUT),
        terminating_grace=provider.get("terminating-grace", S.TERMINATING_GRACE),
        max_pod_grace=provider.get("max-pod-grace", S.MAX_POD_GRACE),
        token_lifetime=provider.get("token-lifetime", S.TOKEN_LIFETIME),
        installation_id=installation,
        job_role=provider.get("job-role", S.JOB_ROLE),
        capacity_resource_quota=(provider.get("capacity") or {}).get("resource-quota"),
        capacity_nodes=bool((provider.get("capacity") or {}).get("nodes", S.CAPACITY_NODES)),
    )


def build_tenant(tenant: Raw) -> TenantLimit:
    limits: dict[str, float] = {}
    for key, value in tenant.items():
        if key != "tenant-name":
            limits[S.TENANT_LIMIT_KEYS.get(key, key)] = value
    return TenantLimit(tenant_name=tenant["tenant-name"], limits=Resources.limits(limits))


def build_zk_auth(auth: Raw | None) -> ZkAuth | None:
    if not auth:
        return None
    return ZkAuth(scheme=auth.get("scheme", "digest"), username=auth["username"],
                  password=auth["password"])


def build_zk_acl(acl: Raw | None) -> ZkAcl | None:
    if acl is None:
        return None
    return ZkAcl(enabled=acl.get("enabled", S.ZK_ACL_ENABLED), grants=tuple(
        ZkGrant(scheme=g["scheme"], id=g.get("id"), username=g.get("username"),
                password=g.get("password"),
                permissions=tuple(g.get("permissions", S.ZK_GRANT_PERMISSIONS)))
        for g in acl.get("grants") or ()))


def build_tracing(tracing: Raw | None) -> TracingConfig:
    tracing = tracing or {}
    return TracingConfig(enabled=tracing.get("enabled", S.TRACING_ENABLED),
                         endpoint=tracing.get("endpoint"),
                         protocol=tracing.get("protocol", S.TRACING_PROTOCOL),
                         service_name=tracing.get("service-name", S.TRACING_SERVICE_NAME),
                         insecure=tracing.get("insecure", S.TRACING_INSECURE),
                         timeout=tracing.get("timeout", S.TRACING_TIMEOUT))


def build_config(data: Raw, sources: tuple[str, ...] = (),
                 warnings: tuple[str, ...] = ()) -> Config:
    tls = data.get("zookeeper-tls")
    webapp = data.get("webapp", {})
    max_hold_age = data.get("max-hold-age", S.MAX_HOLD_AGE)
    installation = installation_id(data)
    return Config(
        installation_id=installation,
        installation_id_explicit=bool(data.get("installation-id")),
        installation_id_file=installation_id_file(data),
        zookeeper_servers=tuple(
            ZkServer(host=s["host"], port=s.get("port", S.ZK_PORT), chroot=s.get("chroot"))
            for s in data["zookeeper-servers"]),
        zookeeper_tls=ZkTls(cert=tls["cert"], key=tls["key"], ca=tls["ca"]) if tls else None,
        zookeeper_timeout=data.get("zookeeper-timeout", S.ZK_TIMEOUT),
        zookeeper_auth=build_zk_auth(data.get("zookeeper-auth")),
        zookeeper_acl=build_zk_acl(data.get("zookeeper-acl")),
        labels={lb["name"]: LabelConfig(
            name=lb["name"],
            # -1 is Nodepool's other spelling of "disabled"; consumers only see 0.
            min_ready=max(0, lb.get("min-ready", S.MIN_READY)),
            max_ready_age=lb.get("max-ready-age", S.MAX_READY_AGE),
            max_age=lb.get("max-age", S.MAX_AGE),
        ) for lb in data.get("labels", [])},
        providers={p["name"]: build_provider(p, installation) for p in data.get("providers", [])},
        max_hold_age=max_hold_age if max_hold_age > 0 else INF,
        webapp=WebappConfig(port=webapp.get("port", S.WEBAPP_PORT),
                            listen_address=webapp.get("listen_address",
                                                      S.WEBAPP_LISTEN_ADDRESS),
                            threads=webapp.get("threads", S.WEBAPP_THREADS),
                            timeout=webapp.get("timeout", S.WEBAPP_TIMEOUT),
                            send_timeout=webapp.get("send-timeout", S.WEBAPP_SEND_TIMEOUT),
                            max_header_size=webapp.get("max-header-size",
                                                       S.WEBAPP_MAX_HEADER_SIZE),
                            max_connections=webapp.get("max-connections",
                                                       S.WEBAPP_MAX_CONNECTIONS),
                            allow_origin=webapp.get("allow-origin")),
        tracing=build_tracing(data.get("tracing")),
        tenant_resource_limits={t["tenant-name"]: build_tenant(t)
                                for t in data.get("tenant-resource-limits", [])},
        sources=sources,
        warnings=warnings,
    )
