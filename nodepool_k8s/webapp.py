"""The status web app: Nodepool's read-only endpoints plus Prometheus `/metrics`.

Owns: HTTP routing, query validation, content negotiation (`Accept: application/json` →
JSON, else a text table), caching headers and a small one-second memo. It reads through a
`StatusSource` (the launcher's caches) and never writes.

It lives inside the launcher, so no client may be able to hurt it. The HTTP server is
cheroot (the server CherryPy runs on, as Nodepool's and Zuul's web apps do): a fixed pool of
`threads` workers; a connection gets a worker only once it has sent something (silent and
idle keep-alive connections wait in one selector); idle and half-sent connections closed
after `timeout` seconds; request line and headers capped at `max-header-size` bytes. A
request's line, headers and body must arrive within `timeout` seconds in all, and its answer
be sent within `send_timeout` seconds (`_cheroot_ext.DeadlineConnection`), so a client that
trickles its request or reads the answer slowly holds a worker for a bounded time.
Only known endpoints and parameters are answered (others: 404 / 400), so the memo is keyed
by normalised parameters; it forgets answers after a second and is bounded in entries and
characters (`MEMO_ENTRIES`, `MEMO_CHARS`). No CORS header unless the operator
names an origin. Error bodies never carry tracebacks or exception text of unexpected errors;
client disconnects are not errors.

Endpoints: `/` (the status page, `status_page`), `/node-list` (`node_id`, `fields`),
`/request-list` (`fields`), `/label-list` (`fields`), `/pool-list` (`fields`), `/ready`
(200 "OK" once the launcher has started, else 503), `/metrics`.
Malformed znodes are listed as rows in state `malformed`.

Failure: an installed cheroot whose internals differ from what `_cheroot_ext` relies on
raises `CherootIncompatible` when the web app is created (the launcher does not start).
A source that raises a temporary error answers 503 with its (our own) message;
anything else 500 "Internal error" (logged with the traceback). The server keeps serving.
"""

from __future__ import annotations

import email.utils
import logging
import select
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence
from urllib.parse import parse_qsl

from cheroot import wsgi

from nodepool_k8s import _cheroot_ext, pool_view, prometheus, status, status_detail, status_page
from nodepool_k8s.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.exceptions import TemporaryError
from nodepool_k8s.model import NodeRequest
from nodepool_k8s.records import MalformedRecord

log = logging.getLogger("nodepool_k8s.webapp")

CACHE_SECONDS = 1.0
MEMO_ENTRIES = 64
# And at most this many characters of answers in all: with 5,000 nodes each node list is
# megabytes, and 64 of them (distinct URLs) held 228 MiB until the next distinct URL came.
MEMO_CHARS = 16 * 1024 * 1024
MAX_QUERY_FIELDS = 8
MAX_VALUE_LENGTH = 512
NODE_ID_DIGITS = 10  # node ids are zero-padded sequence numbers


@dataclass(frozen=True)
class WebSettings:
    """How the server protects itself; see `webapp:` in doc/configuration.md."""

    threads: int = 8
    timeout: int = 10  # seconds: idle connections; a whole request (line, headers, body)
    send_timeout: int = 60  # seconds to send one answer
    max_header_size: int = 16384
    allow_origin: str | None = None


class StatusSource(Protocol):
    def node_views(self) -> Sequence[status.NodeView]: ...

    def requests(self) -> Sequence[NodeRequest]: ...

    def malformed(self) -> Sequence[MalformedRecord]: ...

    def supported_labels(self) -> Sequence[Sequence[str]]: ...

    def ready(self) -> bool: ...

    def counters(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]: ...


class BadRequest(Exception):
    """The client asked for something we do not serve (400, with a short message)."""


Response = tuple[int, str, str]
Params = tuple[tuple[str, Any], ...]


