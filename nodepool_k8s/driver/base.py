"""The one small interface between the launcher core and a cloud driver.

Owns: `Provider` (what a driver must do), `ClusterAware` (what a driver may do besides,
declared by its class), the value types crossing the boundary
(`LaunchSpec`, `LaunchResult`, `CloudResource`, `ProviderHealth`) and the contract of the
errors a driver raises. The core never imports a concrete driver or `kubernetes`;
`driver.registry` maps a config `driver:` name to a factory.

Error contract:
- `launch` raises `LaunchError` for a failed attempt (`retryable=False` when retrying the
  same label cannot help, e.g. an invalid spec); `QuotaExceeded` when the cloud refused for
  lack of capacity (the core pauses instead of counting a failure); `ProviderUnavailable`
  when the provider cannot act at all now, whatever the label (its credentials refused):
  the core aborts the node as for quota, counts no failure against the label and keeps the
  request waiting; `TemporaryError` for API trouble that outlived the driver's own retries.
  On any of these the driver has already removed what it created for that attempt, or left
  it labelled so the leak sweeper finds it.
- `delete` is a reconcile step: it looks at the resource, acts (the first call asks the
  cloud to delete it; later calls look again and, past the provider's grace, clear what
  holds it) and returns `Gone` (a missing resource is gone) or `Underway` (look again by
  `recheck_at`), without waiting. Calling it again is always safe. It raises
  `TemporaryError` when it could not look or act (the core retries later, and keeps the
  node record until then: nothing is forgotten), and `NotOwned` when the resource is not
  provably this installation's (and, given `node_id`, that node's): nothing was deleted and
  the core must not retry (it drops the record and says why). The caller keeps every
  deadline (`delete-timeout`); the provider keeps none.
- `list_resources` raises `TemporaryError` when the cloud cannot be listed (no sweep then).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from nodepool_k8s.core.conditions import Condition
from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.core.model import Resources
from nodepool_k8s.core.pool_records import CapacityCondition, ConditionRecord
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class RequestInfo:
    """The request facts a driver may use (e.g. for `dynamic-labels` formatting)."""

    id: str
    labels: tuple[str, ...] = ()
    requestor: str | None = None
    requestor_data: Any = None
    relative_priority: int = 0
    event_id: str | None = None
    created_time: float | None = None
    tenant_name: str | None = None


@dataclass(frozen=True)
class LaunchSpec:
    node_id: str
    provider: ProviderConfig
    pool: PoolConfig
    label: PoolLabel
    request: RequestInfo
    attempt: int = 1  # 1-based; drivers must use a fresh external name per attempt


@dataclass(frozen=True)
class LaunchResult:
    """What the core writes onto the node when it becomes ready."""

    external_id: str
    connection_type: str
    connection_port: Any  # a dict for Kubernetes nodes (see the protocol's Part B)
    interface_ip: str | None = None
    host_id: str | None = None
    cloud: str | None = None
    python_path: str | None = "auto"
    shell_type: str | None = None
    resources: Mapping[str, float] | None = None
    driver_data: Any = None
    hostname: str | None = None
    username: str | None = None
    # Further keys written onto the node record (e.g. `token_expires`); Zuul ignores them.
    extra: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class CloudResource:
    """A cloud object the provider believes it created (for leak detection)."""

    external_id: str
    node_id: str | None
    provider: str
    created: float | None = None  # epoch seconds, when the cloud says
    deleting: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Gone:
    """`Provider.delete`: the resource is gone (or never was)."""


@dataclass(frozen=True)
class Underway:
    """`Provider.delete`: the cloud is deleting the resource (a namespace Terminating).

    `recheck_at` (the provider's monotonic clock) is when to call `delete` again even if no
    wake-up came: the next step is due then (the grace runs out, a cleared namespace should
    have emptied, an unwatched one should be looked at). `stuck` is set on the call that
    first finds the resource going for longer than the provider allows (past
    `terminating-grace`): what holds it, for the caller to show before a later call clears
    it. Not a failure: nothing is logged or retried with back-off for it."""

    recheck_at: float
    detail: str
    stuck: str | None = None


Deletion = Gone | Underway
"""What one `Provider.delete` call found: gone, or underway with a time to look again."""


@dataclass(frozen=True)
class ProviderHealth:
    """Whether a provider can reach its cloud's API now (`ClusterAware.api_health`): the
    server answers, its certificate is trusted and it accepts the launcher's credentials.

    `healthy` is None until the provider has found out once. `reason` is one of
    `conditions.REASONS` (`Reachable`, `Unreachable`, `TLSUntrusted`, `Unauthorized`);
    `since` the wall time `healthy` and `reason` took their values. The pools of the
    provider publish it as their `ApiReachable` condition; a request handler may take an
    unhealthy provider as a reason to leave requests to others."""

    healthy: bool | None
    reason: str
    message: str = ""
    since: float | None = None

    def condition(self) -> ConditionRecord:
        """The pools' `ApiReachable` condition (status, reason, message)."""
        status = "Unknown" if self.healthy is None else "True" if self.healthy else "False"
        return {"status": status, "reason": self.reason, "message": self.message}


class Progress(Protocol):
    """The core's progress callback: `progress(external_id, *conditions)`.

    Called with the external id as soon as it is known (the core records it at once, with
    the conditions given in that call), then with the same id and condition updates
    (`Registered`, `Initialized`, ...) as phases complete; those ride along with the
    core's next write. A driver may call it with the external id only.
    """

    def __call__(self, external_id: str, *updates: Condition) -> None: ...


class Provider(Protocol):
    """A configured provider instance. Methods may block; the core calls them from workers."""

    name: str

    def start(self) -> None:
        """Connect (load credentials, open clients). Raises TemporaryError if not possible."""

    def stop(self) -> None:
        """Release clients and background threads. Idempotent."""

    def launch(self, spec: LaunchSpec, cancel: threading.Event,
               progress: Progress | None = None) -> LaunchResult:
        """Create everything for one node and wait until it is usable.

        `cancel` is set when the core gives up (shutdown, ZooKeeper session loss): return
        promptly by raising LaunchCancelled (a LaunchError). `progress(external_id,
        *conditions)` is called as soon as the external id is known, so the core can record
        it before waiting, and again with condition updates (see `Progress`). A failure's
        `reason` should be one of `conditions.REASONS`.
        """

    def delete(self, external_id: str, node_id: str | None = None,
               wake: Callable[[], None] | None = None, verify: bool = False) -> Deletion:
        """One reconcile step of deleting the resource (missing = `Gone`); never waits.

        Only a resource carrying this installation's ownership labels (and node `node_id`'s,
        when given) is deleted; anything else raises `NotOwned` without being touched.

        `wake()` may be called (from one of the provider's threads; it must not block) when
        calling again is worth it before `recheck_at`: the resource left, or the next step
        is possible now. It is only a hint: it decides nothing, and the caller may ignore
        it. With `verify` the provider asks the cloud itself, never a cache of its own (the
        caller's deadline passed: a watch that stopped working keeps an old copy).
        """

    def ownership_problem(self, external_id: str, node_id: str) -> str | None:
        """Why `external_id` is not provably node `node_id`'s resource of this installation
        (None when it is), checked before a ready node is handed to another request: a
        record anybody can write must not send a job into somebody else's namespace.
        May raise TemporaryError when it cannot tell now."""

    def list_resources(self) -> Sequence[CloudResource]:
        """Every resource carrying this provider's ownership labels."""

    def quota_for_label(self, label: PoolLabel) -> Resources:
        """What one node of `label` counts against quotas."""

    def cloud_limits(self, label: PoolLabel | None = None) -> Resources:
        """Capacity the cloud itself imposes beyond configured limits (infinite if unknown).

        Without `label`: hard ceilings only (a request over them can never be served);
        with one: what fits now for nodes of that label (the core pauses beyond it)."""


class ClusterAware(Protocol):
    """An optional capability: a provider that watches its cluster's capacity, its own
    credentials and whether its API answers, and reports them as pool conditions.

    A driver class declares it by naming it among its bases (`class X(ClusterAware)`);
    `driver.registry.cluster_aware` checks the declaration once, when the launcher
    registers a provider, and the launcher then holds the provider also as a
    `ClusterAware`. A provider that does not declare it is never asked any of this.
    """

    def on_capacity_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (it must not block) when capacity may have freed, when the
        credentials become refused or accepted again, and when the API becomes unreachable
        or reachable again: paused pools look again at once."""

    def reload_credentials(self) -> bool:
        """Read the credentials again now (the operator reloaded the configuration).
        False when they now name another server or trust, which a running provider does
        not follow: the launcher replaces the provider then."""

    def capacity_condition(self, pool: PoolConfig) -> CapacityCondition | None:
        """The pool's `Capacity` condition (None: the provider does not read capacity)."""

    def credentials_condition(self) -> ConditionRecord | None:
        """The `Credentials` condition of the provider's pools (None: not started)."""

    def api_health(self) -> ProviderHealth | None:
        """Whether the provider's API answers now (None: not started); cheap, never
        blocks on the network (the provider keeps it current by itself)."""


# `ApiCallListener`'s `code` of a request that got no HTTP answer (refused, reset, timed
# out, TLS failure).
API_NO_ANSWER = "none"


class ApiCallListener(Protocol):
    """Hears of every request a provider sent to its cloud's API: `verb` (`get`, `list`,
    `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`), `resource`
    (`pods`, `serviceaccounts/token`, ...) and the HTTP status `code` (`"none"` when no
    answer came). Called on the thread that made the request: it must not block."""

    def __call__(self, provider: str, verb: str, resource: str, code: str) -> None: ...


class ApiMetered(Protocol):
    """An optional capability: a provider that reports each API request it sends.

    Declared like `ClusterAware` (named among the class's bases); the launcher hands it
    the listener (`driver.registry.api_metered`) before `start`."""

    def on_api_call(self, listener: ApiCallListener) -> None:
        """Report every API request from now on to `listener` (replacing any earlier one)."""


ProviderFactory = Callable[[ProviderConfig], Provider]


def delete_and_wait(provider: Provider, external_id: str, node_id: str | None,
                    timeout: float, clock: Clock = SYSTEM_CLOCK) -> None:
    """Call `provider.delete` until the resource is gone, for a caller that must wait (a
    command in the foreground): between calls it sleeps until the provider's `recheck_at`
    or its wake-up, whichever comes first. Past `timeout` one verifying call decides;
    still underway then raises TemporaryError. NotOwned and the provider's errors pass."""
    woken = threading.Event()
    deadline = clock.monotonic() + timeout
    verify = False
    while True:
        woken.clear()
        result = provider.delete(external_id, node_id=node_id, wake=woken.set,
                                 verify=verify)
        if isinstance(result, Gone):
            return
        if verify:
            raise TemporaryError(f"{external_id} still exists after {timeout:g}s:"
                                 f" {result.detail}")
        now = clock.monotonic()
        if now >= deadline:
            verify = True
            continue
        woken.wait(max(min(result.recheck_at, deadline) - now, 0.0))
