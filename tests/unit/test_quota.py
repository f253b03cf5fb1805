"""Pure quota arithmetic: exact boundaries for pool, provider, cloud and tenant limits,
usage sums with filters, and nodes whose `resources` are missing or junk."""

from __future__ import annotations

import math

from nodepool_k8s.core import quota
from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig, TenantLimit
from nodepool_k8s.core.model import Resources


def pool(**kw: object) -> PoolConfig:
    labels = {"small": PoolLabel(name="small", type="namespace"),
              "big": PoolLabel(name="big", type="pod", cpu=4, memory=2048)}
    return PoolConfig(name="main", provider="p", labels=labels, **kw)  # type: ignore[arg-type]


def provider(p: PoolConfig, **kw: object) -> ProviderConfig:
    return ProviderConfig(name="p", driver="fake", pools={p.name: p}, **kw)  # type: ignore


def rec(pool_name: str = "main", tenant: str | None = None, instances: float = 1,
        cores: float = 0, provider_name: str = "p") -> quota.UsageRecord:
    return quota.UsageRecord(provider_name, pool_name, tenant,
                             Resources({"instances": instances, "cores": cores}))


def test_demand_sums_label_quotas_with_duplicates() -> None:
    need = quota.demand(["big", "big", "small"], pool())
    assert need["instances"] == 3 and need["cores"] == 8 and need["ram"] == 4096


def test_max_servers_boundary_is_inclusive() -> None:
    p = pool(max_servers=2)
    prov = provider(p)
    one = quota.demand(["small"], p)
    used_one = quota.total([rec()])
    assert quota.check(one, pool_usage=used_one, provider_usage=used_one, pool=p, provider=prov)
    used_two = quota.total([rec(), rec()])
    verdict = quota.check(one, pool_usage=used_two, provider_usage=used_two, pool=p,
                          provider=prov)
    assert not verdict and verdict.scope == "pool" and verdict.exceeded == ("instances",)


def test_provider_limit_counts_all_pools() -> None:
    p = pool(max_servers=10)
    prov = provider(p, max_servers=3)
    records = [rec(), rec(pool_name="other"), rec(pool_name="other")]
    verdict = quota.check(quota.demand(["small"], p),
                          pool_usage=quota.total(records, provider="p", pool="main"),
                          provider_usage=quota.total(records, provider="p"), pool=p,
                          provider=prov)
    assert not verdict and verdict.scope == "provider"


def test_cores_and_cloud_limits() -> None:
    p = pool(max_cores=8)
    prov = provider(p)
    need = quota.demand(["big"], p)
    used = quota.total([rec(cores=4)])
    assert quota.check(need, pool_usage=used, provider_usage=used, pool=p, provider=prov)
    used = quota.total([rec(cores=5)])
    assert not quota.check(need, pool_usage=used, provider_usage=used, pool=p, provider=prov)
    cloud = Resources.limits({"instances": 1})
    verdict = quota.check(need, pool_usage=Resources(), provider_usage=quota.total([rec()]),
                          pool=p, provider=prov, cloud_limits=cloud)
    assert verdict.scope == "cloud"


def test_never_fits() -> None:
    p = pool(max_cores=6)
    assert quota.never_fits(quota.demand(["big"], p), p, provider(p))
    assert not quota.never_fits(quota.demand(["big", "big"], p), p, provider(p))
    disabled_provider = provider(p, max_servers=1)
    assert not quota.never_fits(quota.demand(["small", "small"], p), p, disabled_provider)


def test_tenant_limit() -> None:
    limit = TenantLimit("t1", Resources.limits({"instances": 2}))
    need = Resources({"instances": 1})
    records = [rec(tenant="t1"), rec(tenant="t2"), rec(tenant="t2")]
    assert quota.check_tenant(need, quota.total(records, tenant="t1"), limit)
    records.append(rec(tenant="t1"))
    verdict = quota.check_tenant(need, quota.total(records, tenant="t1"), limit)
    assert not verdict and verdict.scope == "tenant"
    assert quota.check_tenant(need, quota.total(records, tenant="t1"), None)


def test_node_resources_fallbacks() -> None:
    assert quota.node_resources({"cores": 2, "instances": 1})["cores"] == 2
    fallback = Resources({"instances": 1, "cores": 3})
    assert quota.node_resources(None, fallback) == fallback
    assert quota.node_resources({"cores": "lots", "x": True}, None) == Resources({"instances": 1})
    assert quota.node_resources({}, None)["instances"] == 1


def test_unlimited_by_default() -> None:
    p = pool()
    assert p.limits()["instances"] == math.inf
    big = Resources({"instances": 10**9})
    assert quota.check(big, pool_usage=big, provider_usage=big, pool=p, provider=provider(p))


def test_totals_equal_total_over_the_records_and_what_is_added() -> None:
    """A batch of checks sums the records once (`Totals`) and adds the nodes it plans on
    top: every sum equals `total` over the longer list, to the last bit (fractional
    amounts, other pools, providers and tenants mixed in, keys only some records have)."""
    base = [rec(cores=0.1), rec("other", "t1", cores=0.2), rec(tenant="t1", cores=0.3),
            rec(provider_name="q", tenant="t1", cores=7),
            quota.UsageRecord("p", "main", "t2", Resources({"gpu": 1.0 / 3}))]
    added = [[rec(tenant="t1", cores=0.7)], [rec("other", cores=1e-9), rec(cores=0.1)],
             [quota.UsageRecord("p", "main", None, Resources({"gpu": 0.1, "cores": 3}))]]
    totals = quota.Totals(base, "p", "main")
    records = list(base)
    for more in [[]] + added:
        totals, records = totals.plus(more), records + more
        assert totals.pool == quota.total(records, provider="p", pool="main")
        assert totals.provider == quota.total(records, provider="p")
        for tenant in ("t1", "t2", None):
            assert totals.tenant(tenant) == quota.total(records, tenant=tenant)
        assert dict(totals.pool) == dict(quota.total(records, provider="p", pool="main"))
