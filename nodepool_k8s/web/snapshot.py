"""One reading of everything the status web app shows, shared by every answer until the next.

Owns: `Snapshot` (what a `StatusSource` said at one moment: the rows of every listing, the
node views for `/node/<id>`, the counters for `/metrics`), `Listing` (one listing's rows
plus what is derived from them at most once per snapshot: each row's JSON text, each text
column's cells and width) and the chunked rendering of an answer from a listing. A query
only picks row positions and columns; the bytes it sends are produced chunk by chunk from
the shared parts, so no query leaves anything behind, however many distinct queries come.

Building a snapshot reads the source (which may wait on ZooKeeper) and computes the rows:
the web app does it on its refresh thread, never on the event loop. The derived parts are
pure CPU over the rows (`Listing.prepare_json`, `Listing.prepare_columns`), done on the web
app's render thread; rendering chunks from prepared parts is cheap enough for the loop.

Failure: `build_snapshot` raises whatever the source raises (the web app keeps serving the
previous snapshot, marked stale); nothing here fails on odd data.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence

from nodepool_k8s.views import (pools as pool_view, prometheus, listing as status, node_detail)
from nodepool_k8s.config import fingerprint
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.core.records import MalformedRecord
from nodepool_k8s.runtime import stats

# Rows per chunk of a streamed answer: small enough that rendering one chunk on the event
# loop takes well under a millisecond, large enough that chunk overhead does not matter.
ROWS_PER_CHUNK = 100

Columns = Sequence[tuple[str, str]]


class StatusSource(Protocol):
    def node_views(self) -> Sequence[status.NodeView]: ...

    def requests(self) -> Sequence[NodeRequest]: ...

    def malformed(self) -> Sequence[MalformedRecord]: ...

    def supported_labels(self) -> Sequence[Sequence[str]]: ...

    def ready(self) -> bool: ...

    def counters(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]: ...


class Listing:
    """A listing's rows (`json_rows` for JSON answers, `table_rows` for text tables; the same
    list unless the two differ, as for pools) and their lazily derived parts."""

    def __init__(self, json_rows: Sequence[Mapping[str, Any]],
                 table_rows: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.json_rows = json_rows
        self.table_rows = json_rows if table_rows is None else table_rows
        self._lock = threading.Lock()
        self._json: list[bytes] | None = None
        self._columns: dict[str, tuple[list[str], int]] = {}

    def __len__(self) -> int:
        return len(self.json_rows)

    # -- derived parts (render thread) --------------------------------------------------
    @property
    def json_ready(self) -> bool:
        return self._json is not None

    def prepare_json(self) -> None:
        """Each row as it appears inside `status.render_json`'s list (indented one level)."""
        with self._lock:
            if self._json is None:
                self._json = [("  " + status.render_json_document(row).replace("\n", "\n  "))
                              .encode("utf8") for row in self.json_rows]

    def columns_ready(self, columns: Columns) -> bool:
        return all(key in self._columns for _, key in columns)

    def prepare_columns(self, columns: Columns) -> None:
        """Each column's cells (cut as `status.render_table` cuts them) and its width over
        every row of the listing: a query's table is as wide as the whole listing's."""
        with self._lock:
            for header, key in columns:
                if key in self._columns:
                    continue
                cells = [v if type(v) is str else status._cell(v)
                         for v in [row.get(key) for row in self.table_rows]]
                cut = status.MAX_CELL
                cells = [c if len(c) <= cut else c[:cut - 3] + "..." for c in cells]
                self._columns[key] = (cells, max(map(len, cells), default=0))

    # -- rendering (event loop) -----------------------------------------------------------
    def json_chunks(self, picked: Sequence[int] | None) -> Iterator[bytes]:
        """`status.render_json` of the picked rows (all when None), chunk by chunk."""
        encoded = self._json
        assert encoded is not None, "prepare_json first"
        positions: Sequence[int] = range(len(encoded)) if picked is None else picked
        if not positions:
            yield b"[]"
            return
        yield b"[\n"
        for start in range(0, len(positions), ROWS_PER_CHUNK):
            part = b",\n".join(encoded[i] for i in positions[start:start + ROWS_PER_CHUNK])
            yield part + (b",\n" if start + ROWS_PER_CHUNK < len(positions) else b"\n]")

    def table_chunks(self, columns: Columns, picked: Sequence[int] | None) -> Iterator[bytes]:
        """`status.render_table` of the picked rows plus a final newline, chunk by chunk."""
        positions: Sequence[int] = range(len(self.table_rows)) if picked is None else picked
        if not columns:
            yield ("\n".join(["++", "||", "++"] + ["||"] * len(positions) + ["++"])
                   + "\n").encode("utf8")
            return
        parts = [self._columns[key] for _, key in columns]
        widths = [max(len(header), width) for (header, _), (_, width) in zip(columns, parts)]
        rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
        head = "| " + " | ".join(h.ljust(w) for (h, _), w in zip(columns, widths)) + " |"
        yield f"{rule}\n{head}\n{rule}\n".encode("utf8")
        cells = [c for c, _ in parts]
        for start in range(0, len(positions), ROWS_PER_CHUNK):
            lines = ["| " + " | ".join(col[i].ljust(w) for col, w in zip(cells, widths)) + " |"
                     for i in positions[start:start + ROWS_PER_CHUNK]]
            yield ("\n".join(lines) + "\n").encode("utf8")
        yield (rule + "\n").encode("utf8")


