"""The validated configuration as immutable objects, with every default already resolved.

Owns: the shape of a loaded configuration. These are pure data (frozen dataclasses, mapping
fields treated as read-only by convention); any layer may import them. Nothing here reads
files or validates: `config.loader` builds these objects only from input that passed the
schema and the semantic checks, so consumers never need `.get(key, default)` chains.

Infinite limits are `math.inf`. Memory is in MiB, storage in MB, as in Nodepool.
"""

from __future__ import annotations

import dataclasses

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from nodepool_k8s.config import schema as S
from nodepool_k8s.core.model import Resources

INF = math.inf


@dataclass(frozen=True)
class ZkServer:
    host: str
    port: int = S.ZK_PORT
    chroot: str | None = None


@dataclass(frozen=True)
class ZkTls:
    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class ZkAuth:
    """Credentials the launcher authenticates its ZooKeeper session with (`zookeeper-auth`)."""

    scheme: str
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class ZkGrant:
    """One `zookeeper-acl.grants` entry: `scheme:id` gets `permissions` on every znode the
    launcher creates. A digest grant given as username/password has its id computed by the
    ZooKeeper layer (`id` is then None)."""

    scheme: str
    id: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    permissions: tuple[str, ...] = S.ZK_GRANT_PERMISSIONS


@dataclass(frozen=True)
class ZkAcl:
    """`zookeeper-acl`: when enabled, the ACL of every znode the launcher creates is the
    launcher's own authenticated identities (ZooKeeper's `auth` scheme) with all
    permissions plus `grants`; nobody else (not even `world`) may read it."""

    enabled: bool = S.ZK_ACL_ENABLED
    grants: tuple[ZkGrant, ...] = ()


@dataclass(frozen=True)
class LabelConfig:
    """A top-level `labels` entry: what any provider may serve under this name."""

    name: str
    min_ready: int = S.MIN_READY
    max_ready_age: float = S.MAX_READY_AGE  # seconds; 0 = never expire
    # Seconds after creation a spare of this label is replaced (within the pools'
    # disruption budgets) where its pool sets none; 0 = no maximum age.
    max_age: float = S.MAX_AGE


@dataclass(frozen=True)
class WebappConfig:
    port: int = S.WEBAPP_PORT
    listen_address: str = S.WEBAPP_LISTEN_ADDRESS
    threads: int = S.WEBAPP_THREADS
    timeout: int = S.WEBAPP_TIMEOUT  # seconds
    send_timeout: int = S.WEBAPP_SEND_TIMEOUT  # seconds
    max_header_size: int = S.WEBAPP_MAX_HEADER_SIZE
    max_connections: int = S.WEBAPP_MAX_CONNECTIONS
    allow_origin: str | None = None


@dataclass(frozen=True)
class TracingConfig:
    """`tracing`: OpenTelemetry spans of each request sent over OTLP (`runtime.tracing`)."""

    enabled: bool = S.TRACING_ENABLED
    endpoint: str | None = None  # required when enabled
    protocol: str = S.TRACING_PROTOCOL
    service_name: str = S.TRACING_SERVICE_NAME
    insecure: bool = S.TRACING_INSECURE  # a plaintext endpoint is allowed
    timeout: float = S.TRACING_TIMEOUT  # seconds


@dataclass(frozen=True)
class TenantLimit:
    tenant_name: str
    # Keys as stored in node `resources`: instances, cores, ram, volumes, volume-gb, <other>.
    limits: Resources = field(default_factory=Resources.limits)


@dataclass(frozen=True)
class PullSecret:
    """An `image-pull-secrets` entry: the Secret `name` in `namespace`, which the operator
    placed there; the driver copies it into each node's namespace under the same name."""

    name: str
    namespace: str


