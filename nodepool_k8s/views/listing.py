"""Read-only views of launcher state: rows for nodes, requests and labels, as tables or JSON.

Owns: the columns operators know from Nodepool's `nodepool list` / `request-list` and the web
app, the JSON shapes of the web endpoints, redaction of secrets, and plain-text table
rendering. Pure functions over records that the caller has already read; no I/O, so the CLI,
the web app and the tests share one implementation. Nothing here fails on odd data: missing
fields render empty, and a malformed znode is a row in state `malformed` with its reason
(in `comment`, and in `malformed` in JSON), never hidden.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Iterable, Mapping, Protocol, Sequence

from nodepool_k8s.core import conditions
from nodepool_k8s.config import fingerprint
from nodepool_k8s.core.model import (
    CONFIG_HASH, WAITING_REASONS, NodeRequest, NodeView, RequestState)
from nodepool_k8s.core.records import MalformedRecord

__all__ = ["NodeView"]  # the record the views take; defined with the other records

REDACTED = "redacted"


def age(seconds_since: float | None, now: float) -> str:
    """Nodepool's `dd:hh:mm:ss` age format."""
    if seconds_since is None:
        return ""
    total = max(0, int(now - seconds_since))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days:02d}:{hours:02d}:{minutes:02d}:{secs:02d}"


def token_expiry(value: Any) -> str | None:
    """A node's `token_expires` (epoch seconds) as ISO 8601 UTC; None when unset or odd."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    # time.gmtime formats in a third of datetime's time (10,000 rows); rounded to the
    # microsecond first, as datetime does, so both name the same second.
    try:
        seconds = round(value, 6)
        if not _FIRST_SECOND <= seconds < _AFTER_LAST_SECOND:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):
        return None


# The seconds datetime can show: from 0001-01-01T00:00:00Z to the end of year 9999.
_FIRST_SECOND = -62135596800
_AFTER_LAST_SECOND = 253402300800


def redact_port(value: Any) -> Any:
    """A Kubernetes node's connection_port is a dict holding a token: never show it."""
    return value if isinstance(value, int) or value is None else REDACTED


NODE_COLUMNS = (
    ("ID", "id"), ("Provider", "provider"), ("Label", "label"), ("Server ID", "server_id"),
    ("Public IPv4", "public_ipv4"), ("IPv6", "ipv6"), ("State", "state"), ("Age", "age"),
    ("Locked", "locked"),
)
NODE_DETAIL_COLUMNS = NODE_COLUMNS + (
    ("Pool", "pool"), ("Hostname", "hostname"), ("Private IPv4", "private_ipv4"),
    ("AZ", "AZ"), ("Username", "username"), ("Port", "connection_port"),
    ("Launcher", "launcher"), ("Allocated To", "allocated_to"), ("Hold Job", "hold_job"),
    ("Comment", "comment"), ("User Data", "user_data"), ("Driver Data", "driver_data"),
    # Beyond Nodepool: when a Kubernetes node's service-account token expires (UTC).
    ("Token Expires", "token_expires"),
    # Beyond Nodepool: the Kubernetes node a pod landed on, and why a node failed.
    ("Host ID", "host_id"), ("Reason", "reason"),
    # Beyond Nodepool: built from an older label configuration than the one loaded now.
    ("Drifted", "drifted"),
)
REQUEST_COLUMNS = (
    ("Request ID", "id"), ("Priority", "relative_priority"), ("State", "state"),
    ("Requestor", "requestor"), ("Node Types", "node_types"), ("Nodes", "nodes"),
    ("Declined By", "declined_by"), ("Event ID", "event_id"),
    # Beyond Nodepool: since the request was submitted (`dd:hh:mm:ss`, as `list`'s Age).
    ("Age", "age"),
)
# `request-list --detail`: why each pool declined (`declined_reasons`) and why the request
# waits (`waiting`), beyond Nodepool.
REQUEST_DETAIL_COLUMNS = REQUEST_COLUMNS + (("Declined Reasons", "declined_reasons"),
                                            ("Waiting", "waiting"))
