"""The status web app: Nodepool's read-only endpoints plus Prometheus `/metrics`.

Owns: HTTP routing, content negotiation (`Accept: application/json` → JSON, else a text
table), caching headers and a one-second memo of rendered answers. It reads through a
`StatusSource` (the launcher's caches, or a direct ZooKeeper reader) and never writes.

It runs inside the launcher, so no client may be able to hurt the launcher through it:
- cheroot serves it with a fixed worker pool (`webapp.threads`), a per-connection read and
  idle timeout (`webapp.timeout`) and a cap on the request line plus headers
  (`webapp.max_header_size`); a slow or idle client holds at most one worker until the
  timeout and then is disconnected, and threads never grow past the pool.
- Only known endpoints and parameters are answered; an unknown parameter is a 400. The memo
  is keyed by the normalised known parameters and holds at most `MEMO_ENTRIES` answers, so a
  flood of distinct query strings cannot grow memory.
- A source that raises answers 503 with a fixed text (the cause goes to the log only), and
  the server keeps serving. A client that disconnects mid-request is logged at DEBUG.

Endpoints: `/node-list` (`node_id`, `fields`), `/request-list` (`fields`), `/label-list`
(`fields`), `/ready` (200 "OK" once the launcher has started, else 503), `/metrics`.
"""

from __future__ import annotations

import email.utils
import logging
import socket
import threading
from collections import OrderedDict
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence
from urllib.parse import parse_qs

from cheroot import wsgi

from nodepool_k8s import prometheus, status
from nodepool_k8s.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import WebappConfig
from nodepool_k8s.model import NodeRequest

log = logging.getLogger("nodepool_k8s.webapp")

CACHE_SECONDS = 1.0
# Enough for every endpoint × format × a handful of node ids and field selections; what
# falls out is simply rendered again.
MEMO_ENTRIES = 64
# More query fields than any known endpoint takes is a client error, not a parsing job.
MAX_QUERY_FIELDS = 8

Answer = tuple[int, str, str]  # status code, content type, body
StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class StatusSource(Protocol):
    def node_views(self) -> Sequence[status.NodeView]: ...

    def requests(self) -> Sequence[NodeRequest]: ...

    def supported_labels(self) -> Sequence[Sequence[str]]: ...

    def ready(self) -> bool: ...

    def counters(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]: ...


class BadRequest(Exception):
    """The query is not one this endpoint answers; the message is safe to send back."""


# Known parameters per endpoint; anything else is a 400.
PARAMETERS: dict[str, frozenset[str]] = {
    "/node-list": frozenset({"node_id", "fields"}),
    "/request-list": frozenset({"fields"}),
    "/label-list": frozenset({"fields"}),
    "/ready": frozenset(),
    "/metrics": frozenset(),
}

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def parse_query(path: str, query: str) -> dict[str, str]:
    """The known parameters of `query` for `path` (last value wins); BadRequest otherwise."""
    try:
        parsed = parse_qs(query, keep_blank_values=True, max_num_fields=MAX_QUERY_FIELDS,
                          strict_parsing=False, errors="strict")
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("Malformed query string")
    unknown = sorted(set(parsed) - PARAMETERS[path])
    if unknown:
        # Echo only names we know are short and harmless: the count, not the text.
        raise BadRequest(f"Unknown query parameter(s): {len(unknown)}; "
                         f"this endpoint takes: {', '.join(sorted(PARAMETERS[path])) or 'none'}")
    return {name: values[-1] for name, values in parsed.items()}


def _disconnect(exc: BaseException | None) -> bool:
    return isinstance(exc, (ConnectionError, socket.timeout, TimeoutError, BrokenPipeError))


class _Server(wsgi.Server):
    """cheroot's server, logging through `log`; a client going away is not an error."""

    def error_log(self, msg: str = "", level: int = 20, traceback: bool = False) -> None:
        import sys

        exc = sys.exc_info()[1] if traceback else None
        if _disconnect(exc):
            log.debug("Client went away: %r", exc)
            return
        log.log(level if level < logging.ERROR else logging.WARNING, "HTTP server: %s", msg,
                exc_info=traceback)


