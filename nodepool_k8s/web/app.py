"""The status web app: Nodepool's read-only endpoints plus Prometheus `/metrics`.

Owns: the HTTP server, routing, query validation, content negotiation (`Accept:
application/json` → JSON, else a text table), caching headers, and when the data shown is
read again. It reads through a `StatusSource` (the launcher's caches) and never writes.

It lives inside the launcher, where CI jobs may reach its port, so no client may be able to
hurt it; the design follows from that:

- One event loop on one thread (`webapp`, aiohttp's low-level server) serves every
  connection. A connection costs a few kilobytes and no thread; a handler runs only once
  the whole request head has arrived, so clients that connect and say nothing, or trickle
  their request, hold no worker (there are none to hold). The thread count is fixed: the
  loop, `webapp-refresh` and `webapp-render`.
- Limits, enforced on the loop (`_Connections`): a connection that has not completed its
  request head within `timeout` seconds of connecting or of its previous answer is closed
  (`408` if it had started a request); sending one answer may take `send_timeout` seconds,
  then the connection is cut; a request head over `max-header-size` bytes is refused (`414`
  or `413`); at most `max_connections` connections are kept: one more closes the oldest that
  is idle or half-sent (a connection being answered is never the one closed). The limit is
  also kept under half the process's open-file limit.
- Handlers never wait on ZooKeeper. The data comes from a `status_snapshot.Snapshot` read on
  the `webapp-refresh` thread at most once per `CACHE_SECONDS` (and the event log likewise,
  separately, only while `/events` is asked for). A request that finds the snapshot older
  than that asks for a new one and waits up to `REFRESH_WAIT` for it; if the reading does
  not finish in time (ZooKeeper stalls) or fails, the previous snapshot is served, marked
  stale (`X-Status-Age`, `X-Status-Stale` headers; `nodepool_status_age_seconds` in
  `/metrics`), for up to `MAX_STALE` seconds; beyond that, or before the first reading, the
  answer is `503 Status unavailable: <reason>` (an unexpected error: `500 Internal error`,
  logged with its traceback). `/ready` reads one flag and never waits for anything.
- Every answer is produced from the snapshot's shared parts, chunk by chunk (each listing's
  rows are computed once per reading, their JSON text and table cells at most once, on the
  `webapp-render` thread; `/metrics` once per reading): a flood of distinct queries keeps
  nothing per query, and memory does not grow with the number of distinct URLs. The
  per-request work of producing chunks is held to `CPU_SHARE` of one CPU (`_CpuBudget`):
  past it, answers come more slowly, so a flood does not take the interpreter from the
  launcher's request handling; `/ready` and `/metrics` send prepared bytes and are never
  slowed.

Only known endpoints and parameters are answered (others: 404 / 400). No CORS header unless
the operator names an origin. Error bodies never carry tracebacks or exception text of
unexpected errors; client disconnects are not errors.

Endpoints: `/` (the status page, `status_page`), `/node-list` (`node_id`, `fields`),
`/request-list` (`fields`), `/label-list` (`fields`), `/pool-list` (`fields`), `/events`,
`/node/<id>`, `/ready` (200 "OK" once the launcher has started, else 503), `/metrics`.
Malformed znodes are listed as rows in state `malformed`.

Failure: `start()` raises OSError when the address cannot be bound. The server keeps serving
whatever a source or a client does.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import resource
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import parse_qsl

from aiohttp import web

from nodepool_k8s.views import pools, listing as status, node_detail
from nodepool_k8s.web import page as status_page, snapshot as status_snapshot
from nodepool_k8s.runtime import stats
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.web.snapshot import EventsSnapshot, Listing, Snapshot, StatusSource

__all__ = ["StatusSource", "WebApp", "WebSettings"]

log = logging.getLogger("nodepool_k8s.web.app")

# A snapshot younger than this is served as it is; an older one is read again first.
CACHE_SECONDS = 1.0
# How long a request waits for a new reading before it is answered from the previous one.
REFRESH_WAIT = 0.5
# The oldest snapshot served (marked stale); older means 503.
MAX_STALE = 60.0
MAX_QUERY_FIELDS = 8
MAX_VALUE_LENGTH = 512
NODE_ID_DIGITS = 10  # node ids are zero-padded sequence numbers
# How often the connection limits are checked (at most a quarter of `timeout`).
SWEEP_SECONDS = 0.25
# Pending connections the kernel queues before the loop accepts them.
BACKLOG = 1024
# The share of one CPU that producing answers (the per-request part: chunks of listings)
# may take while clients keep the web app busy: it shares the interpreter (the GIL) with
# request handling, and an unthrottled flood of distinct queries doubled Zuul's request
# latency. Past the share (after a burst of CPU_BURST seconds), answers come more slowly.
# Reading snapshots and their shared parts is not counted: it happens at most once a
# second, however many requests come.
CPU_SHARE = 0.25
CPU_BURST = 0.25


@dataclass(frozen=True)
class WebSettings:
    """How the server protects itself; see `webapp:` in doc/configuration.md."""

    threads: int = 8  # accepted for compatibility; the event loop has no worker pool
    timeout: int = 10  # seconds: a request head (from connecting, or from the last answer)
    send_timeout: int = 60  # seconds to send one answer
    max_header_size: int = 16384
    max_connections: int = 1000
    allow_origin: str | None = None


class BadRequest(Exception):
    """The client asked for something we do not serve (400, with a short message)."""


Params = tuple[tuple[str, Any], ...]
Body = bytes | Iterable[bytes]


@dataclass
class Answer:
    code: int
    ctype: str
    body: Body
    cacheable: bool = False
    taken_wall: float | None = None  # when the data was read (Last-Modified)
    age: float | None = None  # seconds since then
    stale: str | None = None  # why the data is older than CACHE_SECONDS


def _text(code: int, message: str) -> Answer:
    return Answer(code, "text/plain", message.encode("utf8"))


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 413: "Request Header Fields Too Large",
            414: "URI Too Long", 500: "Internal Server Error", 503: "Service Unavailable"}


def _raw_answer(code: int, message: str) -> bytes:
    """A whole HTTP answer, written straight to a transport (the connection then closes)."""
    body = message.encode("utf8")
    return (f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("ascii") + body


# -- connections ------------------------------------------------------------------------------

class _Connection(web.RequestHandler):
    """aiohttp's per-connection protocol, registered with `_Connections` for its limits.

    The hooks are the asyncio protocol methods (`connection_made`, `data_received`,
    `connection_lost`), which aiohttp's handler implements and calls through `super()`."""

    def __init__(self, manager: web.Server, limits: "_Connections", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.limits = limits
        self.peer: asyncio.Transport | None = None
        self.answering = False  # a handler is producing an answer
        self.head_bytes = 0  # received since connecting or since the last answer
        self.line_seen = False  # the request line is complete (a longer head: 413, not 414)
        self.deadline = 0.0  # loop time: head complete (idle) or answer sent (answering)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peer = transport  # type: ignore[assignment]
        self.limits.add(self)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            return  # refused or closed by the limits: nothing more is read
        if not self.answering:
            self.head_bytes += len(data)
            if self.head_bytes > self.limits.max_header_size:
                self.line_seen = self.line_seen or b"\n" in data[:-(self.head_bytes
                                                                    - self.limits.max_header_size)]
                self.limits.refuse(self, 413 if self.line_seen else 414,
                                   "Request head too large\n")
                return
            self.line_seen = self.line_seen or b"\n" in data
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.limits.remove(self)
        self.peer = None
        super().connection_lost(exc)


class _Connections:
    """Every open connection, oldest first, and the limits on them (event loop only)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settings: WebSettings,
                 cap: int) -> None:
        self.loop = loop
        self.timeout = float(settings.timeout)
        self.send_timeout = float(settings.send_timeout)
        self.max_header_size = settings.max_header_size
        self.cap = cap
        self.open: OrderedDict[_Connection, None] = OrderedDict()
        self.evicted = 0

    def add(self, conn: _Connection) -> None:
        conn.deadline = self.loop.time() + self.timeout
        self.open[conn] = None
        if len(self.open) <= self.cap:
            return
        # Over the cap: the oldest connection that is not being answered goes (idle,
        # silent or half-sent), so a flood pushes out its own first connections.
        victim = next((c for c in self.open if not c.answering), conn)
        self.evicted += 1
        self.close(victim)

    def remove(self, conn: _Connection) -> None:
        self.open.pop(conn, None)

    def begin_answer(self, conn: _Connection) -> None:
        conn.answering = True
        conn.deadline = self.loop.time() + self.send_timeout

    def end_answer(self, conn: _Connection) -> None:
        conn.answering = False
        conn.head_bytes = 0
        conn.line_seen = False
        conn.deadline = self.loop.time() + self.timeout

    def close(self, conn: _Connection) -> None:
        self.open.pop(conn, None)
        if conn.peer is not None:
            conn.peer.abort()

    def refuse(self, conn: _Connection, code: int, message: str) -> None:
        """Answer `code` and close (the request is not handed to aiohttp)."""
        self.open.pop(conn, None)
        peer, conn.peer = conn.peer, None
        if peer is not None and not peer.is_closing():
            peer.write(_raw_answer(code, message))
            peer.close()

    def sweep(self) -> None:
        now = self.loop.time()
        late = [c for c in self.open if c.deadline <= now]
        for conn in late:
            if conn.answering:
                log.debug("HTTP server: an answer took over %ss to send; cut off",
                          self.send_timeout)
                self.close(conn)
            elif conn.head_bytes:
                self.refuse(conn, 408, "Request not complete in time\n")
            else:
                self.close(conn)  # idle or silent: nothing to answer

    def close_all(self) -> None:
        for conn in list(self.open):
            self.close(conn)


def connection_cap(wanted: int) -> int:
    """`wanted`, but at most half the process's open-file limit (the launcher needs the
    rest for ZooKeeper, Kubernetes and its logs)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // 2))


