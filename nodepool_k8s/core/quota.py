"""Quota arithmetic: pure functions over resource amounts, no I/O.

Owns: what a node counts against limits, how usage is summed from node records, and the
verdicts "fits now", "can never fit" for pool, provider and tenant limits. Callers pass the
usage they read (the launcher reads it from ZooKeeper, the single source of truth); nothing
here looks anything up, so every boundary is unit-testable.

Limits are `Resources.limits(...)` (missing keys unlimited); amounts default to 0. A limit
is exceeded when usage + demand is strictly greater than it (a pool with max-servers 2 holds
exactly two nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from nodepool_k8s.core.model import Resources

SCOPE_POOL = "pool"
SCOPE_PROVIDER = "provider"
SCOPE_CLOUD = "cloud"
SCOPE_TENANT = "tenant"


class LabelDemand(Protocol):
    """A label as quota sees it (`config.model.LabelConfig`)."""

    def quota(self) -> Resources: ...


class PoolLimits(Protocol):
    """A pool as quota sees it (`config.model.PoolConfig`): its labels and its limits."""

    @property
    def labels(self) -> Mapping[str, LabelDemand]: ...

    def limits(self) -> Resources: ...


class ProviderLimits(Protocol):
    """A provider as quota sees it (`config.model.ProviderConfig`)."""

    def limits(self) -> Resources: ...


class TenantLimits(Protocol):
    """One `tenant-resource-limits` entry (`config.model.TenantLimit`)."""

    @property
    def limits(self) -> Resources: ...


class NodeUsage(Protocol):
    """What usage accounting reads from a node (a full `model.Node` or a cached record)."""

    @property
    def provider(self) -> Any: ...

    @property
    def pool(self) -> Any: ...

    @property
    def tenant_name(self) -> Any: ...

    @property
    def resources(self) -> Any: ...

    @property
    def label(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """The quota-relevant facts of one node (immutable after creation, except tenant)."""

    provider: str | None
    pool: str | None
    tenant: str | None
    resources: Resources


@dataclass(frozen=True)
class Fit:
    ok: bool
    scope: str | None = None
    exceeded: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.ok

    def describe(self) -> str:
        if self.ok:
            return "fits"
        return f"{self.scope} limit exceeded for {', '.join(self.exceeded)}"


FITS = Fit(True)


def own_resources(stored: Any) -> Resources | None:
    """A node's `resources` as a Resources value; None when it holds no amount."""
    if isinstance(stored, Mapping):
        values: dict[str, float] = {}
        for key, value in stored.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[str(key)] = float(value)
        if values:
            return Resources(values)
    return None


def node_resources(stored: Any, fallback: Resources | None = None) -> Resources:
    """A node's `resources` as a Resources value.

    Nodes written by other launchers may lack the key or carry junk; those count as the
    label's quota when known (`fallback`), else as one instance, so they are never free.
    """
    own = own_resources(stored)
    if own is not None:
        return own
    return fallback if fallback is not None else Resources({"instances": 1})


def total(records: Iterable[UsageRecord], *, provider: str | None = None,
          pool: str | None = None, tenant: str | None = None) -> Resources:
    """Sum the resources of the records matching every given filter."""
    acc: dict[str, float] = {}
    for rec in records:
        if provider is not None and rec.provider != provider:
            continue
        if pool is not None and rec.pool != pool:
            continue
        if tenant is not None and rec.tenant != tenant:
            continue
        for key, amount in rec.resources.items():
            acc[key] = acc.get(key, 0.0) + amount
    return Resources(acc)


class Totals:
    """The sums of usage records a quota check reads: of one pool, of its provider and of
    each tenant asked about, worked out once for a batch of checks on the same records.
    `plus` adds records (nodes planned by the batch) on top, summed in the order `total`
    would sum the longer list, so every answer equals `total` over it."""

    def __init__(self, records: Sequence[UsageRecord], provider: str, pool: str,
                 _sums: tuple[Resources, Resources] | None = None) -> None:
        self._records = records
        self._provider_name, self._pool_name = provider, pool
        if _sums is None:
            _sums = (total(records, provider=provider, pool=pool),
                     total(records, provider=provider))
        self.pool, self.provider = _sums
        self._tenants: dict[str | None, Resources] = {}

    def tenant(self, name: str | None) -> Resources:
        known = self._tenants.get(name)
        if known is None:
            known = self._tenants[name] = total(self._records, tenant=name)
        return known

    def plus(self, added: Sequence[UsageRecord]) -> "Totals":
        pool, provider = self.pool, self.provider
        for rec in added:
            if rec.provider == self._provider_name:
                provider = provider + rec.resources
                if rec.pool == self._pool_name:
                    pool = pool + rec.resources
        return Totals(list(self._records) + list(added), self._provider_name,
                      self._pool_name, (pool, provider))


def demand(labels: Sequence[str], pool: PoolLimits) -> Resources:
    """What launching one node per entry of `labels` in `pool` would add to usage."""
    return Resources.total(pool.labels[name].quota() for name in labels
                           if name in pool.labels)


def _verdict(amount: Resources, limit: Resources, scope: str) -> Fit:
    exceeded = amount.exceeded_keys(limit)
    return Fit(False, scope, tuple(exceeded)) if exceeded else FITS


def never_fits(need: Resources, pool: PoolLimits, provider: ProviderLimits,
               cloud_limits: Resources | None = None) -> Fit:
    """FITS unless `need` alone is over a limit: then no amount of waiting helps."""
    for limit, scope in ((pool.limits(), SCOPE_POOL), (provider.limits(), SCOPE_PROVIDER),
                         (cloud_limits or Resources.limits(), SCOPE_CLOUD)):
        verdict = _verdict(need, limit, scope)
        if not verdict:
            return verdict
    return FITS


def check(need: Resources, *, pool_usage: Resources, provider_usage: Resources,
          pool: PoolLimits, provider: ProviderLimits,
          cloud_limits: Resources | None = None) -> Fit:
    """Does `need` fit on top of current usage, in the pool and across the provider?"""
    checks = ((pool_usage + need, pool.limits(), SCOPE_POOL),
              (provider_usage + need, provider.limits(), SCOPE_PROVIDER),
              (provider_usage + need, cloud_limits or Resources.limits(), SCOPE_CLOUD))
    for amount, limit, scope in checks:
        verdict = _verdict(amount, limit, scope)
        if not verdict:
            return verdict
    return FITS


def check_tenant(need: Resources, tenant_usage: Resources,
                 limit: TenantLimits | None) -> Fit:
    """Tenant limits (`tenant-resource-limits`); no entry means unlimited."""
    if limit is None:
        return FITS
    return _verdict(tenant_usage + need, limit.limits, SCOPE_TENANT)


def tightest(limits: Iterable[Resources]) -> Resources:
    """The element-wise minimum of limits (missing keys unlimited)."""
    values: dict[str, float] = {}
    for limit in limits:
        for key in limit:
            values[key] = min(values.get(key, math.inf), limit[key])
    return Resources.limits(values)
