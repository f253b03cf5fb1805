"""Pool status: the conditions and counts one pool worker publishes for operators.

Owns: computing, after each pass of a pool worker, the pool's conditions (each with
`status` True/False/Unknown, `reason`, `message` and `last_transition`), usage against
limits and counts, and publishing them (`zk.pool_status.StatusWriter`) only when they
changed, rate-limited:

- `Validated`: Valid / Disabled / LabelExceedsLimits (a label that can never fit);
- `AtTarget`: TargetMet / UnderTarget / OverTarget against the pool-level and global
  `min-ready` of the pool's labels (spares as min-ready counts them: not the ready records
  it found cannot be handed out); Paused / Draining (Unknown, neutral) while the operator
  or a maintenance window pauses or drains the pool, Draining while a disabled pool still
  has nodes;
- `Quota`: Under / AtLimit, naming the binding limit (pool, provider, cloud, tenant) and
  usage vs limit per resource;
- `Capacity`: Sufficient / Constrained / NoneAvailable from the provider's view of the
  cluster (capacity awareness), Disabled (Unknown, neutral) when it does not read it;
- `Suspended`: True with reason LabelSuspended while the circuit breaker holds a label;
- `Credentials`: Accepted / Rejected, the provider's view of its own credentials (a
  Kubernetes provider whose API server refuses them, 401, even after loading them again:
  launches wait, nothing fails), Unknown when the provider does not report them;
- `ApiReachable`: Reachable / Unreachable / TLSUntrusted / Unauthorized, the provider's
  view of its API server (`driver.base.ProviderHealth`), Unknown when the provider does
  not report it;
- `Drifted`: True with reason SparesDrifted while spare nodes of the pool (ready, nobody
  uses them) were built from an older configuration of their label than this launcher's
  (`config.fingerprint`), the count in the message and in the record's `drifted`; the
  drift pass replaces them within the pool's `drift-budget`. False (NoneDrifted)
  otherwise. Computed here from the cached nodes: the pass over them is already made, and
  nothing is written to a node for it (`nodepool show` derives the node's own `Drifted`
  condition the same way).

The record also says whether this launcher's worker holds the pool's requests back
(`paused`: at quota, or paused or drained by the operator or a window), which the one
status per pool (`views.pools`) shows for each launcher.

Each published condition carries `neutral`: True for a state the operator chose
(`conditions.NEUTRAL_REASONS`: paused, draining, disabled), which readers show as neither
healthy nor a fault.

A change of any condition's (status, reason) or of the suspended labels is written at
once; a change of counts or usage only, at most once per `pool_status_interval`: the
budget of ZooKeeper writes per node (tools/benchmark) is not touched by busy pools.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, TypedDict, cast

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import quota
from nodepool_k8s.config.fingerprint import label_hash
from nodepool_k8s.config.model import Config, PoolConfig, ProviderConfig
from nodepool_k8s.launcher import breaker as breakers
from nodepool_k8s.launcher import plan
from nodepool_k8s.core.model import Resources
from nodepool_k8s.views import pools as pool_view
from nodepool_k8s.core.pool_records import (BreakerEntry, CapacityCondition, ConditionRecord,
                                            PoolCondition, PoolStatusRecord, SuspendedLabel,
                                            TargetRow, UsageRow)

TRUE, FALSE, UNKNOWN = cond.TRUE, cond.FALSE, cond.UNKNOWN
CONDITIONS = ("Validated", "AtTarget", "Quota", "Capacity", "Suspended", "Credentials",
              "ApiReachable", "Drifted")
MODEL_VERSION = 1


def _cond(status: str, reason: str, message: str = "") -> cond.Condition:
    """A fresh pool condition: its type and transition time are set by `StatusBuilder`."""
    return cond.Condition("", status, reason, message)


def _reported(value: Mapping[str, object] | None, default: cond.Condition) -> cond.Condition:
    """A condition the provider reports as a mapping (capacity, credentials)."""
    if not value:
        return default
    return _cond(str(value.get("status", UNKNOWN)), str(value.get("reason", "")),
                 str(value.get("message", "")))


def _num(value: float) -> float | int | None:
    if math.isinf(value):
        return None
    return int(value) if float(value).is_integer() else round(value, 3)


# `validated` is asked at every pass of every pool worker and depends only on the
# configuration objects (a reload makes new ones) and the cloud limits: remembered per
# pool, checked by identity (bounded: cleared when full; a race computes it twice).
_VALIDATED_MAX = 256
_validated: dict[tuple[int, int, Resources | None],
                 tuple[PoolConfig, ProviderConfig, cond.Condition]] = {}


def validated(pool: PoolConfig, provider: ProviderConfig,
              cloud: Resources | None) -> cond.Condition:
    key = (id(pool), id(provider), cloud)
    known = _validated.get(key)
    if known is not None and known[0] is pool and known[1] is provider:
        return known[2]
    verdict = _validated_afresh(pool, provider, cloud)
    if len(_validated) >= _VALIDATED_MAX:
        _validated.clear()
    _validated[key] = (pool, provider, verdict)
    return verdict


def _validated_afresh(pool: PoolConfig, provider: ProviderConfig,
                      cloud: Resources | None) -> cond.Condition:
    if pool.disabled:
        return _cond(FALSE, "Disabled", "max-servers is 0: the pool takes no requests")
    bad = []
    for name in sorted(pool.labels):
        verdict = quota.never_fits(quota.demand([name], pool), pool, provider, cloud)
        if not verdict:
            bad.append(f"{name} ({verdict.describe()})")
    if bad:
        return _cond(FALSE, "LabelExceedsLimits",
                     "label(s) never fit even in an empty pool: " + ", ".join(bad))
    return _cond(TRUE, "Valid", f"{len(pool.labels)} label(s)")


def spares(nodes: Iterable[Any], label: str, provider: str | None = None,
           pool: str | None = None) -> int:
    return sum(1 for n in nodes if plan.counts_as_spare(n, label)
               and (provider is None or n.provider == provider)
               and (pool is None or n.pool == pool))


class _Target(TypedDict):
    scope: int  # 0: the pool's own min-ready, 1: the global label's
    wanted: int
    spare: int


@dataclass(frozen=True)
class Hold:
    """A pause or drain in force for the pool (the operator's or a maintenance window's)."""

    action: str  # "pause" | "drain"
    why: str  # who and why, for the message


def at_target(pool: PoolConfig, config: Config, nodes: list[Any],
              pool_node_count: int,
              hold: Hold | None = None) -> tuple[cond.Condition, dict[str, TargetRow]]:
    """The AtTarget condition and, per label with a target, wanted vs spare. A held
    pool does not try to meet its target: Paused / Draining, neither met nor missed."""
    targets: dict[str, _Target] = {}
    for name, label in sorted(pool.labels.items()):
        if label.min_ready > 0:
            targets[name] = {"scope": 0, "wanted": label.min_ready,
                             "spare": spares(nodes, name, pool.provider, pool.name)}
        glob = config.labels.get(name)
        if glob is not None and glob.min_ready > 0 and name not in targets:
            targets[name] = {"scope": 1, "wanted": glob.min_ready,
                             "spare": spares(nodes, name)}
    if hold is not None:
        reason = "Draining" if hold.action == "drain" else "Paused"
        left = f"; {pool_node_count} node(s) left" if pool_node_count else ""
        return _cond(UNKNOWN, reason, f"{hold.why}{left}"), _public(targets)
    if pool.disabled:
        if pool_node_count:
            return _cond(FALSE, "Draining", f"{pool_node_count} node(s) left"), _public(targets)
        return _cond(TRUE, "TargetMet", "disabled and empty"), _public(targets)
    under = [f"{n} {t['spare']}/{t['wanted']}" for n, t in targets.items()
             if t["spare"] < t["wanted"]]
    over = [f"{n} {t['spare']}/{t['wanted']}" for n, t in targets.items()
            if t["spare"] > t["wanted"]]
    if under:
        return _cond(FALSE, "UnderTarget", "spare/wanted: " + ", ".join(under)), \
            _public(targets)
    if over:
        return _cond(TRUE, "OverTarget", "spare/wanted: " + ", ".join(over)), _public(targets)
    if not targets:
        return _cond(TRUE, "TargetMet", "no min-ready target"), {}
    return _cond(TRUE, "TargetMet", ", ".join(
        f"{n} {t['spare']}/{t['wanted']}" for n, t in targets.items())), _public(targets)


def _public(targets: dict[str, _Target]) -> dict[str, TargetRow]:
    return {n: {"wanted": t["wanted"], "spare": t["spare"],
                "pool_level": int(t["scope"] == 0)} for n, t in targets.items()}


def usage_rows(pool: PoolConfig, provider: ProviderConfig, cloud: Resources,
               pool_usage: Resources, provider_usage: Resources) -> list[UsageRow]:
    """Usage vs limit per (scope, resource) for every finite limit."""
    rows: list[UsageRow] = []
    for scope, limits, used in (("pool", pool.limits(), pool_usage),
                                ("provider", provider.limits(), provider_usage),
                                ("cloud", cloud, provider_usage)):
        for key in sorted(set(limits)):
            if math.isinf(limits[key]):
                continue
            rows.append({"scope": scope, "resource": key, "used": _num(used[key]),
                         "limit": _num(limits[key])})
    return rows


def _full(row: UsageRow) -> bool:
    used, limit = row["used"], row["limit"]
    return limit is not None and used is not None and used >= limit


def quota_condition(rows: list[UsageRow], blocked: str | None) -> cond.Condition:
    full = [r for r in rows if _full(r)]
    if blocked is not None or full:
        names = [f"{r['scope']} {r['resource']} {r['used']}/{r['limit']}" for r in full]
        scope = blocked or full[0]["scope"]
        message = f"{scope} limit binds" + (": " + ", ".join(names) if names else "")
        return _cond(FALSE, "AtLimit", message)
    if not rows:
        return _cond(TRUE, "Under", "no limits set")
    return _cond(TRUE, "Under", ", ".join(
        f"{r['scope']} {r['resource']} {r['used']}/{r['limit']}" for r in rows))


def suspended_condition(suspended: Mapping[str, BreakerEntry],
                        now: float) -> cond.Condition:
    if not suspended:
        return _cond(FALSE, "NoneSuspended")
    parts = []
    for name, entry in sorted(suspended.items()):
        state = entry.get("state")
        until = float(entry.get("until", now))
        when = f"probe in {max(0, int(until - now))}s" if state == breakers.OPEN \
            else "probing"
        parts.append(f"{name}: {entry.get('reason', '?')} after"
                     f" {entry.get('failures', 0)} failures, {when}")
    return _cond(TRUE, "LabelSuspended", "; ".join(parts))


def drifted_spares(nodes: Iterable[Any], provider: str, pool: PoolConfig) -> int:
    """Spares of the pool whose recorded configuration hash is not their label's now (a
    node without one, or of a label the pool no longer has, is not counted: drift.py
    leaves those alone too)."""
    hashes: dict[str, str] = {}
    count = 0
    for n in nodes:
        if n.provider != provider or n.pool != pool.name or n.config_hash is None:
            continue
        label = pool.labels.get(n.label or "")
        if label is None or not plan.counts_as_spare(n, label.name):
            continue
        wanted = hashes.get(label.name)
        if wanted is None:
            wanted = hashes[label.name] = label_hash(label, pool)
        if n.config_hash != wanted:
            count += 1
    return count


def drifted_condition(count: int) -> cond.Condition:
    if not count:
        return _cond(FALSE, "NoneDrifted")
    return _cond(TRUE, "SparesDrifted",
                 f"{count} spare node(s) built from an older configuration of their label:"
                 " replaced within the pool's drift-budget")


class StatusBuilder:
    """Keeps transition times across passes and decides when to publish."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._conditions: list[cond.Condition] = []
        self._published: PoolStatusRecord | None = None
        self._published_at = -math.inf
        self._significant: Any = None

    def conditions(self, fresh: Mapping[str, cond.Condition],
                   now: float) -> list[PoolCondition]:
        """The pool's conditions as published: `fresh` (by type) with the transition times
        kept across passes by the conditions' one update rule (`conditions.update`)."""
        # The update rule of `cond.update` (the time moves only on `cond.transitioned`),
        # applied to the fixed set of pool conditions in one go: this runs at every pass.
        before = {c.type: c for c in self._conditions}
        self._conditions = []
        for ctype in CONDITIONS:
            new, old = fresh[ctype], before.get(ctype)
            when = now if old is None or cond.transitioned(old, new) \
                else old.last_transition_time
            self._conditions.append(cond.Condition(ctype, new.status, new.reason,
                                                   new.message, when))
        by_type = {c.type: c for c in self._conditions}
        # serialise writes PoolCondition's keys (time under POOL_TIME_KEY) but `neutral`.
        published = cast(list[PoolCondition], cond.serialise(
            (by_type[ctype] for ctype in CONDITIONS), time_key=cond.POOL_TIME_KEY,
            message_limit=None))
        for c in published:
            c["neutral"] = c["reason"] in cond.NEUTRAL_REASONS
        return published

    def due(self, data: PoolStatusRecord, now: float) -> tuple[bool, float | None]:
        """(write now?, when to look again if something waits for the interval). `now`
        and the answer are monotonic: the rate limit is this process's own."""
        significant = ([(c["type"], c["status"], c["reason"]) for c in data["conditions"]],
                       sorted(data["suspended"]))
        if self._published is None or significant != self._significant:
            return True, None
        if _without_time(data) == _without_time(self._published):
            return False, None
        at = self._published_at + self.interval
        return (True, None) if now >= at else (False, at)

    def republish(self) -> None:
        """Write at the next look whatever it shows: the record is gone (a new ZooKeeper
        session removed the ephemeral), so "unchanged" no longer means "published"."""
        self._published = None

    def published(self, data: PoolStatusRecord, now: float) -> None:
        """`now`: monotonic, as for `due`."""
        self._published, self._published_at = data, now
        self._significant = (
            [(c["type"], c["status"], c["reason"]) for c in data["conditions"]],
            sorted(data["suspended"]))


