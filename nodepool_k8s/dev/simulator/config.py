"""`SimulatorConfig`: every knob of a simulator instance, with defaults for fast tests.

Owns only data. Delays are read by the controllers each time they are used, so changing a
delay on `sim.config` at runtime affects later transitions (fault settings are changed with
`Simulator.set_faults` instead, which is locked).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nodepool_k8s.dev.simulator.faults import Faults

DEFAULT_NODE = "sim-node-1"


def _default_nodes() -> dict[str, dict[str, str]]:
    return {DEFAULT_NODE: {"kubernetes.io/hostname": DEFAULT_NODE}}


@dataclass
class SimulatorConfig:
    tls: bool = True
    host: str = "127.0.0.1"
    port: int = 0  # 0 = a free port
    # Pod lifecycle: Pending -> (schedule_delay) scheduled -> (start_delay) Running.
    schedule_delay: float = 0.0
    start_delay: float = 0.0
    # Time between ErrImagePull and ImagePullBackOff for pods hit by the image-pull fault.
    image_pull_backoff_delay: float = 0.0
    # Service-account token secrets get data.token/ca.crt/namespace after this delay.
    token_delay: float = 0.0
    # A deleted namespace stays Terminating this long, then its contents and it go away.
    namespace_delete_delay: float = 0.0
    # A deleted pod keeps existing (with deletionTimestamp) this long; 0 = removed at once.
    pod_delete_delay: float = 0.0
    # Node name -> labels. Pods are scheduled onto nodes whose labels satisfy nodeSelector.
    node_labels: dict[str, dict[str, str]] = field(default_factory=_default_nodes)
    # Node name -> taints ({key, value, effect}) of configured nodes; pods need tolerations.
    node_taints: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    # Node name -> status.allocatable/capacity overrides ({"cpu": "2", "memory": "4Gi"}) of
    # configured nodes (default 16 cpu, 64Gi). The scheduler fits pods' requests in them.
    node_allocatable: dict[str, dict[str, str]] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    # Fixed admin token (default: random per simulator).
    admin_token: str | None = None
    # Change events kept for watch resume; older resourceVersions get 410 Expired.
    watch_history: int = 1000
    # BOOKMARK events are sent this often on watches that allow them.
    bookmark_interval: float = 60.0
    # Default watch length when the client sends no timeoutSeconds.
    default_watch_timeout: float = 1800.0
    # Enforce namespaced RBAC (Role/RoleBinding) for service-account tokens; admin is never
    # restricted. Off by default: service-account tokens may do anything.
    enforce_rbac: bool = False
    # Treat requests without any Authorization header as the admin. None = only without TLS:
    # kubectl (client-go) never sends credentials over plain HTTP, like the old insecure port.
    # A wrong token is a 401 either way.
    anonymous_admin: bool | None = None
    # Create, like a real cluster's controllers do, a "default" ServiceAccount and the
    # "kube-root-ca.crt" ConfigMap in every new namespace. Off by default so tests see only
    # what they created.
    namespace_defaults: bool = False
    # Kubernetes version reported by /version (kubectl's version dispatcher reads it).
    server_version: tuple[int, int, int] = (1, 32, 4)
    # A directory made by `tls.make_tls_material` whose CA and server certificate this
    # simulator serves instead of making its own (None: a new CA per simulator). The test
    # suite shares one per session, as three openssl runs are most of a start; the files
    # are read, never removed. The hosts they were made for must include `host`.
    tls_material_dir: str | None = None