# The key of `waiting` for what concerns every pool (no pool serves the labels).
ANY_POOL = "*"
LABEL_COLUMNS = (("Label", "label"),)
# `nodepool info PROVIDER`: Nodepool's "Nodes:" table plus what a Kubernetes operator needs.
PROVIDER_NODE_COLUMNS = (
    ("ID", "id"), ("Server ID", "server_id"), ("State", "state"), ("Label", "label"),
    ("Pool", "pool"),
)
POOL_COLUMNS = (
    ("Pool", "name"), ("Pool ID", "id"), ("Hostname", "hostname"),
    ("Supported Labels", "supported_labels"), ("Paused", "paused"), ("State", "state"),
)


def failure_reason(value: Any) -> str | None:
    """The reason of a node's latest False condition (its `conditions` value), if any."""
    if not value or type(value) is not list:  # the common case first: listings are long
        return None
    found, latest = None, -1.0
    for item in value:
        if type(item) is dict and item.get("status") == conditions.FALSE:
            when = item.get("last_transition_time")
            when = float(when) if isinstance(when, (int, float)) else 0.0
            if when >= latest:
                found, latest = item.get("reason"), when
    return str(found) if found is not None else None


def declined_reasons(value: Any) -> dict[str, str]:
    """A request's `declined_reasons` as {pool id: reason} (odd entries skipped)."""
    if not isinstance(value, dict):
        return {}
    return {str(pool): str(entry.get("reason")) for pool, entry in value.items()
            if isinstance(entry, dict)}


def node_row(view: NodeView, now: float,
             hashes: fingerprint.Hashes | None = None) -> dict[str, Any]:
    """The web app's JSON object for one node (all keys, secrets redacted). With `hashes`
    (the loaded configuration's), `drifted` says whether the node was built from another
    configuration of its label (None: unknown)."""
    n = view.node
    # Slot fields as attributes; the others as direct dict reads (cheaper than the typed
    # attributes when listing 10,000 nodes): every field but connection_port defaults to
    # None, so `.get` gives the same values.
    f = n.fields.get
    return {
        "id": n.id,
        "provider": n.provider,
        "label": list(n.type),
        "server_id": n.external_id,
        "public_ipv4": f("public_ipv4"),
        "ipv6": f("public_ipv6"),
        "state": n.state,
        "age": age(n.state_time, now),
        "locked": "locked" if view.locked else "unlocked",
        "pool": n.pool,
        "hostname": f("hostname"),
        "private_ipv4": f("private_ipv4"),
        "AZ": f("az"),
        "username": f("username"),
        "connection_port": redact_port(n.connection_port),
        "launcher": n.launcher,
        "allocated_to": n.allocated_to,
        "hold_job": f("hold_job"),
        "comment": f("comment"),
        "user_data": f("user_data"),
        "driver_data": f("driver_data"),
        "token_expires": token_expiry(n.extra.get("token_expires")),
        "drifted": None if hashes is None else fingerprint.drifted(
            n.provider, n.pool, n.label, n.extra.get(CONFIG_HASH), hashes),
        # Extensions beyond Nodepool's columns; harmless for its consumers.
        "connection_type": f("connection_type"),
        "tenant_name": n.tenant_name,
        "state_time": n.state_time,
        "resources": n.resources,
        "host_id": f("host_id"),
        "reason": failure_reason(n.extra.get("conditions")),
    }


MALFORMED = "malformed"


def malformed_node_row(record: MalformedRecord) -> dict[str, Any]:
    """A node znode that is not a usable record: its id, state `malformed` and the reason."""
    row: dict[str, Any] = {key: None for _, key in NODE_DETAIL_COLUMNS}
    row.update({"id": record.id, "label": [], "state": MALFORMED, "age": "",
                "locked": "", "comment": record.reason, "malformed": record.reason})
    return row


def node_list(views: Iterable[NodeView], now: float, node_id: str | None = None,
              malformed: Iterable[MalformedRecord] = (),
              hashes: fingerprint.Hashes | None = None) -> list[dict[str, Any]]:
    rows = [node_row(v, now, hashes) for v in views]
    rows.extend(malformed_node_row(m) for m in malformed)
    rows.sort(key=lambda r: str(r["id"]))
    if node_id is not None:
        rows = [r for r in rows if r["id"] == node_id]
    return rows