@dataclass
class Snapshot:
    """What the source said at `taken` (monotonic) / `taken_wall` (epoch seconds)."""

    taken: float
    taken_wall: float
    ready: bool
    views: dict[str, status.NodeView]
    nodes: Listing
    node_positions: dict[str, int]
    requests: Listing
    labels: Listing
    pools: Listing
    request_records: Sequence[NodeRequest]
    pool_records: list[dict[str, Any]]
    counters: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]
    histograms: Any
    gauges: Mapping[tuple[str, tuple[tuple[str, str], ...]], float] | None = None
    # The loaded configuration's label hashes (a node's derived `Drifted`); None: unknown.
    hashes: fingerprint.Hashes | None = None
    _metrics: bytes | None = None
    _metrics_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def metrics_ready(self) -> bool:
        return self._metrics is not None

    def metrics(self) -> bytes:
        """The /metrics body, computed once per snapshot (render thread)."""
        with self._metrics_lock:
            if self._metrics is None:
                self._metrics = prometheus.render(
                    list(self.views.values()), self.request_records, self.ready,
                    self.counters, histograms=self.histograms,
                    pools=self.pool_records, gauges=self.gauges).encode("utf8")
            return self._metrics


def build_snapshot(source: StatusSource, taken: float, now: float) -> Snapshot:
    """Read everything from `source` and compute the rows (raises what the source raises)."""
    views = list(source.node_views())
    requests = list(source.requests())
    malformed = list(source.malformed())
    labels = source.supported_labels()
    read_pools = getattr(source, "pool_statuses", None)  # older or test sources: none
    pools = pool_view.pool_records(read_pools()) if callable(read_pools) else []
    combined = pool_view.combine(pools)  # one status per pool (views.pools)
    read_components = getattr(source, "pool_components", None)  # older or test sources
    read_histograms = getattr(source, "histograms", None)
    histograms = read_histograms() if callable(read_histograms) else None
    read_gauges = getattr(source, "gauges", None)
    gauges = read_gauges() if callable(read_gauges) else None
    if gauges is not None:
        # Rendered live per /metrics request by the web app, not frozen in the snapshot.
        gauges = {key: value for key, value in gauges.items()
                  if key[0] != stats.PROM_ZK_STATE}
    read_hashes = getattr(source, "config_hashes", None)  # older or test sources: none
    hashes = read_hashes() if callable(read_hashes) else None
    node_rows = status.node_list(views, now, None,
                                 [m for m in malformed if m.kind == "node"], hashes)
    return Snapshot(
        taken=taken, taken_wall=now, ready=source.ready(),
        views={v.node.id: v for v in views},
        nodes=Listing(node_rows),
        node_positions={str(row["id"]): index for index, row in enumerate(node_rows)},
        requests=Listing(status.request_list(
            requests, [m for m in malformed if m.kind == "request"], now,
            read_components() if callable(read_components) else None)),
        labels=Listing(status.label_list(labels)),
        pools=Listing(combined, pool_view.pool_rows(combined)),
        request_records=requests, pool_records=pools,
        counters=dict(source.counters()), histograms=histograms, gauges=gauges,
        hashes=hashes)


@dataclass
class EventsSnapshot:
    """The event log at one moment: its entries (oldest first) and their rows."""

    taken: float
    taken_wall: float
    events: list[dict[str, Any]]
    listing: Listing


def build_event_log(read: Any, taken: float, now: float) -> EventsSnapshot:
    events: list[dict[str, Any]] = list(read()) if callable(read) else []
    return EventsSnapshot(taken, now, events, Listing(node_detail.event_rows(events)))


def select_events(log: EventsSnapshot, provider: str | None, pool: str | None,
                  node_id: str | None, since: float | None, now: float) -> list[int] | None:
    """Positions of the matching events; None when no filter is given (all of them)."""
    if provider is None and pool is None and node_id is None and since is None:
        return None
    want_node = node_id.lstrip("0") if node_id is not None else None
    oldest = now - since if since is not None else None
    return [index for index, e in enumerate(log.events)
            if (provider is None or e.get("provider") == provider)
            and (pool is None or e.get("pool") == pool)
            and (want_node is None or str(e.get("node") or "").lstrip("0") == want_node)
            and (oldest is None or float(e.get("time") or 0) >= oldest)]