class _CpuBudget:
    """A leaky bucket of CPU seconds (event loop only): `spend` says how long to pause."""

    def __init__(self, share: float, burst: float) -> None:
        self.share = share
        self.burst = burst
        self.debt = 0.0
        self._at = time.monotonic()

    def spend(self, seconds: float) -> float:
        now = time.monotonic()
        self.debt = max(0.0, self.debt - (now - self._at) * self.share) + seconds
        self._at = now
        return max(0.0, (self.debt - self.burst) / self.share)


# -- reading the source -----------------------------------------------------------------------

@dataclass
class _Slot:
    """One kind of data (the snapshot, the event log) as the loop knows it."""

    value: Any = None  # Snapshot | EventsSnapshot | None
    error: tuple[int, str] | None = None  # the last reading's failure (code, message)
    attempted: float | None = None  # monotonic (the app's clock): the last reading began
    pending: "asyncio.Future[None] | None" = None


class _Refresher:
    """Reads the source on its own thread, one kind at a time, as the loop asks."""

    def __init__(self, read: Mapping[str, Callable[[], Any]],
                 publish: Callable[[str, Any, BaseException | None, float], None]) -> None:
        self._read = read
        self._publish = publish
        self._wanted: list[str] = []
        self._cond = threading.Condition()
        self._stopped = False
        self.thread = threading.Thread(target=self._run, name="webapp-refresh", daemon=True)

    def want(self, kind: str) -> None:
        with self._cond:
            if kind not in self._wanted:
                self._wanted.append(kind)
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                kind = self._wanted.pop(0)
            started = time.thread_time()
            try:
                value = self._read[kind]()
            except BaseException as exc:  # noqa: BLE001 - reported to the loop, judged there
                self._publish(kind, None, exc, time.thread_time() - started)
            else:
                self._publish(kind, value, None, time.thread_time() - started)


