"""HTTP/1.1 (and HTTPS) transport for the simulated API server.

Owns: listening on a TCP port, one thread per connection with keep-alive, the TLS handshake
(done in the connection's thread so a slow client cannot stall accept()), reading request
bodies on every method (kubectl sends one with DELETE; an unread body would be parsed as the
next request), writing JSON responses in a single send, and chunked transfer encoding for
watches.

Two latency traps are avoided on purpose: TCP_NODELAY is set on every accepted socket (else
Nagle's algorithm plus the client's delayed ACK add ~40 ms per call), and responses are
written with one sendall() instead of headers and body separately.

Freezing (`freeze()`/`thaw()`): the server goes on accepting connections and reading
requests but answers none, as an overloaded or partitioned API server does; a request read
while frozen is never applied, and its connection is closed unanswered once the server
thaws or stops (its client gave up long before).

Shutdown: `stop()` ends the accept loop by shutting the listening socket down (which wakes a
blocked accept() at once, no poll interval), shuts down every open connection so their
threads leave their blocking reads, and joins the threads. Errors on one connection (client
vanished mid-watch, TLS garbage) are logged at debug level and only close that connection.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import uuid
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.api import Api, Request, Response
from nodepool_k8s.dev.simulator.watch import WatchStream

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024
_DISCONNECTS = (ConnectionError, BrokenPipeError, TimeoutError, ssl.SSLError, OSError)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "nodepool-k8s-sim"
    sys_version = ""
    timeout = 300  # idle keep-alive connections are closed after this
    server: "_HttpServer"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(10)
            self.request.do_handshake()
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        self.server.untrack(self.connection)
        try:
            super().finish()
        except _DISCONNECTS:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("%s %s", self.address_string(), format % args)

    # Every method goes through the same path; the API decides what is allowed.
    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise errors.ApiError(413, "RequestEntityTooLarge", "request body too large")
        return self.rfile.read(length) if length > 0 else b""

    def _serve(self) -> None:
        if self.server.frozen:
            self.server.wait_thawed()
            self.close_connection = True  # unanswered: the client has given up on it
            return
        try:
            body = self._read_body()
        except errors.ApiError as exc:
            self.close_connection = True
            self._send(Response(exc.code, exc.status(), exc.headers))
            return
        request = Request.from_target(self.command, self.path, dict(self.headers.items()), body)
        try:
            result = self.server.api.handle(request)
        except errors.ApiError as exc:
            result = Response(exc.code, exc.status(), exc.headers)
        except Exception as exc:  # a simulator bug must not take the connection down silently
            log.exception("simulator failed on %s %s", self.command, self.path)
            err = errors.internal_error(f"simulator bug: {exc!r}")
            result = Response(500, err.status())
        if isinstance(result, WatchStream):
            self._stream(result)
        else:
            self._send(result)

    def _head(self, code: int, headers: dict[str, str]) -> bytes:
        """The status line and the headers a kube-apiserver sends with every answer: an
        audit id per request, the API priority and fairness classification, caching and
        date, then `headers`. Clients pay per header parsed, so no more than it sends."""
        phrase = HTTPStatus(code).phrase if code in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {code} {phrase}",
                 f"Audit-Id: {uuid.uuid4()}",
                 "Cache-Control: no-cache, private",
                 *self.server.flow_headers,
                 f"Date: {formatdate(usegmt=True)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if self.close_connection:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def _send(self, response: Response) -> None:
        payload = response.encode()
        headers = {"Content-Type": response.content_type, **response.headers,
                   "Content-Length": str(len(payload))}
        self.log_request(response.status, len(payload))
        data = self._head(response.status, headers)
        self.wfile.write(data if self.command == "HEAD" else data + payload)

    def _stream(self, stream: WatchStream) -> None:
        self.log_request(200)

        def write(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        try:
            self.wfile.write(self._head(200, {"Content-Type": "application/json",
                                              "Transfer-Encoding": "chunked"}))
            client_gone = stream.run(self.connection, write)
            if client_gone:
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
        except _DISCONNECTS as exc:
            log.debug("watch client went away: %r", exc)
            self.close_connection = True
            return
        finally:
            stream.close()
        if self.server.stopping:
            self.close_connection = True


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], api: Api,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.api = api
        self.ssl_context = ssl_context
        self.stopping = False
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._workers: set[threading.Thread] = set()
        # Set while the server answers (not frozen), and when it stops.
        self._thawed = threading.Event()
        self._thawed.set()
        # The flow schema and priority level every request is classified into.
        self.flow_headers = (f"X-Kubernetes-Pf-Flowschema-Uid: {uuid.uuid4()}",
                             f"X-Kubernetes-Pf-Prioritylevel-Uid: {uuid.uuid4()}")
        super().__init__(address, _Handler)

    @property
    def frozen(self) -> bool:
        return not self._thawed.is_set()

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def wait_thawed(self) -> None:
        self._thawed.wait()

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True,
                                                do_handshake_on_connect=False)
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._work, args=(request, client_address),
                                  name="k8s-sim-conn", daemon=True)
        with self._lock:
            self._workers.add(thread)
        thread.start()

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._workers.discard(threading.current_thread())

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s ended with an error", client_address, exc_info=True)

    def track(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def accept_loop(self) -> None:
        while not self.stopping:
            try:
                request, address = self.get_request()
            except OSError:
                if self.stopping:
                    return
                log.debug("accept failed", exc_info=True)
                continue
            if self.stopping:
                request.close()
                return
            self.process_request(request, address)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping = True
        self._thawed.set()  # frozen requests end with the server
        try:
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                # The plain-socket shutdown, not SSLSocket's, which would race the reader.
                socket.socket.shutdown(conn, socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))


class ApiServer:
    """Binds, serves the `Api` on a background accept thread, and stops."""

    def __init__(self, api: Api, host: str = "127.0.0.1", port: int = 0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._server = _HttpServer((host, port), api, ssl_context)
        self.host = host
        self.port = int(self._server.server_address[1])
        self.scheme = "https" if ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._server.accept_loop,
                                        name="k8s-sim-accept", daemon=True)
        self.stopped = False

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> "ApiServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopped = True
        self._server.stop()
        self._thread.join(5)

    def freeze(self) -> None:
        """Accept connections and read requests, answer none (until `thaw`)."""
        self._server.freeze()

    def thaw(self) -> None:
        self._server.thaw()

    @property
    def frozen(self) -> bool:
        return self._server.frozen

    def nodelay_flags(self) -> list[bool]:
        """TCP_NODELAY of every open connection (all True: Nagle is off)."""
        with self._server._lock:
            socks = list(self._server._connections)
        return [bool(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) for s in socks]

    def open_connections(self) -> int:
        with self._server._lock:
            return len(self._server._connections)
