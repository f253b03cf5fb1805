"""The shapes of the pool-status and circuit-breaker records, as TypedDicts.

Owns: the JSON a pool worker publishes under `/nodepool_k8s/pool-status/<pool-id>` (built
by `launcher.reporting.pool_status`, written by `zk.pool_status.StatusWriter`), the
per-label breaker entries under `/nodepool_k8s/pool-breakers/<provider>.<pool>` (see
`launcher.breaker`), and the condition records a driver reports for a pool (see
`driver.base.ClusterAware`). Pure: no I/O, no logic.

These describe what this code writes; they check nothing at run time. Records read back
from ZooKeeper may come from another launcher version or from anybody with write access,
so the decoders in `zk.pool_status` still test every field a reader relies on, and the
breaker entry is partial (`total=False`) because an entry is built up key by key.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class ConditionRecord(TypedDict):
    """A pool condition as a driver or the pool worker computes it (no type, no time)."""

    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


class CapacityCondition(ConditionRecord):
    """The `Capacity` condition a capacity-aware driver reports, with per-label detail
    (what fits, the matching nodes, the quota keys short) that the status record keeps
    under `capacity`."""

    labels: NotRequired[dict[str, dict[str, Any]]]


class PoolCondition(ConditionRecord):
    """One condition of a published pool status."""

    type: str
    last_transition: float  # wall time the (status, reason) last changed
    # A state the operator chose (paused, draining, disabled): neither healthy nor a fault.
    # Absent from records of launchers that predate it.
    neutral: NotRequired[bool]


class UsageRow(TypedDict):
    """Usage against one finite limit; numbers as published (None: infinite)."""

    scope: str  # "pool" | "provider" | "cloud"
    resource: str
    used: float | int | None
    limit: float | int | None


class TargetRow(TypedDict):
    """A label's min-ready target against the spares counted for it."""

    wanted: int
    spare: int
    pool_level: int  # 1: the pool's own min-ready, 0: the global label's


class BreakerEntry(TypedDict, total=False):
    """One label's circuit-breaker state in a pool's breaker record."""

    state: str  # "closed" | "open" | "probing"
    config: str  # digest of the label's configuration the entry counts for
    probe: str  # the pool worker holding the probe
    reason: str
    message: str
    failures: int
    trips: int
    until: float
    since: float
    probe_at: float


class SuspendedLabel(TypedDict):
    """A suspended label as the pool status shows it (the breaker entry's public keys;
    None where the entry lacks one)."""

    reason: str | None
    message: str | None
    failures: int | None
    trips: int | None
    until: float | None
    state: str | None


class PoolStatusRecord(TypedDict):
    """A pool worker's published status."""

    model: int
    id: str
    hostname: str | None
    provider: str
    pool: str
    priority: int
    labels: list[str]
    nodes: dict[str, int]  # node state -> count
    launches_in_progress: int
    requests_queued: int
    requests_handled: int
    usage: list[UsageRow]
    targets: dict[str, TargetRow]
    drifted: int  # spares built from an older configuration of their label
    paused: bool  # this worker holds the pool's requests back (quota, pause, drain)
    suspended: dict[str, SuspendedLabel]
    capacity: dict[str, Any]  # the capacity condition's detail (its `labels`)
    conditions: list[PoolCondition]