@dataclass(frozen=True)
class PoolLabel:
    """A label as one pool of a kubernetes (or fake) provider serves it; defaults resolved."""

    name: str
    type: str  # "namespace" | "pod"
    # Form A: the pod nodepool_k8s builds. None means "not set" (no request/limit emitted).
    image: str | None = None
    image_pull: str = S.IMAGE_PULL
    python_path: str = S.PYTHON_PATH
    shell_type: str | None = None
    cpu: float | None = None
    memory: int | None = None  # MiB
    storage: int | None = None  # MB (ephemeral-storage)
    cpu_limit: float | None = None
    memory_limit: int | None = None
    storage_limit: int | None = None
    gpu: float | None = None
    gpu_resource: str | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] | None = None
    scheduler_name: str | None = None
    privileged: bool | None = None
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    extra_resources: Mapping[str, int] = field(default_factory=dict)
    # Scheduling (form A; label -> pool -> provider default-label-*): Kubernetes tolerations,
    # node requirements rendered as required node affinity (one term, all must hold) and
    # preferred ones (each its own weighted term). Items are Kubernetes-shaped mappings.
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_requirements: tuple[Mapping[str, Any], ...] = ()
    preferred_node_requirements: tuple[Mapping[str, Any], ...] = ()
    # Form B: a verbatim pod spec (exclusive with the form A keys above).
    spec: Mapping[str, Any] | None = None
    # Pod labels, both forms (label -> pool -> provider default-label-*): registry
    # credentials copied into the node's namespace and named in the pod's imagePullSecrets.
    image_pull_secrets: tuple[PullSecret, ...] = ()
    # Both forms.
    labels: Mapping[str, str] = field(default_factory=dict)
    dynamic_labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # Guarded namespaces (kubernetes driver; see doc/security.md): the Pod Security level
    # enforced on the namespace, a ResourceQuota/LimitRange from the requests and limits above,
    # a default-deny egress NetworkPolicy allowing DNS and `egress_allow` (CIDRs), and whether
    # the quota leaves out services.loadbalancers/nodeports = 0; whether the job's role
    # grants secrets (namespace labels); the quota's object counts and PVC storage (MB),
    # every entry of schema.OBJECT_QUOTA resolved.
    pod_security: str = S.POD_SECURITY
    resource_quota: bool = S.RESOURCE_QUOTA
    network_policy: bool = S.NETWORK_POLICY
    egress_allow: tuple[str, ...] = ()
    allow_external_services: bool = S.ALLOW_EXTERNAL_SERVICES
    allow_job_secrets: bool = S.ALLOW_JOB_SECRETS
    object_quota: Mapping[str, int] = field(default_factory=lambda: dict(S.OBJECT_QUOTA))
    # Seconds to wait for the pod to run (and the token to appear) per attempt.
    boot_timeout: float = S.BOOT_TIMEOUT
    # Fake driver only: simulated launch time and failure injection for tests/benchmarks.
    fake_launch_delay: float = S.FAKE_LAUNCH_DELAY
    fake_fail: bool = S.FAKE_FAIL
    # Pool-level min-ready: spare ready nodes of this label kept in this pool (0: none).
    min_ready: int = S.MIN_READY

    def quota(self) -> Resources:
        """What one node of this label counts against quotas (requests, not limits)."""
        values: dict[str, float] = {"instances": 1, "cores": 0, "ram": 0}
        if self.cpu is not None:
            values["cores"] = self.cpu
        if self.memory is not None:
            values["ram"] = self.memory
        if self.storage is not None:
            values["ephemeral-storage"] = self.storage
        if self.gpu is not None and self.gpu_resource:
            values[self.gpu_resource] = self.gpu
        for key, amount in self.extra_resources.items():
            values[key] = values.get(key, 0) + amount
        return Resources(values)


@dataclass(frozen=True)
class MaintenanceWindow:
    """A pool `maintenance` entry: from each `schedule` start (5-field cron, read in
    `timezone`) for `duration` seconds the pool is paused or drained."""

    schedule: str
    duration: float
    action: str = S.MAINTENANCE_ACTION
    timezone: str = S.TIMEZONE


@dataclass(frozen=True)
class DriftBudget:
    """A pool `drift-budget`: how many drifted spares may be being replaced at once (the
    smaller of `max_nodes` and `max_percent` of the pool's spares, at least one when either
    allows any), optionally only inside a cron `schedule` window of `duration` seconds."""

    max_nodes: int | None = S.DRIFT_MAX_NODES
    max_percent: float | None = None
    schedule: str | None = None
    duration: float | None = None
    timezone: str = S.TIMEZONE


@dataclass(frozen=True)
class DisruptionBudget:
    """A pool `disruption-budgets` entry: for the `reasons` it names, how many of the pool's
    nodes may be being deleted at once: at most `max_nodes` and at most `max_percent` of the
    pool's nodes (at least one when the share allows any). With a window (`schedule` and
    `duration`) it limits only inside the window, and outside it allows `outside_window`
    nodes (None: it does not apply there; the `drift-budget` shorthand's window has 0)."""

    reasons: tuple[str, ...] = S.DISRUPTION_REASONS
    max_nodes: int | None = None
    max_percent: float | None = None
    schedule: str | None = None
    duration: float | None = None
    timezone: str = S.TIMEZONE
    outside_window: int | None = None


