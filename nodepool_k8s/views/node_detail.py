"""Read-only views of one node's lifecycle, one request's standing and of the event log, as
text or JSON.

Owns: what `nodepool show NODE_ID` and the web app's `/node/<id>` show (the node's row,
its conditions as a table, with `Drifted` derived from the loaded configuration, the
phase timings, the failure reason), what `nodepool show REQUEST_ID` shows (the request's
row, why each pool declined it, why it waits, with what to do), and the rows of
`nodepool events` / `/events`. Pure functions over records already read; nothing here
fails on odd data (missing fields render empty). Secrets stay redacted (the row comes
from `listing.node_row`).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping, Sequence

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.config import fingerprint
from nodepool_k8s.views import listing
from nodepool_k8s.core.model import NodeRequest, NodeView

CONDITION_COLUMNS = (("Type", "type"), ("Status", "status"), ("Reason", "reason"),
                     ("Since", "since"), ("Message", "message"))
TIMING_COLUMNS = (("Phase", "phase"), ("Seconds", "seconds"))
EVENT_COLUMNS = (("Time", "when"), ("Kind", "kind"), ("Provider", "provider"),
                 ("Pool", "pool"), ("Node", "node"), ("Label", "label"),
                 ("Reason", "reason"), ("Message", "message"))
# The node row's keys `nodepool show` prints above the tables, in this order.
SHOWN_KEYS = (("ID", "id"), ("State", "state"), ("Age", "age"), ("Provider", "provider"),
              ("Pool", "pool"), ("Label", "label"), ("Server ID", "server_id"),
              ("Host ID", "host_id"), ("Connection", "connection_type"),
              ("Allocated To", "allocated_to"), ("Locked", "locked"),
              ("Launcher", "launcher"), ("Reason", "reason"))


def stamp(when: Any) -> str:
    """Epoch seconds as ISO 8601 UTC with milliseconds; empty when unset or odd."""
    if isinstance(when, bool) or not isinstance(when, (int, float)):
        return ""
    try:
        moment = datetime.fromtimestamp(when, timezone.utc)
    except (OverflowError, OSError, ValueError):
        return ""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


DRIFTED = "Drifted"


def drifted_condition(drifted: bool | None) -> cond.Condition | None:
    """A node's `Drifted` condition from `listing.node_row`'s `drifted` (None: unknown, no
    condition). Derived by the reader from the configuration it loaded, never stored: the
    answer changes with every reload, and writing it to each node would cost a write per
    spare per reload for what any reader computes from the record's `config_hash`."""
    if drifted is None:
        return None
    if drifted:
        return cond.Condition(DRIFTED, cond.TRUE, "ConfigurationChanged",
                              "built from an older configuration of its label than the"
                              " one loaded now")
    return cond.Condition(DRIFTED, cond.FALSE, "ConfigurationCurrent")


def node_detail(view: NodeView, now: float,
                hashes: fingerprint.Hashes | None = None) -> dict[str, Any]:
    """The JSON of `nodepool show --json` and `/node/<id>`. With `hashes` (the loaded
    configuration's), the conditions end with the node's derived `Drifted`."""
    node = view.node
    conditions = node.conditions
    failed = cond.failure(conditions)
    row = listing.node_row(view, now, hashes)
    drifted = drifted_condition(row.get("drifted"))
    return {
        "node": row,
        "conditions": cond.serialise(list(conditions) + ([drifted] if drifted else [])),
        "timings": {k: round(v, 3) for k, v in
                    cond.timings(conditions, node.created_time).items()},
        "failure": failed.to_dict() if failed else None,
        "delete_refused": node.extra.get("delete_refused"),
    }