class ServingPool(Protocol):
    """A registered pool, as the waiting reasons read it (`zk.cache.Component`)."""

    @property
    def id(self) -> str | None: ...

    @property
    def supported_labels(self) -> frozenset[str]: ...

    @property
    def paused(self) -> bool: ...


def waiting(request: NodeRequest, pools: Sequence[ServingPool] | None) -> dict[str, str]:
    """Why a request that is not served yet waits: {pool id: "Reason: message"}.

    What the pools wrote onto it (`waiting_reasons`: a pool paused or drained, its tenant
    at its limit, its own quota waits) and, with `pools` (the registered ones), what they
    say without a write: no pool serves the labels (key `ANY_POOL`), or a pool that could
    take it is paused while another of its requests waits for capacity. Empty for a
    request that is fulfilled or failed, or pending and going on."""
    if request.state not in (RequestState.REQUESTED, RequestState.PENDING):
        return {}
    out: dict[str, str] = {}
    recorded = request.extra.get(WAITING_REASONS)
    if isinstance(recorded, dict):
        for pool, entry in recorded.items():
            if isinstance(entry, dict):
                out[str(pool)] = f"{entry.get('reason')}: {entry.get('message', '')}"
    if request.state != RequestState.REQUESTED or pools is None:
        return out
    wanted = set(request.node_types)
    serving = [p for p in pools if p.id and wanted <= p.supported_labels]
    if not serving:
        offered: set[str] = set().union(*(p.supported_labels for p in pools))
        missing = sorted(wanted - offered)
        out[ANY_POOL] = "NoPoolServesLabel: " + (
            f"no registered pool serves {', '.join(missing)}" if missing else
            f"no registered pool serves {', '.join(sorted(wanted))} together")
        return out
    for pool in serving:
        if pool.paused and pool.id not in out and pool.id not in request.declined_by:
            out[str(pool.id)] = ("PoolWaiting: the pool is paused; it takes no request"
                                 " until the one it holds gets capacity")
    return out


def request_age(request: NodeRequest, now: float) -> str:
    """Since the request was submitted (`created_time`, else its `state_time`)."""
    since = request.created_time if request.created_time is not None \
        else request.state_time
    return age(since if isinstance(since, (int, float)) else None, now)


def request_row(request: NodeRequest, now: float | None = None,
                pools: Sequence[ServingPool] | None = None) -> dict[str, Any]:
    """One request's row; `now` (wall time) for its age, `pools` (the registered ones)
    for the waiting reasons computed without a write (see `waiting`)."""
    return {
        "id": request.id,
        "relative_priority": request.relative_priority,
        "state": request.state,
        "requestor": request.requestor,
        "node_types": list(request.node_types),
        "nodes": list(request.nodes),
        "declined_by": list(request.declined_by),
        "event_id": request.event_id,
        "tenant_name": request.tenant_name,
        "provider": request.provider,
        "state_time": request.state_time,
        "declined_reasons": declined_reasons(request.extra.get("declined_reasons")),
        "created_time": request.created_time,
        "age": request_age(request, now) if now is not None else "",
        "waiting": waiting(request, pools),
    }


def malformed_request_row(record: MalformedRecord) -> dict[str, Any]:
    """A request znode that is not a usable record: its id, state `malformed`, the reason."""
    return {"id": record.id, "relative_priority": None, "state": MALFORMED,
            "requestor": None, "node_types": [], "nodes": [], "declined_by": [],
            "event_id": None, "tenant_name": None, "provider": None, "state_time": None,
            "declined_reasons": {}, "created_time": None, "age": "", "waiting": {},
            "malformed": record.reason}


def request_list(requests: Iterable[NodeRequest],
                 malformed: Iterable[MalformedRecord] = (), now: float | None = None,
                 pools: Sequence[ServingPool] | None = None) -> list[dict[str, Any]]:
    rows = [request_row(r, now, pools) for r in sorted(requests, key=lambda r: r.sort_key())]
    # Malformed requests after the usable ones (their priority cannot be trusted).
    rows.extend(malformed_request_row(m) for m in sorted(malformed, key=lambda m: m.id))
    return rows