@dataclass(frozen=True)
class PoolConfig:
    name: str
    provider: str
    labels: Mapping[str, PoolLabel]
    max_servers: float = INF  # <= 0 disables the pool
    max_cores: float = INF
    max_ram: float = INF
    # Provider max-resources merged with the pool's; missing keys are unlimited.
    max_resources: Mapping[str, float] = field(default_factory=dict)
    node_attributes: Mapping[str, Any] | None = None
    priority: int = S.PRIORITY  # resolved: pool -> provider -> default; lower is preferred
    # Fleet control: windows when the pool is paused/drained, and drift replacement pace.
    maintenance: tuple[MaintenanceWindow, ...] = ()
    drift_budget: DriftBudget = field(default_factory=DriftBudget)
    # How many spares may be being removed at once, by reason (`drift-budget` included as a
    # drift-only budget); reasons none of them names get `schema.DISRUPTION_DEFAULTS`.
    disruption_budgets: tuple[DisruptionBudget, ...] = ()
    # Seconds a label stays over its min-ready target before its surplus goes (0: never).
    surplus_delay: float = S.SURPLUS_DELAY
    # Per label: seconds after creation a spare is replaced (label `max-age`, else the
    # pool's `default-label-max-age`); labels without one fall back to the global label's.
    label_max_age: Mapping[str, float] = field(default_factory=dict)
    # Circuit breaker (see launcher.breaker); resolved pool -> provider -> default.
    breaker_threshold: int = S.BREAKER_THRESHOLD
    breaker_backoff: float = S.BREAKER_BACKOFF
    breaker_backoff_max: float = S.BREAKER_BACKOFF_MAX

    def limits(self) -> Resources:
        values: dict[str, float] = dict(self.max_resources)
        values.update({"instances": self.max_servers, "cores": self.max_cores,
                       "ram": self.max_ram})
        return Resources.limits(values)

    @property
    def disabled(self) -> bool:
        return self.max_servers <= 0


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    driver: str  # "kubernetes" | "fake"
    pools: Mapping[str, PoolConfig]
    context: str | None = None
    launch_retries: int = S.LAUNCH_RETRIES
    # 0 or negative: unlimited (Nodepool's 0 disabled the provider)
    max_concurrency: int = S.MAX_CONCURRENCY
    priority: int = S.PRIORITY
    # Provider-wide totals across all pools (Nodepool parsed but never enforced these).
    max_servers: float = INF
    max_cores: float = INF
    max_ram: float = INF
    max_resources: Mapping[str, float] = field(default_factory=dict)
    # Leak sweeper: a namespace without a node is deleted only when seen twice this far apart.
    leak_grace: float = S.LEAK_GRACE
    # Retry/backoff for Kubernetes API calls (seconds).
    api_retries: int = S.API_RETRIES
    api_backoff: tuple[float, ...] = S.API_BACKOFF
    api_timeout: float = S.API_TIMEOUT
    # Kubernetes driver: connect and read timeouts of one API request (see schema.py).
    api_connect_timeout: float = S.API_CONNECT_TIMEOUT
    api_read_timeout: float = S.API_READ_TIMEOUT
    # Handing back requests a pool cannot serve now, and leaving the labels it handed back
    # to other pools for a while (seconds; see schema.py).
    hand_back_after: float = S.HAND_BACK_AFTER
    recently_failed_ttl: float = S.RECENTLY_FAILED_TTL
    # Kubernetes driver: after a 401 the credentials are loaded again at once, then at most
    # once per step of this backoff (seconds; the last step repeats) while still refused.
    credentials_backoff: tuple[float, ...] = S.CREDENTIALS_BACKOFF
    # Kubernetes driver: seconds a kubeconfig exec credential plugin may run; then it is
    # killed (with what it started) and that load of the credentials fails.
    credentials_exec_timeout: float = S.CREDENTIALS_EXEC_TIMEOUT
    # Kubernetes driver: how often the API server is probed (GET /version) and how long a
    # probe may take to connect and to be answered (the pools' ApiReachable condition).
    api_probe_interval: float = S.API_PROBE_INTERVAL
    api_probe_connect_timeout: float = S.API_PROBE_CONNECT_TIMEOUT
    api_probe_read_timeout: float = S.API_PROBE_READ_TIMEOUT
    # Kubernetes driver: how long a pod may stay Unschedulable before the attempt fails, and
    # how long a deletion waits for the namespace to vanish (then TemporaryError, retried).
    unschedulable_grace: float = S.UNSCHEDULABLE_GRACE
    delete_timeout: float = S.DELETE_TIMEOUT
    # Kubernetes driver: a node namespace Terminating this long has the finalizers of what
    # is left in it removed and its pods deleted with at most `max_pod_grace` seconds.
    terminating_grace: float = S.TERMINATING_GRACE
    max_pod_grace: int = S.MAX_POD_GRACE
    # Kubernetes driver: lifetime (seconds) of the TokenRequest token handed to a job.
    token_lifetime: int = S.TOKEN_LIFETIME
    # The top-level `installation-id` (resolved), copied here so a provider built from this
    # config alone (the launcher, `nodepool delete --now`) labels and recognises its objects.
    installation_id: str = S.DEFAULT_INSTALLATION_ID
    # Kubernetes driver: "role" creates a Role per namespace (the launcher needs the rights it
    # grants, or `escalate`); "cluster-role" binds pre-created ClusterRoles (it needs `bind`).
    job_role: str = S.JOB_ROLE
    # Kubernetes driver capacity awareness (`capacity`; off by default): a ResourceQuota
    # ("<namespace>/<name>") whose hard - used bounds the provider, and/or the allocatable
    # resources of the cluster nodes matching a label's node-selector minus pod requests.
    capacity_resource_quota: str | None = None
    capacity_nodes: bool = S.CAPACITY_NODES

    def limits(self) -> Resources:
        values: dict[str, float] = dict(self.max_resources)
        values.update({"instances": self.max_servers, "cores": self.max_cores,
                       "ram": self.max_ram})
        return Resources.limits(values)

    def labels(self) -> set[str]:
        return {name for pool in self.pools.values() for name in pool.labels}