class _QuietServer(wsgi.Server):
    """cheroot reports client-side trouble (resets, timeouts, garbage) through error_log;
    those are the client's problem, not ours: debug level, no traceback.

    Connections are `DeadlineConnection`s: each request within `receive_timeout` (the
    head) and `send_timeout` (the answer)."""

    ConnectionClass = _cheroot_ext.DeadlineConnection
    receive_timeout: float = 10
    send_timeout: float = 60

    def error_log(self, msg: str = "", level: int = 20, traceback: bool = False) -> None:
        if level >= logging.ERROR:
            log.warning("HTTP server: %s", msg, exc_info=traceback)
        else:
            log.debug("HTTP server: %s", msg)

    def process_conn(self, conn: Any) -> None:
        """Give a connection a worker only once it has something to read.

        cheroot hands every new connection to a worker at once, and the worker waits up to
        `timeout` for the request line: a few clients that connect and send nothing (every
        10 s, say) held all workers, and /ready went unanswered for minutes. A silent new
        connection is parked with the idle keep-alive ones instead (one selector, no
        thread), handed over when it becomes readable and closed after `timeout`."""
        if not conn.rfile.has_data() and not _readable(conn.socket):
            manager: Any = getattr(self, "_connections")  # see _cheroot_ext.check_prepared
            manager.put(conn)
            return
        super().process_conn(conn)


def _readable(sock: Any) -> bool:
    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed meanwhile: a worker finds out and cleans up
        return True


