"""Read-only views of published pool status records (see launcher.pool_status).

Owns: the rows of `nodepool pool-list` and the web app's `/pool-list` (one per running pool
worker, in provider/pool order), and the JSON shape both print. Pure functions over the
decoded records; nothing here fails on odd data (a missing field renders empty).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

POOL_STATUS_COLUMNS = (
    ("Provider", "provider"), ("Pool", "pool"), ("Hostname", "hostname"),
    ("Validated", "validated"), ("AtTarget", "at_target"), ("Quota", "quota"),
    ("Capacity", "capacity"), ("Suspended", "suspended_labels"),
    ("Credentials", "credentials"), ("ApiReachable", "api_reachable"),
    ("Nodes", "node_counts"),
    ("Launching", "launches_in_progress"), ("Queued", "requests_queued"),
)
CONDITION_KEYS = {"Validated": "validated", "AtTarget": "at_target", "Quota": "quota",
                  "Capacity": "capacity", "Suspended": "suspended",
                  "Credentials": "credentials", "ApiReachable": "api_reachable"}


def conditions(record: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = record.get("conditions")
    if not isinstance(found, list):
        return {}
    return {str(c.get("type")): c for c in found if isinstance(c, dict)}


def pool_records(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The full records (JSON output), sorted by provider, pool and id."""
    return sorted((dict(r) for r in records),
                  key=lambda r: (str(r.get("provider")), str(r.get("pool")), str(r.get("id"))))


def pool_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Table rows: each condition as `Reason` (its status in the JSON; a neutral state such
    as `Paused` or `Disabled` reads as just that)."""
    rows = []
    for record in pool_records(records):
        conds = conditions(record)
        found = record.get("nodes")
        nodes: dict[str, Any] = found if isinstance(found, dict) else {}
        row: dict[str, Any] = {
            "provider": record.get("provider"), "pool": record.get("pool"),
            "hostname": record.get("hostname"),
            "node_counts": " ".join(f"{k}={v}" for k, v in sorted(nodes.items())),
            "launches_in_progress": record.get("launches_in_progress"),
            "requests_queued": record.get("requests_queued"),
            "suspended_labels": ",".join(sorted(record.get("suspended") or {})),
        }
        for ctype, key in CONDITION_KEYS.items():
            if key != "suspended":
                row[key] = (conds.get(ctype) or {}).get("reason", "")
        rows.append(row)
    return rows