def _without_time(data: PoolStatusRecord) -> dict[str, object]:
    return {k: v for k, v in data.items() if k not in ("time", "conditions")} | {
        "conditions": [{k: v for k, v in c.items()
                        if k != "message" or c["type"] != "Suspended"}
                       for c in data["conditions"]]}


def _suspended(entry: BreakerEntry) -> SuspendedLabel:
    """The breaker entry's public keys (None where it lacks one)."""
    return {"reason": entry.get("reason"), "message": entry.get("message"),
            "failures": entry.get("failures"), "trips": entry.get("trips"),
            "until": entry.get("until"), "state": entry.get("state")}


def node_counts(nodes: Iterable[Any], provider: str, pool: str) -> dict[str, int]:
    counts = Counter(n.state for n in nodes if n.provider == provider and n.pool == pool)
    return {state: counts[state] for state in sorted(counts)}


def build(*, pool_id: str, hostname: str, pool: PoolConfig, provider: ProviderConfig,
          config: Config, nodes: list[Any], records: list[quota.UsageRecord],
          cloud: Resources, capacity: CapacityCondition | None, blocked: str | None,
          launching: int, queued: int, pending: int,
          suspended: Mapping[str, BreakerEntry], now: float,
          unhandable: frozenset[str] = frozenset(),
          credentials: ConditionRecord | None = None,
          api: ConditionRecord | None = None,
          hold: Hold | None = None, paused: bool = False) -> tuple[
              dict[str, cond.Condition], PoolStatusRecord]:
    """Fresh conditions (without transition times) and the status record, whose
    `conditions` the caller fills from them (`StatusBuilder.conditions`)."""
    counts = node_counts(nodes, provider.name, pool.name)
    rows = usage_rows(pool, provider, cloud,
                      quota.total(records, provider=provider.name, pool=pool.name),
                      quota.total(records, provider=provider.name))
    countable = [n for n in nodes if n.id not in unhandable] if unhandable else nodes
    target, targets = at_target(pool, config, countable, sum(counts.values()), hold)
    drifted = drifted_spares(countable, provider.name, pool)
    fresh: dict[str, cond.Condition] = {
        "Validated": validated(pool, provider, cloud),
        "AtTarget": target,
        "Quota": quota_condition(rows, blocked),
        "Capacity": _reported(capacity, _cond(UNKNOWN, "Disabled",
                                              "capacity awareness is off")),
        "Suspended": suspended_condition(suspended, now),
        "Credentials": _reported(credentials, _cond(UNKNOWN, "Unknown",
                                                    "the provider does not report them")),
        "ApiReachable": _reported(api, _cond(UNKNOWN, "Unknown",
                                             "the provider does not report it")),
        "Drifted": drifted_condition(drifted),
    }
    rest: PoolStatusRecord = {
        "model": MODEL_VERSION, "id": pool_id, "hostname": hostname,
        "provider": provider.name, "pool": pool.name, "priority": pool.priority,
        "labels": sorted(pool.labels), "nodes": counts,
        "launches_in_progress": launching, "requests_queued": queued,
        "requests_handled": pending, "usage": rows, "targets": targets,
        "drifted": drifted, "paused": paused or hold is not None,
        "suspended": {name: _suspended(entry) for name, entry in sorted(suspended.items())},
        "capacity": {k: v for k, v in (capacity or {}).items()
                     if k not in ("status", "reason", "message")},
        "conditions": [],
    }
    return fresh, rest


def combined(own: PoolStatusRecord, published: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The pool's one status (`views.pools.combine`) from `own` (this worker's, as just
    published) and the other launchers' records of the same pool among `published` (the
    mirrored directory, which may still hold an older copy of `own`): what the pool's
    statsd gauges report, so that launchers sharing a pool send the same values."""
    others = [r for r in published if r.get("provider") == own["provider"]
              and r.get("pool") == own["pool"] and r.get("id") != own["id"]]
    return pool_view.combine([cast(Mapping[str, Any], own)] + others)[0]
