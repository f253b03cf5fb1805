"""Engine timing and sizing knobs that are not part of the Nodepool configuration file.

Owns: the defaults of intervals, ages, backoffs and worker-pool sizes, in one frozen
dataclass with a comment per field. The daemon takes an `EngineSettings`; operators, tests
and benchmarks may override fields from the environment (`NODEPOOL_K8S_<FIELD>` in upper
case, e.g. `NODEPOOL_K8S_CLEANUP_INTERVAL=5`). Every value, however it arrives (environment,
constructor, `replace`), is checked when the settings are made: a non-number, NaN,
infinity, a negative or (except where a field says 0 means "off") zero raises ConfigError
naming the setting.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping

from nodepool_k8s.runtime import validate
from nodepool_k8s.core.errors import ConfigError

ENV_PREFIX = "NODEPOOL_K8S_"
# Fields where 0 is meaningful: no rate limit on reclaims; do not wait for launches on stop;
# every launcher deletes any node at once; waiting launchers try for freed room at once;
# housekeeping never yields to launches; every launcher reads every new request at once.
ZERO_ALLOWED = frozenset({"reclaim_interval", "stop_timeout", "delete_grace",
                          "quota_yield", "delete_defer_max", "request_first_look"})


@dataclass(frozen=True)
class EngineSettings:
    # Periodic safety net of the cleanup worker (lost requests, orphaned lock dirs, a full
    # scan of nodes); most cleanup is triggered by cache events well before this.
    cleanup_interval: float = 60.0
    # How often each provider's resources are compared with ZooKeeper (leak sweep).
    leak_sweep_interval: float = 60.0
    # An unlocked `init` node older than this is abandoned (its creator died before locking).
    stale_init_age: float = 60.0
    # A node to delete that another live launcher built (its `launcher` is a registered
    # pool of another process) is left to that launcher for this many seconds in its state;
    # then any launcher deletes it. Without the builder registered, at once. Each launcher
    # deleting every used node at once raced for each one (lock attempts, failed writes).
    delete_grace: float = 30.0
    # Request-lock dirs without a request are removed after this many seconds (Nodepool: 8 h).
    lock_dir_max_age: float = 8 * 3600.0
    # Empty node znodes (no data) are removed once older than this.
    empty_node_age: float = 5.0
    # Launch threads per provider when the provider's max-concurrency is unlimited (<= 0).
    launch_workers: int = 32
    # Threads deleting nodes and leaked resources. They send the deletions; none waits for a
    # Terminating namespace (the deleter parks such nodes), so a few serve large bursts.
    delete_workers: int = 8
    # Launch first: while this launcher's launches are queued or running and no pool of the
    # node's provider waits for quota or capacity, a deletion (and the cleanup's full pass
    # and leak sweep) waits for them, at most this many seconds; then it starts whatever
    # runs. 0: never wait.
    delete_defer_max: float = 10.0
    # After a failed deletion (TemporaryError) retry after this many seconds, doubling up to
    # `delete_retry_max`.
    delete_retry: float = 5.0
    delete_retry_max: float = 300.0
    # After the cloud refused a launch for quota (node aborted), wait this long before the
    # paused request tries again.
    quota_retry: float = 5.0
    # At quota, the pool deletes its oldest unused ready node (one at a time: never while
    # another node of the pool is deleting), and at most once per this many seconds.
    reclaim_interval: float = 0.0
    # After a min-ready request failed, wait before creating another for that label
    # (doubling up to `min_ready_backoff_max`).
    min_ready_backoff: float = 5.0
    min_ready_backoff_max: float = 120.0
    # A request waiting at quota whose launcher sees room lets an older request that
    # another launcher of the same pool holds (waiting at quota too) try first, for at most
    # this many seconds; then it tries itself. 0: every waiting launcher tries at once (all
    # but one lose, each a failed write). One launcher alone never waits.
    quota_yield: float = 1.0
    # First look: with several launchers whose registered pools all serve the same labels,
    # a new request is left to one of them (by its sequence number, among the launchers
    # with a pool not paused) for this many seconds; the others read it only if that one
    # has not taken its lock by then, or when it lets the request go unserved. Each
    # request is then read by about one launcher instead of all. 0: every launcher reads
    # every request at once. One launcher alone never waits.
    request_first_look: float = 0.25
    # Optimistic quota decisions retry this many times on concurrent changes per pass.
    guard_attempts: int = 20
    # On graceful stop, wait this long for cancelled launches to return.
    stop_timeout: float = 1.5
    # A pool's published status (launcher.pool_status) is rewritten for changed counts or
    # usage at most this often; changed conditions are written at once.
    pool_status_interval: float = 10.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            try:
                if f.type in (int, "int"):
                    checked: float = validate.positive_int(
                        value, allow_zero=f.name in ZERO_ALLOWED)
                    if not isinstance(value, int):  # 2.5 workers is a mistake, not 2
                        raise ValueError(f"not an integer: {value!r}")
                else:
                    checked = validate.finite_number(value, allow_zero=f.name in ZERO_ALLOWED)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}: {exc}") from None
            object.__setattr__(self, f.name, checked)
        for low, high in (("delete_retry", "delete_retry_max"),
                          ("min_ready_backoff", "min_ready_backoff_max")):
            if getattr(self, low) > getattr(self, high):
                raise ConfigError(f"{ENV_PREFIX}{low.upper()} ({getattr(self, low):g}) must not"
                                  f" exceed {ENV_PREFIX}{high.upper()}"
                                  f" ({getattr(self, high):g})")

    def replace(self, **changes: float | int) -> "EngineSettings":
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "EngineSettings":
        env = os.environ if env is None else env
        changes: dict[str, float | int] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None:
                continue
            try:
                changes[f.name] = validate.positive_int(raw, allow_zero=True, maximum=10**9) \
                    if f.type in (int, "int") else validate.finite_number(raw, allow_zero=True)
            except ValueError as exc:
                raise ConfigError(f"{ENV_PREFIX}{f.name.upper()}: {exc}") from None
        # Zero and the ranges are checked once, by __post_init__, for every way in.
        return cls(**changes)  # type: ignore[arg-type]


def next_backoff(last: float, first: float, maximum: float) -> float:
    """The delay after another failure: `first`, then doubling, never above `maximum`
    (`last`: the previous delay, 0 for none). The one backoff formula of the engine (the
    deleter's retries, min-ready's failed requests)."""
    return min(maximum, last * 2 if last else first)