@dataclass(frozen=True)
class Config:
    zookeeper_servers: tuple[ZkServer, ...]
    zookeeper_tls: ZkTls | None = None
    zookeeper_timeout: float = S.ZK_TIMEOUT
    zookeeper_auth: ZkAuth | None = None
    zookeeper_acl: ZkAcl | None = None  # None or disabled: the open ACL (as Nodepool)
    # Marks this installation's cloud objects (a label); see `config.build.installation_id`.
    installation_id: str = S.DEFAULT_INSTALLATION_ID
    # False when derived (not in the file): the launcher then uses the id pinned in
    # `installation_id_file` at its first start (see `zk.identity`), so that it survives
    # host changes and never comes from ZooKeeper.
    installation_id_explicit: bool = False
    installation_id_file: str = S.INSTALLATION_ID_FILE
    labels: Mapping[str, LabelConfig] = field(default_factory=dict)
    providers: Mapping[str, ProviderConfig] = field(default_factory=dict)
    max_hold_age: float = INF  # seconds; 0 in the file means "no limit"
    webapp: WebappConfig = field(default_factory=WebappConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    tenant_resource_limits: Mapping[str, TenantLimit] = field(default_factory=dict)
    # Files this configuration was read from (for reload change detection).
    sources: tuple[str, ...] = ()
    # Non-fatal findings of the loader ("<file>: <place>: warning: ..."), for the CLI and logs.
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def zk_hosts(self) -> str:
        """kazoo host string `h1:p1,h2:p2/chroot` (IPv6 literals bracketed).

        kazoo takes one chroot for the whole ensemble; the loader rejects servers that name
        different chroots.
        """
        parts = []
        for server in self.zookeeper_servers:
            host = f"[{server.host}]" if ":" in server.host else server.host
            parts.append(f"{host}:{server.port}")
        chroot = next((s.chroot for s in self.zookeeper_servers if s.chroot), "")
        return ",".join(parts) + (chroot or "")

    def pools(self) -> list[PoolConfig]:
        return [pool for provider in self.providers.values() for pool in provider.pools.values()]

    def provider_config(self, name: str | None) -> ProviderConfig | None:
        return self.providers.get(name or "")

    def pool_config(self, provider: str | None, pool: str | None) -> PoolConfig | None:
        prov = self.provider_config(provider)
        return prov.pools.get(pool or "") if prov else None

    def label_quota(self, provider: str | None, pool: str | None,
                    label: str | None) -> Resources | None:
        """The quota a node of `label` in that pool counts for (nodes without `resources`)."""
        found = self.pool_config(provider, pool)
        label_cfg = found.labels.get(label or "") if found else None
        return label_cfg.quota() if label_cfg else None


def with_installation_id(config: Config, installation_id: str) -> Config:
    """`config` with `installation_id` in force (top level and every provider's copy)."""
    if config.installation_id == installation_id and all(
            p.installation_id == installation_id for p in config.providers.values()):
        return config
    providers = {name: dataclasses.replace(p, installation_id=installation_id)
                 for name, p in config.providers.items()}
    return dataclasses.replace(config, installation_id=installation_id, providers=providers)
