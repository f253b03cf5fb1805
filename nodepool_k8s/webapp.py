"""The status web app: Nodepool's read-only endpoints plus Prometheus `/metrics`.

Owns: HTTP routing, content negotiation (`Accept: application/json` → JSON, else a text
table), caching headers and a one-second memo per (path, query, format). It reads through a
`StatusSource` (the launcher's caches, or a direct ZooKeeper reader) and never writes. A
source that raises answers 503 with the error text; the server keeps serving.

Endpoints: `/node-list` (`node_id`, `fields`), `/request-list` (`fields`), `/label-list`
(`fields`), `/ready` (200 "OK" once the launcher has started, else 503), `/metrics`.
"""

from __future__ import annotations

import email.utils
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Mapping, Protocol, Sequence
from urllib.parse import parse_qs, urlsplit

from nodepool_k8s import prometheus, status
from nodepool_k8s.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.model import NodeRequest

log = logging.getLogger("nodepool_k8s.webapp")

CACHE_SECONDS = 1.0


class StatusSource(Protocol):
    def node_views(self) -> Sequence[status.NodeView]: ...

    def requests(self) -> Sequence[NodeRequest]: ...

    def supported_labels(self) -> Sequence[Sequence[str]]: ...

    def ready(self) -> bool: ...

    def counters(self) -> Mapping[tuple[str, tuple[tuple[str, str], ...]], float]: ...


class WebApp:
    """Serve `source` on (address, port); port 0 picks a free one (see `.port`)."""

    def __init__(self, source: StatusSource, port: int = 8005,
                 listen_address: str = "0.0.0.0", clock: Clock = SYSTEM_CLOCK) -> None:
        self.source = source
        self.clock = clock
        self._memo: dict[tuple[str, str, bool], tuple[float, int, str, str]] = {}
        self._memo_lock = threading.Lock()
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                app._handle(self)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("%s " + fmt, self.address_string(), *args)

        self._server = ThreadingHTTPServer((listen_address, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> "WebApp":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="webapp", daemon=True)
        self._thread.start()
        log.info("Web app listening on port %s", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread:
            self._thread.join(5)

    # -- request handling -----------------------------------------------------------------------
    def _routes(self) -> dict[str, Callable[[dict[str, list[str]], bool], tuple[int, str, str]]]:
        return {
            "/node-list": self._node_list,
            "/request-list": self._request_list,
            "/label-list": self._label_list,
        }

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        want_json = "application/json" in (handler.headers.get("Accept") or "")
        try:
            if url.path == "/ready":
                ok = self.source.ready()
                self._send(handler, 200 if ok else 503, "text/plain",
                           "OK" if ok else "Launcher not ready", cache=False)
                return
            if url.path == "/metrics":
                body = prometheus.render(self.source.node_views(), self.source.requests(),
                                         self.source.ready(), self.source.counters())
                self._send(handler, 200, "text/plain; version=0.0.4; charset=utf-8", body,
                           cache=False)
                return
            route = self._routes().get(url.path)
            if route is None:
                self._send(handler, 404, "text/plain", "Not found", cache=False)
                return
            code, ctype, body = self._memoized(url.path, url.query, want_json,
                                               lambda: route(query, want_json))
            self._send(handler, code, ctype, body)
        except Exception as exc:  # the status page must outlive a bad read
            log.exception("Web request %s failed", handler.path)
            self._send(handler, 503, "text/plain", f"Status unavailable: {exc}", cache=False)

    def _memoized(self, path: str, query: str, want_json: bool,
                  compute: Callable[[], tuple[int, str, str]]) -> tuple[int, str, str]:
        key = (path, query, want_json)
        now = self.clock.monotonic()
        with self._memo_lock:
            hit = self._memo.get(key)
            if hit and now - hit[0] < CACHE_SECONDS:
                return hit[1], hit[2], hit[3]
        code, ctype, body = compute()
        with self._memo_lock:
            self._memo[key] = (now, code, ctype, body)
        return code, ctype, body

    @staticmethod
    def _fields(query: dict[str, list[str]]) -> list[str] | None:
        raw = query.get("fields")
        return raw[0].split(",") if raw else None

    def _render(self, rows: list[dict[str, Any]], columns: Sequence[tuple[str, str]],
                query: dict[str, list[str]], want_json: bool) -> tuple[int, str, str]:
        if want_json:
            return 200, "application/json", status.render_json(rows)
        cols = status.select_columns(columns, self._fields(query))
        return 200, "text/plain", status.render_table(rows, cols) + "\n"

    def _node_list(self, query: dict[str, list[str]], want_json: bool) -> tuple[int, str, str]:
        node_id = query.get("node_id", [None])[0]
        rows = status.node_list(self.source.node_views(), self.clock.time(), node_id)
        return self._render(rows, status.NODE_DETAIL_COLUMNS if self._fields(query)
                            else status.NODE_COLUMNS, query, want_json)

    def _request_list(self, query: dict[str, list[str]],
                      want_json: bool) -> tuple[int, str, str]:
        rows = status.request_list(self.source.requests())
        return self._render(rows, status.REQUEST_COLUMNS, query, want_json)

    def _label_list(self, query: dict[str, list[str]], want_json: bool) -> tuple[int, str, str]:
        rows = status.label_list(self.source.supported_labels())
        return self._render(rows, status.LABEL_COLUMNS, query, want_json)

    def _send(self, handler: BaseHTTPRequestHandler, code: int, ctype: str, body: str,
              cache: bool = True) -> None:
        data = body.encode("utf8")
        handler.send_response(code)
        handler.send_header("Content-Type", ctype)
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Access-Control-Allow-Origin", "*")
        now = self.clock.time()
        if cache:
            handler.send_header("Cache-Control", f"public, max-age={int(CACHE_SECONDS)}")
            handler.send_header("Last-Modified", email.utils.formatdate(now, usegmt=True))
            handler.send_header("Expires",
                                email.utils.formatdate(now + CACHE_SECONDS, usegmt=True))
        else:
            handler.send_header("Cache-Control", "no-cache")
        handler.end_headers()
        handler.wfile.write(data)
