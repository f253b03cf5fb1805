"""Per-request deadlines for the web app's cheroot connections, in one version-checked module.

Owns: `DeadlineConnection`, the `ConnectionClass` the web app's server uses, and `check()`.

cheroot gives each socket operation `timeout` seconds, never a request as a whole: a client
that sent one byte of its request head just inside each timeout kept its worker until the
head reached `max-header-size` (16 KiB × 10 s: 45 hours), and a few such clients held every
worker, `/ready` included. Here each request has two deadlines, counted on the monotonic
clock:

- receiving: the request line, the headers and a body (cheroot reads a small body before it
  answers) must all have arrived within `receive` seconds of the worker taking the
  connection (which it does once the request's first bytes are there);
- sending: the whole answer must have been handed to the kernel within `send` seconds of
  its first write (a client that reads it too slowly is cut off).

Before every `recv` and `send` the socket timeout is set to what is left (at most the
server's per-operation `timeout`, as before; once a deadline has passed, one millisecond,
so data already there is still taken). Running out raises the same `socket.timeout` that
cheroot's own per-operation timeout raises, so cheroot handles it as it always did: `408`
if a request had started and no answer has begun, then the connection is closed. Idle
keep-alive and silent connections are not in a request (they wait in cheroot's selector)
and keep the per-operation `timeout`.

How: `DeadlineConnection` builds the connection's reader and writer itself, as cheroot's
`makefile.MakeFile` does (`StreamReader`/`StreamWriter` over a `socket.SocketIO`), but with a
`SocketIO` that sets the timeout first; its `communicate` (one request) starts and ends the
deadlines. That relies on cheroot internals: `HTTPConnection(server, sock, makefile)`, the
reader/writer classes and what their constructors set, `HTTPServer.ConnectionClass`, and
(for the web app's parking of silent connections) a prepared server's `_connections.put`,
checked by `check_prepared`.
The module was written for cheroot 11.1 within the range setup.cfg pins (`SUPPORTED`).
`check()` runs once per process when a web app is created: it checks the installed version
and runs a self-test on a socket pair (the reader and writer have the attributes cheroot's
own have, a request line is read through the new reader, an
expired deadline raises `socket.timeout`, a write arrives). On any finding it raises
`CherootIncompatible` naming the installed cheroot version, so the launcher does not start
rather than serve without the limits. TLS (cheroot's `ssl_adapter`, which brings its own
reader and writer) is not supported: such a connection raises at once.
"""

from __future__ import annotations

import inspect
import math
import socket
import threading
import time
from typing import Any, Callable

import cheroot
from cheroot import makefile, server

from nodepool_k8s.exceptions import PermanentError

# The cheroot versions this module was written and tested for: [low, high).
SUPPORTED = ((10,), (12,))
# Once a deadline has passed, a read or write may still take what is already there.
_GRACE = 0.001


class CherootIncompatible(PermanentError):
    """The installed cheroot is not one this module's internals were written for."""


def installed_version() -> str:
    return str(cheroot.__version__)


