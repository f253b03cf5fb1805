"""Maintenance windows, and the one answer to "is this pool paused or drained now?".

Owns: evaluating a pool's windows at a moment of the injected clock (`active`: the window
in force, as a `PoolState` with source "maintenance"; `next_window`: the next start and
end), the moment the answer next changes (`next_change`, so a worker wakes on time), and
`in_force`: the strongest of the operator's state and the window, which the pool worker,
drain and min-ready all ask.
Pure functions of the configuration and a time; nothing is written to ZooKeeper, so every
launcher with the same configuration reaches the same answer on its own.
"""

from __future__ import annotations

import functools
from typing import Protocol

from nodepool_k8s.config.cron import Cron
from nodepool_k8s.config.model import MaintenanceWindow, PoolConfig
from nodepool_k8s.zk.pool_state import PoolState, strongest


class OperatorStates(Protocol):
    """The operator's pause/drain states (`zk.pool_state.PoolStateCache`)."""

    def state_for(self, provider: str, pool: str) -> PoolState | None: ...


def in_force(states: OperatorStates, provider: str, pool: PoolConfig,
             now: float) -> PoolState | None:
    """The pause or drain in force for the pool (the operator's or a window's)."""
    return strongest([s for s in (states.state_for(provider, pool.name), active(pool, now))
                      if s is not None])


@functools.lru_cache(maxsize=256)
def _cron(schedule: str, timezone: str) -> Cron:
    return Cron.parse(schedule, timezone)


def window_span(window: MaintenanceWindow, now: float) -> tuple[float, float] | None:
    """(start, end) of the window occurrence in force at `now`, or None."""
    start = _cron(window.schedule, window.timezone).last_at_or_before(now)
    if start is not None and now < start + window.duration:
        return start, start + window.duration
    return None


def active(pool: PoolConfig, now: float) -> PoolState | None:
    found = []
    for window in pool.maintenance:
        span = window_span(window, now)
        if span is not None:
            found.append(PoolState(
                target=f"{pool.provider}/{pool.name}", action=window.action,
                reason=f"maintenance window {window.schedule!r} ({window.timezone})",
                by="maintenance", time=span[0], source="maintenance"))
    return strongest(found)


def next_window(pool: PoolConfig, now: float) -> tuple[float, float, MaintenanceWindow] | None:
    """The next window to start after `now`: (start, end, window)."""
    best: tuple[float, float, MaintenanceWindow] | None = None
    for window in pool.maintenance:
        start = _cron(window.schedule, window.timezone).next_after(now)
        if start is not None and (best is None or start < best[0]):
            best = (start, start + window.duration, window)
    return best


def next_change(pool: PoolConfig, now: float) -> float | None:
    """When the maintenance state may change next (a window starts or ends)."""
    moments = []
    for window in pool.maintenance:
        span = window_span(window, now)
        if span is not None:
            moments.append(span[1])
        start = _cron(window.schedule, window.timezone).next_after(now)
        if start is not None:
            moments.append(start)
    return min(moments) if moments else None