class WebApp:
    """Serve `source` on `config.listen_address`:`config.port`; port 0 picks a free one."""

    def __init__(self, source: StatusSource, config: WebappConfig = WebappConfig(),
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self.clock = clock
        self.config = config
        self._memo: OrderedDict[tuple[Any, ...], tuple[float, Answer]] = OrderedDict()
        self._memo_lock = threading.Lock()
        self._server = _Server((config.listen_address, config.port), self,
                               numthreads=config.threads, max=config.threads,
                               # Stubs say int; it goes to socket.settimeout, a float is fine.
                               timeout=config.timeout,  # type: ignore[arg-type]
                               server_name="nodepool-k8s")
        self._server.max_request_header_size = config.max_header_size
        self._server.max_request_body_size = 1  # read-only GETs carry no body
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    @property
    def memo_size(self) -> int:
        with self._memo_lock:
            return len(self._memo)

    def start(self) -> "WebApp":
        self._server.prepare()  # binds: an address in use raises OSError here, to the caller
        self._thread = threading.Thread(target=self._server.serve, name="webapp", daemon=True)
        self._thread.start()
        log.info("Web app listening on %s port %s (%d workers)", self.config.listen_address,
                 self.port, self.config.threads)
        return self

    def stop(self) -> None:
        self._server.stop()
        if self._thread:
            self._thread.join(5)

    # -- request handling -----------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any],
                 start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO") or "")
        want_json = "application/json" in str(environ.get("HTTP_ACCEPT") or "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return self._send(start_response, (405, "text/plain", "Only GET is served"), False)
        if path not in PARAMETERS:
            return self._send(start_response, (404, "text/plain", "Not found"), False)
        try:
            query = parse_query(path, str(environ.get("QUERY_STRING") or ""))
        except BadRequest as exc:
            return self._send(start_response, (400, "text/plain", str(exc)), False)
        try:
            if path == "/ready":
                ok = self.source.ready()
                return self._send(start_response, (200 if ok else 503, "text/plain",
                                                   "OK" if ok else "Launcher not ready"), False)
            if path == "/metrics":
                body = prometheus.render(self.source.node_views(), self.source.requests(),
                                         self.source.ready(), self.source.counters())
                return self._send(start_response, (
                    200, "text/plain; version=0.0.4; charset=utf-8", body), False)
            return self._send(start_response, self._listing(path, query, want_json), True)
        except Exception as exc:  # the status page must outlive a bad read
            log.warning("Web request %s failed: %s", path, exc, exc_info=True)
            return self._send(start_response, (503, "text/plain", "Status unavailable"), False)

    def _listing(self, path: str, query: dict[str, str], want_json: bool) -> Answer:
        fields = [f for f in query.get("fields", "").split(",") if f.strip()] or None
        columns: Sequence[tuple[str, str]]
        if path == "/node-list":
            columns = status.NODE_DETAIL_COLUMNS if fields else status.NODE_COLUMNS
        elif path == "/request-list":
            columns = status.REQUEST_COLUMNS
        else:
            columns = status.LABEL_COLUMNS
        cols = tuple(status.select_columns(columns, fields))
        node_id = query.get("node_id") if path == "/node-list" else None
        # The key holds only what changes the answer: JSON ignores `fields`, and the text
        # table depends on the resolved columns, not on how the client spelled them.
        key = (path, want_json, node_id, None if want_json else cols)
        return self._memoized(key, lambda: self._render(path, node_id, cols, want_json))

    def _render(self, path: str, node_id: str | None, cols: Sequence[tuple[str, str]],
                want_json: bool) -> Answer:
        if path == "/node-list":
            rows = status.node_list(self.source.node_views(), self.clock.time(), node_id)
        elif path == "/request-list":
            rows = status.request_list(self.source.requests())
        else:
            rows = status.label_list(self.source.supported_labels())
        if want_json:
            return 200, "application/json", status.render_json(rows)
        return 200, "text/plain", status.render_table(rows, cols) + "\n"

    def _memoized(self, key: tuple[Any, ...], compute: Callable[[], Answer]) -> Answer:
        now = self.clock.monotonic()
        with self._memo_lock:
            hit = self._memo.get(key)
            if hit and now - hit[0] < CACHE_SECONDS:
                self._memo.move_to_end(key)
                return hit[1]
        answer = compute()
        with self._memo_lock:
            self._memo[key] = (now, answer)
            self._memo.move_to_end(key)
            while len(self._memo) > MEMO_ENTRIES:
                self._memo.popitem(last=False)
        return answer

    def _send(self, start_response: StartResponse, answer: Answer,
              cache: bool) -> list[bytes]:
        code, ctype, body = answer
        data = body.encode("utf8")
        headers = [("Content-Type", ctype), ("Content-Length", str(len(data)))]
        if self.config.cors_origin:
            headers.append(("Access-Control-Allow-Origin", self.config.cors_origin))
        now = self.clock.time()
        if cache:
            headers += [("Cache-Control", f"public, max-age={int(CACHE_SECONDS)}"),
                        ("Last-Modified", email.utils.formatdate(now, usegmt=True)),
                        ("Expires", email.utils.formatdate(now + CACHE_SECONDS, usegmt=True))]
        else:
            headers.append(("Cache-Control", "no-cache"))
        start_response(f"{code} {_REASONS.get(code, '')}".strip(), headers)
        return [data]