def render_node_detail(detail: Mapping[str, Any]) -> str:
    row = detail.get("node") or {}
    width = max(len(h) for h, _ in SHOWN_KEYS)
    lines = [f"{header.ljust(width)}  {listing._cell(row.get(key))}"
             for header, key in SHOWN_KEYS]
    rows = []
    for c in detail.get("conditions") or []:
        when = c.get("last_transition_time")
        rows.append({"type": c.get("type"), "status": c.get("status"),
                     "reason": c.get("reason"), "since": stamp(when),
                     "message": c.get("message")})
    lines.append("")
    lines.append("Conditions:")
    lines.append(listing.render_table(rows, CONDITION_COLUMNS) if rows else "  (none recorded)")
    timings = detail.get("timings") or {}
    lines.append("")
    lines.append("Timings:")
    if timings:
        order = [name for name, _, _ in cond.PHASES]
        trows = [{"phase": name, "seconds": f"{timings[name]:.3f}"} for name in order
                 if name in timings]
        lines.append(listing.render_table(trows, TIMING_COLUMNS))
    else:
        lines.append("  (no completed phase)")
    # Every False condition with what to do (a failed launch, then e.g. a stuck deletion).
    for c in detail.get("conditions") or []:
        if c.get("type") == DRIFTED and c.get("status") == cond.TRUE:
            lines += ["", f"Drifted: {c.get('message')}",
                      f"What to do: {cond.REASONS.get(str(c.get('reason')), '')}"]
        if c.get("status") != cond.FALSE or c.get("type") == DRIFTED:
            continue
        advice = cond.REASONS.get(str(c.get("reason")), "")
        lines += ["", f"{c.get('type')} failed: {c.get('reason')}: {c.get('message')}",
                  f"What to do: {advice}"]
    if detail.get("delete_refused"):
        lines += ["", f"Delete refused: {detail['delete_refused']}"]
    return "\n".join(lines)


# The request row's keys `nodepool show REQUEST_ID` prints above the reasons, in this order.
REQUEST_SHOWN_KEYS = (("ID", "id"), ("State", "state"), ("Age", "age"),
                      ("Requestor", "requestor"), ("Node Types", "node_types"),
                      ("Nodes", "nodes"), ("Priority", "relative_priority"),
                      ("Tenant", "tenant_name"), ("Provider", "provider"),
                      ("Event ID", "event_id"), ("Declined By", "declined_by"))
REASON_COLUMNS = (("Pool", "pool"), ("Reason", "reason"), ("Message", "message"))


def request_detail(request: NodeRequest, now: float,
                   pools: Sequence[listing.ServingPool] | None) -> dict[str, Any]:
    """The JSON of `nodepool show REQUEST_ID --json`: the request's row (with `waiting`)
    and the pools' decline entries with their messages."""
    declined = request.extra.get("declined_reasons")
    return {
        "request": listing.request_row(request, now, pools),
        "declined": {str(k): v for k, v in declined.items() if isinstance(v, dict)}
        if isinstance(declined, dict) else {},
    }


def _reason_rows(entries: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for pool, entry in sorted(entries.items()):
        if isinstance(entry, dict):
            reason, message = entry.get("reason"), entry.get("message")
        else:  # `waiting`: "Reason: message"
            reason, _, message = str(entry).partition(": ")
        rows.append({"pool": "(every pool)" if pool == listing.ANY_POOL else pool,
                     "reason": reason, "message": message})
    return rows


def render_request_detail(detail: Mapping[str, Any]) -> str:
    row = detail.get("request") or {}
    width = max(len(h) for h, _ in REQUEST_SHOWN_KEYS)
    lines = [f"{header.ljust(width)}  {listing._cell(row.get(key))}"
             for header, key in REQUEST_SHOWN_KEYS]
    for title, rows in (("Declined:", _reason_rows(detail.get("declined") or {})),
                        ("Waiting:", _reason_rows(row.get("waiting") or {}))):
        lines += ["", title]
        lines.append(listing.render_table(rows, REASON_COLUMNS) if rows
                     else "  (none)")
    for entry in _reason_rows(row.get("waiting") or {}):
        advice = cond.REASONS.get(str(entry["reason"]), "")
        if advice:
            lines += ["", f"Waits on {entry['pool']}: {entry['reason']}",
                      f"What to do: {advice}"]
    return "\n".join(lines)


def event_rows(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Event log entries (oldest first) as table rows; JSON keeps every stored key."""
    rows = []
    for e in events:
        row = dict(e)
        row["when"] = stamp(e.get("time"))
        rows.append(row)
    return rows
