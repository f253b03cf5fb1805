"""Read-only views of published pool status records: one status per pool.

Owns: combining the records the pool workers publish (one per launcher serving a pool, see
`launcher.reporting.pool_status`) into one status per (provider, pool) (`combine`), the
rows of `nodepool pool-list` and the web app's `/pool-list` (in provider/pool order), and
the JSON shape both print. The status page, the pool-level Prometheus series and the
statsd pool gauges read the same combined status. Pure functions over the decoded records;
nothing here fails on odd data (a missing field renders empty).

The rule (doc/operation.md, "One status per pool"):

- each condition type: the worst status wins, False before Unknown before True (True
  before Unknown before False for `Suspended` and `Drifted`, which are True on a
  problem); among the launchers with that status one whose condition is not neutral wins
  over a neutral one, then the first launcher in order (host name, id). It is `neutral`
  only when every launcher's condition of that type is. When the launchers disagree
  (status or reason), the message names the launcher it comes from and what the others
  say;
- counts of a worker's own work are summed (`launches_in_progress`, `requests_queued`,
  `requests_handled`); figures of the pool itself are taken once, from the first launcher
  (`nodes`, `usage`, `targets`, `capacity`, `priority`: every launcher counts the same
  shared records); `drifted` is the largest count (a launcher still on an older
  configuration sees fewer); `labels` and `suspended` (the breaker is shared) are unions;
- `launchers`: each launcher's `name` (`launcher_names`), `hostname`, `id`, `paused` (it
  holds the pool's requests back: at quota, paused or drained) and `ready` (its provider's
  API server and credentials are not known bad, so it can launch); `id` and `hostname` are
  the first
  launcher's, kept for readers of the per-worker shape.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

POOL_STATUS_COLUMNS = (
    ("Provider", "provider"), ("Pool", "pool"), ("Launchers", "launcher_names"),
    ("Validated", "validated"), ("AtTarget", "at_target"), ("Quota", "quota"),
    ("Capacity", "capacity"), ("Suspended", "suspended_labels"),
    ("Credentials", "credentials"), ("ApiReachable", "api_reachable"),
    ("Drifted", "drifted_spares"), ("Nodes", "node_counts"),
    ("Launching", "launches_in_progress"), ("Queued", "requests_queued"),
)
CONDITION_KEYS = {"Validated": "validated", "AtTarget": "at_target", "Quota": "quota",
                  "Capacity": "capacity", "Suspended": "suspended",
                  "Credentials": "credentials", "ApiReachable": "api_reachable"}
# Worst first: the combined status of a condition is the lowest rank among the launchers.
STATUS_RANK = {"False": 0, "Unknown": 1, "True": 2}
# Conditions that report a problem when True (a label suspended, spares drifted): for
# these True is the worst.
TRUE_IS_BAD = frozenset({"Suspended", "Drifted"})
BAD_TRUE_RANK = {"True": 0, "Unknown": 1, "False": 2}
# Counts of a pool worker's own work: the pool's is their sum.
SUMMED = ("launches_in_progress", "requests_queued", "requests_handled")
# A launcher whose provider reports one of these False cannot launch.
READINESS = ("ApiReachable", "Credentials")


def conditions(record: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = record.get("conditions")
    if not isinstance(found, list):
        return {}
    return {str(c.get("type")): c for c in found if isinstance(c, dict)}


def _order(record: Mapping[str, Any]) -> tuple[str, str]:
    return str(record.get("hostname") or ""), str(record.get("id") or "")


def pool_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The per-worker records, sorted by provider, pool, host name and id."""
    return sorted((dict(r) for r in records),
                  key=lambda r: (str(r.get("provider")), str(r.get("pool"))) + _order(r))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def launcher_names(group: Sequence[Mapping[str, Any]]) -> list[str]:
    """A name per record of one pool (in launcher order) that stays the same across
    restarts: the host name, `host/2`, `host/3` for further workers on the same host (the
    `launcher` label of the per-launcher Prometheus series)."""
    seen: dict[str, int] = {}
    names = []
    for record in group:
        host = str(record.get("hostname") or "")
        seen[host] = seen.get(host, 0) + 1
        names.append(host if seen[host] == 1 else f"{host}/{seen[host]}")
    return names


def _launcher(record: Mapping[str, Any], name: str) -> dict[str, Any]:
    conds = conditions(record)
    return {"name": name, "hostname": record.get("hostname"), "id": record.get("id"),
            "paused": record.get("paused") is True,
            "ready": not any((conds.get(t) or {}).get("status") == "False"
                             for t in READINESS)}


