"""The znode layout, as pure functions.

Owns: every path nodepool_k8s reads or writes. The `/nodepool/...` part is the Nodepool
protocol (Zuul reads and writes it; do not change it). Znodes of our own live under
`/nodepool_k8s/...` only, never under `/nodepool`, and never as children of a request znode
(Zuul deletes requests non-recursively).
"""

from __future__ import annotations

from urllib.parse import quote

ROOT = "/nodepool"
REQUESTS = f"{ROOT}/requests"
REQUEST_LOCKS = f"{ROOT}/requests-lock"
NODES = f"{ROOT}/nodes"
COMPONENTS = f"{ROOT}/components"
LAUNCHER_COMPONENTS = f"{COMPONENTS}/launcher"
POOL_COMPONENTS = f"{COMPONENTS}/pool"
# kazoo Election (Lock recipe) znodes, shared with Nodepool launchers: one stats leader.
ELECTIONS = f"{ROOT}/elections"
STATS_ELECTION = f"{ELECTIONS}/stats"

# Our own tree. Guards are empty znodes whose version serialises quota decisions.
OWN_ROOT = "/nodepool_k8s"
GUARDS = f"{OWN_ROOT}/guards"
MIN_READY_GUARD = f"{GUARDS}/min-ready"

LOCK_NODE_NAME = "__lock__"


def request_path(request_id: str) -> str:
    return f"{REQUESTS}/{request_id}"


def request_create_prefix(priority: str) -> str:
    """Sequential-create prefix; the priority is exactly three characters (`100`, `900`)."""
    if len(priority) != 3:
        raise ValueError(f"request priority must be 3 characters, got {priority!r}")
    return f"{REQUESTS}/{priority}-"


def request_lock_path(request_id: str) -> str:
    return f"{REQUEST_LOCKS}/{request_id}"


def node_path(node_id: str) -> str:
    return f"{NODES}/{node_id}"


def node_lock_path(node_id: str) -> str:
    return f"{NODES}/{node_id}/lock"


NODE_CREATE_PREFIX = f"{NODES}/"


def component_prefix(kind: str, hostname: str) -> str:
    return f"{COMPONENTS}/{kind}/{hostname}"


def provider_guard_path(provider: str) -> str:
    return f"{GUARDS}/provider-{quote(provider, safe='')}"


def tenant_guard_path(tenant: str) -> str:
    return f"{GUARDS}/tenant-{quote(tenant, safe='')}"


def basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def is_request_id(name: str) -> bool:
    """Zuul's own test: the 4th character is `-`."""
    return len(name) > 4 and name[3] == "-"


def is_node_id(name: str) -> bool:
    return name.isdigit()


def lock_sequence(child: str) -> str:
    """The sequence suffix of a kazoo lock contender (`<uuid>__lock__<seq10>`)."""
    idx = child.rfind(LOCK_NODE_NAME)
    return child[idx + len(LOCK_NODE_NAME):] if idx >= 0 else child