# -- the app ----------------------------------------------------------------------------------

class WebApp:
    """Serve `source` on (address, port); port 0 picks a free one (see `.port`)."""

    def __init__(self, source: StatusSource, port: int = 8005,
                 listen_address: str = "127.0.0.1", clock: Clock = SYSTEM_CLOCK,
                 settings: WebSettings = WebSettings()) -> None:
        self.source = source
        self.clock = clock
        self.settings = settings
        self.listen_address = listen_address
        self._port = port
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._render = ThreadPoolExecutor(1, thread_name_prefix="webapp-render")
        self._slots = {"snapshot": _Slot(), "events": _Slot()}
        self._refresher = _Refresher(
            {"snapshot": self._read_snapshot, "events": self._read_events}, self._published)
        self.connections: _Connections | None = None
        self._budget = _CpuBudget(CPU_SHARE, CPU_BURST)
        self.readings = 0  # completed readings of the source (snapshots and event logs)
        self.reading_cpu = 0.0  # CPU seconds the readings took (refresh thread)

    @property
    def port(self) -> int:
        assert self._sock is not None, "start() first"
        return int(self._sock.getsockname()[1])

    @property
    def bind_addr(self) -> tuple[str, int]:
        assert self._sock is not None, "start() first"
        return str(self._sock.getsockname()[0]), self.port

    def start(self) -> "WebApp":
        """Bind now (errors such as a port in use reach the caller), then serve."""
        family, kind, proto, _, address = socket.getaddrinfo(
            self.listen_address, self._port, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._refresher.thread.start()
        self._thread = threading.Thread(target=self._serve, name="webapp", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._start_error is not None:
            raise self._start_error
        log.info("Web app listening on %s port %s", self.bind_addr[0], self.port)
        return self

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:
                pass  # the loop has ended already
        if self._thread is not None:
            self._thread.join(5)
        self._refresher.stop()
        self._render.shutdown(wait=False, cancel_futures=True)
        if self._sock is not None:
            self._sock.close()

    # -- the loop thread --------------------------------------------------------------------
    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        loop.set_default_executor(self._render)  # no thread pool grows behind our back
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._started.is_set():
                self._start_error = exc
            else:
                log.exception("The web app's event loop ended")
        finally:
            self._started.set()
            loop.close()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        cap = connection_cap(self.settings.max_connections)
        if cap < self.settings.max_connections:
            log.warning("Web app: serving at most %d connections (half the open-file limit), "
                        "not %d", cap, self.settings.max_connections)
        self.connections = limits = _Connections(loop, self.settings, cap)
        # aiohttp's own limits backstop ours: lines and fields no longer than the whole
        # head may be, its idle timer later than our sweep closes idle connections.
        # A request body is never read: lingering_time 0 closes a connection whose body
        # has not all arrived after its answer, instead of reading the rest.
        options: dict[str, Any] = dict(
            access_log=None, max_line_size=self.settings.max_header_size + 1,
            max_field_size=self.settings.max_header_size + 1,
            keepalive_timeout=2 * self.settings.timeout + 1, lingering_time=0)
        server = web.Server(self._handle, **options)
        assert self._sock is not None
        listener = await loop.create_server(
            lambda: _Connection(server, limits, loop=loop, **options),
            sock=self._sock, backlog=BACKLOG)
        self._started.set()
        period = min(SWEEP_SECONDS, self.settings.timeout / 4)
        try:
            while not self._stopping.is_set():
                try:
                    await asyncio.wait_for(self._stopping.wait(), period)
                except asyncio.TimeoutError:
                    pass
                limits.sweep()
        finally:
            listener.close()
            limits.close_all()
            for slot in self._slots.values():
                if slot.pending is not None and not slot.pending.done():
                    slot.pending.set_result(None)
            await asyncio.sleep(0)
            # Handlers of aborted connections end at their next write; anything left is
            # cancelled so the loop closes without pending tasks.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

    # -- reading (refresh thread) -----------------------------------------------------------
    def _read_snapshot(self) -> Snapshot:
        return status_snapshot.build_snapshot(self.source, self.clock.monotonic(),
                                              self.clock.time())

    def _read_events(self) -> EventsSnapshot:
        return status_snapshot.build_event_log(getattr(self.source, "events", None),
                                               self.clock.monotonic(), self.clock.time())

    def _published(self, kind: str, value: Any, error: BaseException | None,
                   cpu: float) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._store, kind, value, error, cpu)
        except RuntimeError:
            pass  # stopped meanwhile

    def _store(self, kind: str, value: Any, error: BaseException | None,
               cpu: float = 0.0) -> None:
        self.reading_cpu += cpu
        slot = self._slots[kind]
        if error is None:
            slot.value, slot.error = value, None
            self.readings += 1
        elif isinstance(error, TemporaryError):
            log.warning("Web app: reading the %s failed: %s", kind, error)
            slot.error = (503, f"Status unavailable: {error}\n")
        else:
            log.error("Web app: reading the %s failed", kind, exc_info=error)
            slot.error = (500, "Internal error\n")
        pending, slot.pending = slot.pending, None
        if pending is not None and not pending.done():
            pending.set_result(None)

    # -- reading (event loop) ---------------------------------------------------------------
    async def _fresh(self, kind: str) -> tuple[Any, Answer | None]:
        """The newest `kind` and, when it cannot be served, the answer instead."""
        slot = self._slots[kind]
        now = self.clock.monotonic()
        if slot.value is not None and now - slot.value.taken < CACHE_SECONDS:
            return slot.value, None
        if slot.pending is None and (slot.attempted is None or slot.error is None
                                     or now - slot.attempted >= CACHE_SECONDS):
            # A failed reading is not retried within CACHE_SECONDS: a client cannot turn
            # its requests into ZooKeeper reads.
            slot.attempted = now
            slot.pending = asyncio.get_running_loop().create_future()
            self._refresher.want(kind)
        if slot.pending is not None:
            try:
                await asyncio.wait_for(asyncio.shield(slot.pending), REFRESH_WAIT)
            except asyncio.TimeoutError:
                pass
        value = slot.value
        now = self.clock.monotonic()
        if value is not None and now - value.taken <= MAX_STALE:
            return value, None
        if slot.error is not None:
            code, reason = slot.error
        elif value is None:
            code, reason = 503, "Status unavailable: the status has not been read yet\n"
        else:
            code, reason = 503, "Status unavailable: ZooKeeper has not answered\n"
        if value is not None:
            reason = reason.rstrip("\n") + f" (last read {now - value.taken:.0f}s ago)\n"
        return None, _text(code, reason)

    def _staleness(self, kind: str, taken: float) -> tuple[float, str | None]:
        slot = self._slots[kind]
        age = max(0.0, self.clock.monotonic() - taken)
        if age < CACHE_SECONDS:
            return age, None
        if slot.error is not None:
            return age, slot.error[1].strip()
        return age, "the status is being read again"

    async def _off_loop(self, ready: bool, work: Callable[[], Any]) -> None:
        """Run `work` (pure CPU over a snapshot) on the render thread unless done already."""
        if not ready:
            await asyncio.get_running_loop().run_in_executor(self._render, work)

    # -- HTTP --------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = request.protocol if isinstance(request.protocol, _Connection) else None
        limits = self.connections
        if conn is not None and limits is not None:
            limits.begin_answer(conn)
        try:
            answer = await self._answer(request)
            return await self._send(request, answer)
        finally:
            if conn is not None and limits is not None:
                limits.end_answer(conn)

    async def _answer(self, request: web.BaseRequest) -> Answer:
        if request.method not in ("GET", "HEAD"):
            return _text(405, "Method not allowed\n")
        path = request.path or "/"
        want_json = "application/json" in request.headers.get("Accept", "")
        query = request.query_string
        try:
            if path == "/ready":
                _params(query, ())
                return _text(200, "OK") if self.source.ready() else \
                    _text(503, "Launcher not ready")
            if path == "/metrics":
                _params(query, ())
                return await self._metrics()
            route = _ROUTES.get(path)
            if route is None and path.startswith(NODE_PREFIX):
                route = _NODE_ROUTE
            if route is None:
                return _text(404, "Not found\n")
            params = _params(query, route[0])
            if route is _NODE_ROUTE:
                params = (("node_id", _node_id_of(path)),) + params
            answer: Answer = await route[1](self, params, want_json)
            answer.cacheable = True
            return answer
        except BadRequest as exc:
            return _text(400, f"Bad request: {exc}\n")
        except Exception:  # the status page must outlive a bad read
            log.exception("Web request %s failed", path)
            return _text(500, "Internal error\n")

    async def _send(self, request: web.BaseRequest, answer: Answer) -> web.StreamResponse:
        headers = {"Content-Type": answer.ctype, "Server": "nodepool-k8s"}
        if self.settings.allow_origin:
            headers["Access-Control-Allow-Origin"] = self.settings.allow_origin
        now = self.clock.time()
        if answer.cacheable and answer.code == 200 and answer.stale is None:
            modified = answer.taken_wall if answer.taken_wall is not None else now
            headers.update({
                "Cache-Control": f"public, max-age={int(CACHE_SECONDS)}",
                "Last-Modified": email.utils.formatdate(modified, usegmt=True),
                "Expires": email.utils.formatdate(now + CACHE_SECONDS, usegmt=True)})
        else:
            headers["Cache-Control"] = "no-cache"
        if answer.age is not None:
            headers["X-Status-Age"] = f"{answer.age:.1f}"
        if answer.stale is not None:
            headers["X-Status-Stale"] = _header_safe(answer.stale)
        response = web.StreamResponse(status=answer.code,
                                      reason=_REASONS.get(answer.code, "Error"),
                                      headers=headers)
        body = answer.body
        try:
            if isinstance(body, bytes):
                response.content_length = len(body)
                await response.prepare(request)
                if request.method != "HEAD":
                    await response.write(body)
            else:
                await response.prepare(request)
                if request.method != "HEAD":
                    chunks = iter(body)
                    while True:
                        started = time.thread_time()
                        chunk = next(chunks, None)
                        if chunk is None:
                            break
                        await response.write(chunk)
                        # Others get their turn between chunks; past the CPU share, later.
                        await asyncio.sleep(self._budget.spend(time.thread_time() - started))
            await response.write_eof()
        except ConnectionError as exc:
            # The client went away or was cut off (send_timeout): not our error.
            log.debug("HTTP server: %s: %s", request.path, exc)
        return response

    # -- endpoints ---------------------------------------------------------------------------
    async def _snapshot(self) -> tuple[Snapshot | None, Answer | None]:
        return await self._fresh("snapshot")

    def _data(self, kind: str, taken: float, taken_wall: float, ctype: str,
              body: Body) -> Answer:
        age, stale = self._staleness(kind, taken)
        return Answer(200, ctype, body, taken_wall=taken_wall, age=age, stale=stale)

    async def _metrics(self) -> Answer:
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        await self._off_loop(snap.metrics_ready, snap.metrics)
        answer = self._data("snapshot", snap.taken, snap.taken_wall,
                            "text/plain; version=0.0.4; charset=utf-8",
                            [snap.metrics(), _age_family(snap.taken, self.clock.monotonic()),
                             _live_families(self.source)])
        answer.cacheable = False
        return answer

    async def _listing(self, kind: str, taken: float, taken_wall: float, listing: Listing,
                       columns: status_snapshot.Columns, fields: tuple[str, ...] | None,
                       picked: Sequence[int] | None, want_json: bool) -> Answer:
        if want_json:
            await self._off_loop(listing.json_ready, listing.prepare_json)
            return self._data(kind, taken, taken_wall, "application/json",
                              listing.json_chunks(picked))
        cols = status.select_columns(columns, fields)
        await self._off_loop(listing.columns_ready(cols),
                             lambda: listing.prepare_columns(cols))
        return self._data(kind, taken, taken_wall, "text/plain",
                          listing.table_chunks(cols, picked))

    async def _node_list(self, params: Params, want_json: bool) -> Answer:
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        values = dict(params)
        node_id, fields = values.get("node_id"), values.get("fields")
        picked: list[int] | None = None
        if node_id is not None:
            found = snap.node_positions.get(node_id)
            picked = [] if found is None else [found]
        return await self._listing("snapshot", snap.taken, snap.taken_wall, snap.nodes,
                                   status.NODE_DETAIL_COLUMNS if fields
                                   else status.NODE_COLUMNS, fields, picked, want_json)

    async def _request_list(self, params: Params, want_json: bool) -> Answer:
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        fields = dict(params).get("fields")
        # `fields` may name the detail columns (Declined Reasons, Waiting), as for nodes.
        return await self._listing("snapshot", snap.taken, snap.taken_wall, snap.requests,
                                   status.REQUEST_DETAIL_COLUMNS if fields
                                   else status.REQUEST_COLUMNS, fields, None, want_json)

    async def _label_list(self, params: Params, want_json: bool) -> Answer:
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        return await self._listing("snapshot", snap.taken, snap.taken_wall, snap.labels,
                                   status.LABEL_COLUMNS, dict(params).get("fields"), None,
                                   want_json)

    async def _pool_list(self, params: Params, want_json: bool) -> Answer:
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        return await self._listing("snapshot", snap.taken, snap.taken_wall, snap.pools,
                                   pools.POOL_STATUS_COLUMNS, dict(params).get("fields"),
                                   None, want_json)

    async def _index(self, params: Params, want_json: bool) -> Answer:
        return Answer(200, "text/html; charset=utf-8", _PAGE)

    async def _node(self, params: Params, want_json: bool) -> Answer:
        """`/node/<id>`: one node's record, conditions, timings and failure reason."""
        snap, failed = await self._snapshot()
        if snap is None:
            assert failed is not None
            return failed
        node_id = dict(params)["node_id"]
        view = snap.views.get(node_id)
        if view is None:
            return _text(404, f"Node {node_id} not found\n")
        detail = node_detail.node_detail(view, self.clock.time(), snap.hashes)
        if want_json:
            body = status.render_json_document(detail)
            return self._data("snapshot", snap.taken, snap.taken_wall, "application/json",
                              body.encode("utf8"))
        return self._data("snapshot", snap.taken, snap.taken_wall, "text/plain",
                          (node_detail.render_node_detail(detail) + "\n").encode("utf8"))

    async def _events(self, params: Params, want_json: bool) -> Answer:
        """`/events`: the installation's event log, newest last."""
        events, failed = await self._fresh("events")
        if events is None:
            assert failed is not None
            return failed
        values = dict(params)
        picked = status_snapshot.select_events(
            events, values.get("provider"), values.get("pool"), values.get("node_id"),
            values.get("since"), self.clock.time())
        return await self._listing("events", events.taken, events.taken_wall, events.listing,
                                   node_detail.EVENT_COLUMNS, values.get("fields"), picked,
                                   want_json)


_PAGE = status_page.PAGE.encode("utf8")


def _age_family(taken: float, now: float) -> bytes:
    """The data's age as a gauge: appended per request to the memoized metrics text."""
    return ("# HELP nodepool_status_age_seconds Seconds since the launcher's status shown "
            "here was read from ZooKeeper.\n"
            "# TYPE nodepool_status_age_seconds gauge\n"
            f"nodepool_status_age_seconds {max(0.0, now - taken):.3f}\n").encode("ascii")


def _live_families(source: StatusSource) -> bytes:
    """The ZooKeeper connection state as it is now, appended per request: the snapshot is
    read from ZooKeeper, so while the connection is down it is the state from before."""
    read_gauges = getattr(source, "gauges", None)
    gauges = read_gauges() if callable(read_gauges) else {}
    lines = [(dict(labels).get("state", ""), value)
             for (name, labels), value in gauges.items() if name == stats.PROM_ZK_STATE]
    if not lines:
        return b""
    family = stats.PROM_ZK_STATE
    text = [f"# HELP {family} {stats.HELP[family]}", f"# TYPE {family} gauge"]
    text += [f'{family}{{state="{state}"}} {value}' for state, value in sorted(lines)]
    return ("\n".join(text) + "\n").encode("ascii", "replace")


def _header_safe(text: str) -> str:
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)[:200]


NODE_PREFIX = "/node/"


def _node_id_of(path: str) -> str:
    node_id = path[len(NODE_PREFIX):]
    if not node_id.isdigit() or not node_id.isascii() or len(node_id) > 20:
        raise BadRequest("/node/<id> takes a node id (digits)")
    return node_id.zfill(NODE_ID_DIGITS)


def _params(query: str, allowed: Sequence[str]) -> Params:
    """The query's known parameters, normalised (sorted, fields split and de-duplicated);
    BadRequest for anything unknown, repeated, too long or too many."""
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


_Handler = Callable[[WebApp, Params, bool], Any]
_Route = tuple[tuple[str, ...], _Handler]
_ROUTES: dict[str, _Route] = {
    "/node-list": (("node_id", "fields"), WebApp._node_list),
    "/request-list": (("fields",), WebApp._request_list),
    "/label-list": (("fields",), WebApp._label_list),
    "/events": (("provider", "pool", "node_id", "since", "fields"), WebApp._events),
    "/pool-list": (("fields",), WebApp._pool_list),
    "/": ((), WebApp._index),
}
_NODE_ROUTE: _Route = ((), WebApp._node)