class _Deadlines:
    """One connection's deadlines for the request being served (monotonic seconds)."""

    def __init__(self, sock: socket.socket, per_operation: float, receive: float,
                 send: float) -> None:
        self._sock = sock
        self._per_operation = per_operation
        self._receive = receive
        self._send = send
        self.receive_by = math.inf  # no request: cheroot's per-operation timeout only
        self.send_by: float | None = math.inf

    def begin(self) -> None:
        self.receive_by = time.monotonic() + self._receive
        self.send_by = None  # counted from the answer's first write

    def end(self) -> None:
        self.receive_by = self.send_by = math.inf

    def before_read(self) -> None:
        self._arm(self.receive_by)

    def before_write(self) -> None:
        if self.send_by is None:
            self.send_by = time.monotonic() + self._send
        self._arm(self.send_by)

    def _arm(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        self._sock.settimeout(min(self._per_operation, max(left, _GRACE)))


class _SocketIO(socket.SocketIO):
    """`socket.SocketIO` that calls `before` ahead of every `recv` and `send`."""

    def __init__(self, sock: socket.socket, mode: str, before: Callable[[], None]) -> None:
        super().__init__(sock, mode)  # type: ignore[arg-type]
        self._before = before

    def readinto(self, b: Any) -> int | None:
        self._before()
        return super().readinto(b)

    def write(self, b: Any) -> int | None:
        self._before()
        return super().write(b)


class _Reader(makefile.StreamReader):
    def __init__(self, sock: socket.socket, bufsize: int, before: Callable[[], None]) -> None:
        # What StreamReader.__init__ does, with our SocketIO (check() verifies the result).
        super(makefile.StreamReader, self).__init__(_SocketIO(sock, "rb", before), bufsize)
        self.bytes_read = 0


class _Writer(makefile.StreamWriter):
    def __init__(self, sock: socket.socket, bufsize: int, before: Callable[[], None]) -> None:
        super(makefile.StreamWriter, self).__init__(_SocketIO(sock, "wb", before), bufsize)
        self.bytes_written = 0


class DeadlineConnection(server.HTTPConnection):
    """cheroot's connection, each request within the server's `receive_timeout` and
    `send_timeout` (attributes the web app's server sets; see the module docstring)."""

    def __init__(self, srv: Any, sock: socket.socket,
                 makefile_: Callable[..., Any] = makefile.MakeFile) -> None:
        if makefile_ is not makefile.MakeFile:
            raise CherootIncompatible("the web app's deadlines do not support TLS connections")
        self._deadlines = _Deadlines(sock, float(srv.timeout), float(srv.receive_timeout),
                                     float(srv.send_timeout))
        super().__init__(srv, sock, self._make_file)

    def _make_file(self, sock: socket.socket, mode: str, bufsize: int) -> Any:
        if "r" in mode:
            return _Reader(sock, bufsize, self._deadlines.before_read)
        return _Writer(sock, bufsize, self._deadlines.before_write)

    def communicate(self) -> bool:
        self._deadlines.begin()
        try:
            return bool(super().communicate())  # type: ignore[no-untyped-call]
        finally:
            self._deadlines.end()


# -- the self-test ------------------------------------------------------------------------

_checked = threading.Lock()
_result: list[str] = []


def _version_ok() -> bool:
    parts: list[int] = []
    for part in installed_version().split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return SUPPORTED[0] <= tuple(parts) < SUPPORTED[1]


def problems() -> list[str]:
    """What in the installed cheroot differs from what this module relies on."""
    found: list[str] = []
    if not _version_ok():
        found.append("version outside the supported range")
    try:
        params = list(inspect.signature(server.HTTPConnection.__init__).parameters)
        if params != ["self", "server", "sock", "makefile"]:
            found.append(f"HTTPConnection.__init__ takes {params}")
        if getattr(server.HTTPServer, "ConnectionClass", None) is not server.HTTPConnection:
            found.append("HTTPServer.ConnectionClass is not HTTPConnection")
    except (TypeError, ValueError) as exc:
        found.append(f"cannot inspect cheroot: {exc}")
    if not found:
        found += _socket_test()
    return found


def _socket_test() -> list[str]:
    a, b = socket.socketpair()
    fake = type("Server", (), {"timeout": 5, "receive_timeout": 5, "send_timeout": 5,
                               "peercreds_enabled": False,
                               "peercreds_resolve_enabled": False})()
    conn: DeadlineConnection | None = None
    try:
        conn = DeadlineConnection(fake, a)
        if not isinstance(conn.rfile.raw, _SocketIO) or not isinstance(conn.wfile.raw, _SocketIO):
            return ["HTTPConnection does not take its reader and writer from `makefile`"]
        # _Reader and _Writer repeat what cheroot's constructors do: same attributes.
        for ours, theirs in ((conn.rfile, makefile.MakeFile(a, "rb", 64)),
                             (conn.wfile, makefile.MakeFile(a, "wb", 64))):
            differ = set(vars(ours)) ^ set(vars(theirs))
            theirs.close()
            if differ or type(ours).__mro__[1:] != type(theirs).__mro__:
                return [f"{type(theirs).__name__} is not what _Reader/_Writer repeat "
                        f"(attributes {sorted(differ)})"]
        deadlines = conn._deadlines
        deadlines.begin()
        b.sendall(b"GET / HTTP/1.1\r\n")
        if conn.rfile.readline() != b"GET / HTTP/1.1\r\n" or conn.rfile.has_data():
            return ["the reader does not read a request line"]
        deadlines.receive_by = time.monotonic() - 1
        try:
            conn.rfile.read(1)
            return ["a read past its deadline did not time out"]
        except socket.timeout:
            pass
        conn.wfile.write(b"HTTP/1.1 200 OK\r\n")
        b.settimeout(5)
        if b.recv(100) != b"HTTP/1.1 200 OK\r\n" or conn.wfile.bytes_written != 17:
            return ["the writer does not write"]
        deadlines.end()
        return []
    except Exception as exc:  # noqa: BLE001 - any failure is a finding
        return [f"the self-test failed: {type(exc).__name__}: {exc}"]
    finally:
        if conn is not None:
            conn.rfile.close()
            conn.wfile.close()
        a.close()
        b.close()


def check_prepared(srv: Any) -> None:
    """After `HTTPServer.prepare`: the connection manager the web app parks silent
    connections with (`_connections`, with `put`) is there; CherootIncompatible if not."""
    manager = getattr(srv, "_connections", None)
    if not callable(getattr(manager, "put", None)):
        raise CherootIncompatible(
            f"cheroot {installed_version()} is not supported by nodepool_k8s._cheroot_ext: "
            "a prepared server has no connection manager (`_connections.put`)")


def check() -> None:
    """Run the self-test once per process; CherootIncompatible on any finding."""
    with _checked:
        if not _result:
            _result.append("; ".join(problems()))
        message = _result[0]
    if message:
        raise CherootIncompatible(
            f"cheroot {installed_version()} is not supported by nodepool_k8s._cheroot_ext "
            f"(written for >={'.'.join(map(str, SUPPORTED[0]))},"
            f"<{'.'.join(map(str, SUPPORTED[1]))}): {message}")