def _rank(c: Mapping[str, Any]) -> tuple[int, int]:
    ranks = BAD_TRUE_RANK if c.get("type") in TRUE_IS_BAD else STATUS_RANK
    return ranks.get(str(c.get("status")), 1), 1 if c.get("neutral") is True else 0


def combine_condition(found: list[tuple[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """One condition from each launcher's (name, condition), in launcher order."""
    host, worst = min(found, key=lambda hc: _rank(hc[1]))
    out = dict(worst)
    out["neutral"] = all(c.get("neutral") is True for _, c in found)
    seen = {(c.get("status"), c.get("reason")) for _, c in found}
    if len(seen) > 1:
        others = [f"{h}: {c.get('status')}/{c.get('reason')}" for h, c in found
                  if c is not worst]
        text = f"{host}: {worst.get('message') or worst.get('reason')}"
        out["message"] = f"{text} (other launchers: {', '.join(others)})"
    return out


def groups(records: Iterable[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """The per-worker records by (provider, pool), each group in launcher order."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in pool_records(records):
        found.setdefault((str(record.get("provider")), str(record.get("pool"))),
                         []).append(record)
    return list(found.values())


def combine(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One status per (provider, pool) from the per-worker records (see the module's rule),
    each with the per-worker record's keys plus `launchers`; in provider/pool order."""
    return [_combined(group) for group in groups(records)]


def _combined(group: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(group[0])
    names = launcher_names(group)
    out["launchers"] = [_launcher(r, name) for r, name in zip(group, names)]
    if len(group) == 1:
        return out
    for key in SUMMED:
        values: list[float] = [r[key] for r in group if _number(r.get(key))]
        if values:
            out[key] = sum(values)
    drifted: list[float] = [r["drifted"] for r in group if _number(r.get("drifted"))]
    if drifted:
        out["drifted"] = max(drifted)
    labels = {str(x) for r in group for x in (r.get("labels") or [])
              if isinstance(r.get("labels"), list)}
    out["labels"] = sorted(labels)
    suspended: dict[str, Any] = {}
    for r in group:
        if isinstance(r.get("suspended"), dict):
            for name, entry in r["suspended"].items():
                suspended.setdefault(name, entry)
    out["suspended"] = dict(sorted(suspended.items()))
    out["paused"] = all(r.get("paused") is True for r in group)
    types: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for r, name in zip(group, names):
        for ctype, c in conditions(r).items():
            types.setdefault(ctype, []).append((name, c))
    out["conditions"] = [combine_condition(found) for found in types.values()]
    return out


def pool_rows(pools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table rows of combined statuses (`combine`): each condition as `Reason` (its status
    in the JSON; a neutral state such as `Paused` or `Disabled` reads as just that), the
    launchers as `host` (`host (paused)`, `host (not ready)`)."""
    rows = []
    for record in pools:
        conds = conditions(record)
        found = record.get("nodes")
        nodes: dict[str, Any] = found if isinstance(found, dict) else {}
        launchers = record.get("launchers")
        if not isinstance(launchers, list):
            launchers = [_launcher(record, str(record.get("hostname") or ""))]
        row: dict[str, Any] = {
            "provider": record.get("provider"), "pool": record.get("pool"),
            "hostname": record.get("hostname"),
            "launcher_names": ", ".join(_launcher_cell(entry) for entry in launchers
                                        if isinstance(entry, dict)),
            "node_counts": " ".join(f"{k}={v}" for k, v in sorted(nodes.items())),
            "launches_in_progress": record.get("launches_in_progress"),
            "requests_queued": record.get("requests_queued"),
            "suspended_labels": ",".join(sorted(record.get("suspended") or {})),
            "drifted_spares": record.get("drifted"),
        }
        for ctype, key in CONDITION_KEYS.items():
            if key != "suspended":
                row[key] = (conds.get(ctype) or {}).get("reason", "")
        rows.append(row)
    return rows


def _launcher_cell(entry: Mapping[str, Any]) -> str:
    notes = [word for word, on in (("paused", entry.get("paused") is True),
                                   ("not ready", entry.get("ready") is False)) if on]
    name = str(entry.get("name") or entry.get("id") or "?")
    return f"{name} ({', '.join(notes)})" if notes else name
