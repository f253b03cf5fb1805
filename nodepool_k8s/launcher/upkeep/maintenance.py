"""Maintenance windows: when a pool's configured `maintenance` pauses or drains it.

Owns: evaluating a pool's windows at a moment of the injected clock (`active`: the window
in force, as a `PoolState` with source "maintenance"; `next_window`: the next start and
end) and the moment the answer next changes (`next_change`, so a worker wakes on time).
Pure functions of the configuration and a time; nothing is written to ZooKeeper, so every
launcher with the same configuration reaches the same answer on its own.
"""

from __future__ import annotations

import functools

from nodepool_k8s.config.cron import Cron
from nodepool_k8s.config.model import MaintenanceWindow, PoolConfig
from nodepool_k8s.zk.pool_state import PoolState, strongest


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