class WebApp:
    """Serve `source` on (address, port); port 0 picks a free one (see `.port`)."""

    def __init__(self, source: StatusSource, port: int = 8005,
                 listen_address: str = "127.0.0.1", clock: Clock = SYSTEM_CLOCK,
                 settings: WebSettings = WebSettings()) -> None:
        _cheroot_ext.check()  # CherootIncompatible (permanent) before serving without limits
        self.source = source
        self.clock = clock
        self.settings = settings
        self._memo: OrderedDict[tuple[str, Params, bool], tuple[float, Response]] = \
            OrderedDict()
        self._memo_lock = threading.Lock()
        self._memo_chars = 0
        self._server = _QuietServer((listen_address, port), self._wsgi,
                                    numthreads=settings.threads, max=settings.threads,
                                    timeout=settings.timeout, server_name="nodepool-k8s")
        self._server.max_request_header_size = settings.max_header_size
        self._server.receive_timeout = settings.timeout
        self._server.send_timeout = settings.send_timeout
        self._server.max_request_body_size = 1024  # GET only: no body worth reading
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    def start(self) -> "WebApp":
        self._server.prepare()  # binds now: errors (port in use) reach the caller
        _cheroot_ext.check_prepared(self._server)
        self._thread = threading.Thread(target=self._server.serve, name="webapp", daemon=True)
        self._thread.start()
        log.info("Web app listening on %s port %s", self._server.bind_addr[0], self.port)
        return self

    def stop(self) -> None:
        self._server.stop()
        if self._thread:
            self._thread.join(5)

    # -- WSGI ---------------------------------------------------------------------------
    def _wsgi(self, environ: Mapping[str, Any],
              start_response: Callable[..., Any]) -> Iterable[bytes]:
        code, ctype, body, cache = self._respond(environ)
        data = body.encode("utf8")
        headers = [("Content-Type", ctype), ("Content-Length", str(len(data)))]
        if self.settings.allow_origin:
            headers.append(("Access-Control-Allow-Origin", self.settings.allow_origin))
        now = self.clock.time()
        if cache and code == 200:
            headers += [("Cache-Control", f"public, max-age={int(CACHE_SECONDS)}"),
                        ("Last-Modified", email.utils.formatdate(now, usegmt=True)),
                        ("Expires", email.utils.formatdate(now + CACHE_SECONDS, usegmt=True))]
        else:
            headers.append(("Cache-Control", "no-cache"))
        start_response(f"{code} {_REASONS.get(code, 'Error')}", headers)
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [data]

    def _respond(self, environ: Mapping[str, Any]) -> tuple[int, str, str, bool]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return 405, "text/plain", "Method not allowed\n", False
        path = str(environ.get("PATH_INFO") or "/")
        want_json = "application/json" in str(environ.get("HTTP_ACCEPT") or "")
        try:
            if path == "/ready":
                _params(environ, ())
                ok = self.source.ready()
                return (200, "text/plain", "OK", False) if ok else \
                    (503, "text/plain", "Launcher not ready", False)
            if path == "/metrics":
                _params(environ, ())
                histograms = getattr(self.source, "histograms", None)
                body = prometheus.render(self.source.node_views(), self.source.requests(),
                                         self.source.ready(), self.source.counters(),
                                         histograms=histograms() if histograms else None,
                                         pools=self._pool_records())
                return 200, "text/plain; version=0.0.4; charset=utf-8", body, False
            route = _ROUTES.get(path)
            if route is None and path.startswith(NODE_PREFIX):
                route = _NODE_ROUTE
            if route is None:
                return 404, "text/plain", "Not found\n", False
            params = _params(environ, route[0])
            if route is _NODE_ROUTE:
                params = (("node_id", _node_id_of(path)),) + params
            code, ctype, body = self._memoized(path, params, want_json,
                                               lambda: route[1](self, params, want_json))
            return code, ctype, body, True
        except BadRequest as exc:
            return 400, "text/plain", f"Bad request: {exc}\n", False
        except TemporaryError as exc:
            log.warning("Web request %s: %s", path, exc)
            return 503, "text/plain", f"Status unavailable: {exc}\n", False
        except Exception:  # the status page must outlive a bad read
            log.exception("Web request %s failed", path)
            return 500, "text/plain", "Internal error\n", False

    def _memoized(self, path: str, params: Params, want_json: bool,
                  compute: Callable[[], Response]) -> Response:
        key = (path, params, want_json)
        now = self.clock.monotonic()
        with self._memo_lock:
            hit = self._memo.get(key)
            if hit and now - hit[0] < CACHE_SECONDS:
                return hit[1]
        response = compute()
        size = len(response[2])
        with self._memo_lock:
            old = self._memo.pop(key, None)
            if old is not None:
                self._memo_chars -= len(old[1][2])
            if size <= MEMO_CHARS:
                self._memo[key] = (now, response)
                self._memo_chars += size
            # Oldest first (every store goes to the end): expired answers can never be
            # served again, so they go at once, then whatever exceeds the bounds.
            while self._memo:
                first_at, first = next(iter(self._memo.values()))
                if now - first_at < CACHE_SECONDS and len(self._memo) <= MEMO_ENTRIES \
                        and self._memo_chars <= MEMO_CHARS:
                    break
                self._memo.popitem(last=False)
                self._memo_chars -= len(first[2])
        return response

    @property
    def memo_size(self) -> int:
        with self._memo_lock:
            return len(self._memo)

    @property
    def memo_chars(self) -> int:
        with self._memo_lock:
            return self._memo_chars

    # -- endpoints ----------------------------------------------------------------------
    def _render(self, rows: list[dict[str, Any]], columns: Sequence[tuple[str, str]],
                fields: tuple[str, ...] | None, want_json: bool) -> Response:
        if want_json:
            return 200, "application/json", status.render_json(rows)
        cols = status.select_columns(columns, fields)
        return 200, "text/plain", status.render_table(rows, cols) + "\n"

    def _node_list(self, params: Params, want_json: bool) -> Response:
        values = dict(params)
        node_id = values.get("node_id")
        fields = values.get("fields")
        malformed = [m for m in self.source.malformed() if m.kind == "node"]
        rows = status.node_list(self.source.node_views(), self.clock.time(), node_id,
                                malformed)
        return self._render(rows, status.NODE_DETAIL_COLUMNS if fields
                            else status.NODE_COLUMNS, fields, want_json)

    def _request_list(self, params: Params, want_json: bool) -> Response:
        malformed = [m for m in self.source.malformed() if m.kind == "request"]
        rows = status.request_list(self.source.requests(), malformed)
        return self._render(rows, status.REQUEST_COLUMNS, dict(params).get("fields"),
                            want_json)

    def _pool_records(self) -> list[dict[str, Any]]:
        # Sources without pool status (older or test sources) show no pools.
        source = getattr(self.source, "pool_statuses", None)
        return pool_view.pool_records(source()) if callable(source) else []

    def _pool_list(self, params: Params, want_json: bool) -> Response:
        records = self._pool_records()
        if want_json:
            return 200, "application/json", status.render_json(records)
        cols = status.select_columns(pool_view.POOL_STATUS_COLUMNS, dict(params).get("fields"))
        return 200, "text/plain", status.render_table(pool_view.pool_rows(records), cols) + "\n"

    def _index(self, params: Params, want_json: bool) -> Response:
        return 200, "text/html; charset=utf-8", status_page.PAGE

    def _label_list(self, params: Params, want_json: bool) -> Response:
        rows = status.label_list(self.source.supported_labels())
        return self._render(rows, status.LABEL_COLUMNS, dict(params).get("fields"),
                            want_json)

    def _node(self, params: Params, want_json: bool) -> Response:
        """`/node/<id>`: one node's record, conditions, timings and failure reason."""
        node_id = dict(params)["node_id"]
        view = next((v for v in self.source.node_views() if v.node.id == node_id), None)
        if view is None:
            return 404, "text/plain", f"Node {node_id} not found\n"
        detail = status_detail.node_detail(view, self.clock.time())
        if want_json:
            return 200, "application/json", status.render_json_document(detail)
        return 200, "text/plain", status_detail.render_node_detail(detail) + "\n"

    def _events(self, params: Params, want_json: bool) -> Response:
        """`/events`: the installation's event log, newest last."""
        read = getattr(self.source, "events", None)
        events: list[dict[str, Any]] = list(read()) if read is not None else []
        values = dict(params)
        since = values.get("since")
        rows = [e for e in events
                if all(values.get(k) in (None, e.get(k)) for k in ("provider", "pool"))
                and (values.get("node_id") is None
                     or str(e.get("node") or "").lstrip("0") == values["node_id"].lstrip("0"))
                and (since is None or float(e.get("time") or 0) >= self.clock.time() - since)]
        return self._render(status_detail.event_rows(rows), status_detail.EVENT_COLUMNS,
                            values.get("fields"), want_json)