def label_list(supported_labels: Iterable[Iterable[str]]) -> list[dict[str, Any]]:
    labels: set[str] = set()
    for group in supported_labels:
        labels.update(group)
    return [{"label": name} for name in sorted(labels)]


def pool_row(data: Mapping[str, Any]) -> dict[str, Any]:
    """One registered pool component (its JSON as registered), for `nodepool info`."""
    labels = data.get("supported_labels")
    return {
        "name": data.get("name"),
        "id": data.get("id"),
        "provider": data.get("provider_name"),
        "hostname": data.get("hostname"),
        "supported_labels": sorted(x for x in labels if isinstance(x, str))
        if isinstance(labels, list) else [],
        "paused": bool(data.get("paused")),
        "state": data.get("state"),
        "priority": data.get("priority"),
    }


def pool_list(pools: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = [pool_row(p) for p in pools]
    return sorted(rows, key=lambda r: (str(r["name"]), str(r["id"])))


# -- rendering ---------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if type(value) is str:  # the common case first: tables of 10,000 rows
        return value
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def select_columns(columns: Sequence[tuple[str, str]],
                   fields: Sequence[str] | None) -> Sequence[tuple[str, str]]:
    """Restrict a table to `fields` (keys or headers, case-insensitive), keeping their order."""
    if not fields:
        return columns
    wanted = [f.strip().lower() for f in fields if f.strip()]
    picked = []
    for field_name in wanted:
        for header, key in columns:
            if field_name in (key.lower(), header.lower()):
                picked.append((header, key))
                break
    return picked or columns


# The widest a text-table cell gets (longer values end in "..."; JSON output is whole).
MAX_CELL = 120


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A left-aligned ASCII table in the style operators know from Nodepool's CLI.

    Hand-written on purpose: prettytable (what Nodepool's CLI uses) draws the same table
    but took 0.71 s for 10,000 rows of `nodepool list` where this takes 0.02 s, and the
    whole listing must stay under a second (tools/benchmark, `scale`).
    """
    if not columns:
        return "\n".join(["++", "||", "++"] + ["||"] * len(rows) + ["++"])
    padded: list[list[str]] = []
    headers: list[str] = []
    for header, key in columns:
        # Column by column: one pass per column, most cells are already strings.
        cells = [v if type(v) is str else _cell(v)
                 for v in [row.get(key) for row in rows]]
        width = max(len(header), max(map(len, cells), default=0))
        if width > MAX_CELL:
            # Every row is padded to the widest cell: one 50 KB hold reason (or a huge
            # external id in a foreign record) made a 100 MiB table. --json has it all.
            cells = [c if len(c) <= MAX_CELL else c[:MAX_CELL - 3] + "..." for c in cells]
            width = max(len(header), max(map(len, cells), default=0))
        headers.append(header.ljust(width))
        padded.append([c.ljust(width) for c in cells])
    rule = "+" + "+".join("-" * (len(h) + 2) for h in headers) + "+"
    out = [rule, "| " + " | ".join(headers) + " |", rule]
    out.extend(["| " + " | ".join(line) + " |" for line in zip(*padded)])
    out.append(rule)
    return "\n".join(out)


def render_json(rows: Sequence[dict[str, Any]]) -> str:
    return render_json_document(list(rows))


def render_json_document(value: Any) -> str:
    """Any JSON value in the same layout as `render_json` (for non-list outputs).

    Always strict JSON: a NaN or an infinity (which `json.dumps` would write as the
    non-JSON `NaN`/`Infinity`, breaking every strict reader, the status page included)
    is written as null. Records cannot bring one in (`records.load_json` refuses them);
    arithmetic on accepted values is the remaining source."""
    try:
        return json.dumps(value, indent=2, sort_keys=True, default=str, allow_nan=False)
    except ValueError:  # rare: only then is the document walked
        return json.dumps(finite(value), indent=2, sort_keys=True, default=str,
                          allow_nan=False)


def finite(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (containers copied)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