NODE_PREFIX = "/node/"


def _node_id_of(path: str) -> str:
    node_id = path[len(NODE_PREFIX):]
    if not node_id.isdigit() or not node_id.isascii() or len(node_id) > 20:
        raise BadRequest("/node/<id> takes a node id (digits)")
    return node_id.zfill(NODE_ID_DIGITS)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}


def _params(environ: Mapping[str, Any], allowed: Sequence[str]) -> Params:
    """The query's known parameters, normalised (sorted, fields split and de-duplicated);
    BadRequest for anything unknown, repeated, too long or too many."""
    query = str(environ.get("QUERY_STRING") or "")
    try:
        pairs = parse_qsl(query, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise BadRequest("too many query parameters") from None
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name not in allowed:
            raise BadRequest(f"unknown query parameter {_safe(name)!r}"
                             + (f"; this endpoint takes {', '.join(allowed)}" if allowed
                                else "; this endpoint takes none"))
        if name in out:
            raise BadRequest(f"query parameter {_safe(name)!r} given twice")
        if len(value) > MAX_VALUE_LENGTH:
            raise BadRequest(f"query parameter {_safe(name)!r} is too long")
        if name == "node_id":
            if not value.isdigit() or not value.isascii():
                raise BadRequest("node_id must be a node id (digits)")
            out[name] = value.zfill(NODE_ID_DIGITS)  # 42 is 0000000042, as in the CLI
        elif name in ("provider", "pool"):
            out[name] = value
        elif name == "since":
            try:
                seconds = float(value)
            except ValueError:
                raise BadRequest("since must be a number of seconds") from None
            if not 0 <= seconds < 1e9:
                raise BadRequest("since must be a number of seconds")
            out[name] = seconds
        elif name == "fields":
            picked = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",")
                                         if f.strip()))
            out[name] = picked or None
    return tuple(sorted(out.items()))


def _safe(text: str) -> str:
    """A client-supplied name, shortened and printable, for an error message."""
    cleaned = "".join(c if c.isprintable() else "?" for c in text)
    return cleaned if len(cleaned) <= 40 else cleaned[:37] + "..."


_Route = tuple[tuple[str, ...], Callable[[WebApp, Params, bool], Response]]
_ROUTES: dict[str, _Route] = {
    "/node-list": (("node_id", "fields"), WebApp._node_list),
    "/request-list": (("fields",), WebApp._request_list),
    "/label-list": (("fields",), WebApp._label_list),
    "/events": (("provider", "pool", "node_id", "since", "fields"), WebApp._events),
    "/pool-list": (("fields",), WebApp._pool_list),
    "/": ((), WebApp._index),
}
_NODE_ROUTE: _Route = ((), WebApp._node)
