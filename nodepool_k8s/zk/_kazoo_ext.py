"""Every use of kazoo's private or undocumented internals, in one version-checked module.

Owns: what kazoo 2.11's public API does not offer and nodepool_k8s needs:

- `send_request(client, request)`: queue a request object on the connection
  (`KazooClient._call`), used for ZooKeeper's multiRead (opcode 22), which kazoo lacks;
- `MultiRead`: the wire encoding of a multiRead and its response, built from kazoo's
  serialization records (`kazoo.protocol.serialization`: GetData, GetChildren, MultiHeader
  and the struct helpers);
- `chroot_prefix(client)` and `full_path(chroot, path)`: kazoo's chroot path prefixing
  (`kazoo.protocol.paths._prefix_root`);
- `add_create(tx, ...)`: a create in a `TransactionRequest` that keeps a trailing "/" for
  sequential creates (appends to `TransactionRequest.operations`, since
  `TransactionRequest.create` normalises the slash away);
- `PollThreadingHandler`: kazoo's threading handler whose `select` waits with one `poll()`
  instead of creating an epoll object per wait (see `poll_select`);
- `FastIO`: the connection thread's reads and writes grouped (several replies handled per
  socket read, several queued requests written with one send), by replacing the
  connection's `_read_socket`, `_read_header` and `_send_request` on the instance and using
  its `_read`, `_write`, `_socket`, `_read_sock`, `_xid` and the client's `_queue` and
  `_pending` as kazoo's own versions do;
- `RecursiveWatches`: ZooKeeper's persistent recursive watches (`addWatch`, opcode 106, 3.6+),
  which kazoo 2.11 lacks: the request's encoding, and the delivery of their events, by
  wrapping the connection's `_read_watch_event` (kazoo hands an event only to its one-shot
  watchers and drops the rest).

Nothing else in the package touches these (import-linter forbids importing the internal
kazoo modules elsewhere). The module was written for kazoo `SUPPORTED` (>= 2.10, < 2.12,
the range setup.cfg pins). `check()` runs once per process from `ZkClient.start`: it
asserts the installed version is in that range and runs a cheap self-test of each internal
used (attributes exist, opcodes and encodings are what this module expects, the poll
handler's `select` answers like kazoo's own on a socket pair). On failure it raises
`KazooIncompatible` naming the installed kazoo version, and the daemon stops with that
message instead of misbehaving later.
"""

from __future__ import annotations

import logging
import math
import select
import socket
import struct
import threading
import weakref
from collections import namedtuple
from typing import Any, Callable

import kazoo.version
from kazoo.client import KazooClient, TransactionRequest
from kazoo.exceptions import EXCEPTIONS, ConnectionDropped
from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import fileobj_to_fd
from kazoo.protocol import connection as kazoo_connection
from kazoo.protocol.paths import _prefix_root
from kazoo.protocol.serialization import (Auth, Close, Create, GetChildren, GetData,
                                          ReplyHeader, Watch, int_struct,
                                          multiheader_struct, read_string,
                                          stat_struct, write_string)
from kazoo.protocol.states import EVENT_TYPE_MAP, EventType, ZnodeStat

from nodepool_k8s.core.errors import PermanentError

log = logging.getLogger("nodepool_k8s.zk")

# The kazoo versions this module was written and tested for: [low, high).
SUPPORTED = ((2, 10), (2, 12))
MULTI_READ = 22  # ZooKeeper's OpCode.multiRead (3.6+)
ADD_WATCH = 106  # ZooKeeper's OpCode.addWatch (3.6+)
PERSISTENT_RECURSIVE = 1  # AddWatchMode.PERSISTENT_RECURSIVE


class KazooIncompatible(PermanentError):
    """The installed kazoo is not one this module's internals were written for."""


def installed_version() -> str:
    return str(kazoo.version.__version__)


def _parse(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in version.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


# -- multiRead ----------------------------------------------------------------------------

ReadResult = Any  # (bytes, ZnodeStat) for a get, list[str] for children, an exception


class MultiRead(namedtuple("MultiRead", "operations")):
    """A multiRead request; `operations` are `(opcode, chrooted path)` pairs made by
    `get_data` and `get_children` (kazoo's request records cost more to build and encode
    than the rest of a 10,000-node listing's reading)."""

    type = MULTI_READ

    def serialize(self) -> bytearray:
        # Each operation: its multi header, the path as a ZooKeeper string, no watch.
        pack = _MULTI_OP.pack
        parts: list[bytes] = []
        for opcode, path in self.operations:
            encoded = path.encode("utf8")
            parts.append(pack(opcode, False, -1, len(encoded)))
            parts.append(encoded)
            parts.append(b"\x00")
        parts.append(multiheader_struct.pack(-1, True, -1))
        return bytearray(b"".join(parts))

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[ReadResult]:
        """Per operation: (data, ZnodeStat), a list of children, or the error's exception
        instance (kazoo's, e.g. NoNodeError())."""
        results: list[ReadResult] = []
        head, head_size = multiheader_struct.unpack_from, multiheader_struct.size
        stat, stat_size, make_stat = stat_struct.unpack_from, stat_struct.size, ZnodeStat._make
        number = int_struct.unpack_from
        while True:
            op_type, done, _ = head(data, offset)
            offset += head_size
            if done:
                return results
            length = number(data, offset)[0]
            offset += 4
            if op_type == GET_DATA:
                if length < 0:
                    value = b""
                else:
                    value = data[offset:offset + length]
                    offset += length
                results.append((value, make_stat(stat(data, offset))))
                offset += stat_size
            elif op_type == GET_CHILDREN:
                children = []
                for _ in range(max(length, 0)):
                    child, offset = read_string(data, offset)
                    children.append(child)
                results.append(children)
            else:  # error result for this operation: `length` is its code
                results.append(EXCEPTIONS[length]())


GET_DATA, GET_CHILDREN = GetData.type, GetChildren.type
# An operation of a multiRead request: its multi header (type, done, error) and its
# path's length.
_MULTI_OP = struct.Struct("!i?ii")


def get_data(path: str) -> tuple[int, str]:
    """A getData operation of a multiRead (no watch); `path` with its chroot."""
    return (GET_DATA, path)


def get_children(path: str) -> tuple[int, str]:
    """A getChildren operation of a multiRead (no watch); `path` with its chroot."""
    return (GET_CHILDREN, path)


def send_request(client: KazooClient, request: Any) -> Any:
    """Queue `request` on the connection; its kazoo AsyncResult."""
    async_result = client.handler.async_result()
    client._call(request, async_result)
    return async_result


# -- persistent recursive watches --------------------------------------------------------

# The events a persistent recursive watch delivers (no child events: the tree has them).
_TREE_EVENTS = {code: EVENT_TYPE_MAP[code] for code in (1, 2, 3)}

TreeListener = Callable[[str, str], None]
"""`listener(event_type, path)`: an EventType value (CREATED, DELETED, CHANGED) and the
znode's path without the chroot. Called on kazoo's connection thread, in the server's
order: it must only hand the event on (put it on a queue) and must not raise."""


class AddWatch(namedtuple("AddWatch", "path mode")):
    """An addWatch request (`path` already chrooted); its answer has no body."""

    type = ADD_WATCH

    def serialize(self) -> bytearray:
        b = bytearray()
        b.extend(write_string(self.path))
        b.extend(int_struct.pack(self.mode))
        return b

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> bool:
        return True


class RecursiveWatches:
    """Persistent recursive watches of one KazooClient, and the delivery of their events.

    The server keeps such a watch for the connection until the connection ends; it is not
    among the watches kazoo restores after a reconnect, so whoever adds one adds it again
    (and re-reads what it watches) after every reconnect. Events are delivered on kazoo's
    connection thread, in the server's order, before kazoo's one-shot watchers of the same
    event run; a listener that raises is logged and the connection goes on.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._chroot = chroot_prefix(client.chroot or "")
        self._lock = threading.Lock()
        self._listeners: dict[str, tuple[TreeListener, ...]] = {}  # chrooted root -> ...
        connection = client._connection
        original = connection._read_watch_event
        data_watchers, child_watchers = client._data_watchers, client._child_watchers

        def read_watch_event(buffer: bytes, offset: int) -> Any:
            listeners = self._listeners
            if not listeners or client._stopped.is_set():
                return original(buffer, offset)
            try:
                watch, _ = Watch.deserialize(buffer, offset)
            except Exception:  # noqa: BLE001 - kazoo's own handling says what is wrong
                return original(buffer, offset)
            # Most events here are the persistent watch's alone: kazoo's handling (which
            # only hands the event to one-shot watchers of its path) is skipped for them.
            if watch.path in data_watchers or watch.path in child_watchers \
                    or watch.type not in _TREE_EVENTS:
                original(buffer, offset)
            self._deliver(watch.type, watch.path, listeners)
            return None

        connection._read_watch_event = read_watch_event

    def add(self, path: str, listener: TreeListener) -> Any:
        """Watch `path` and everything below it; kazoo's AsyncResult of the request (True,
        or e.g. UnimplementedError from a server older than 3.6)."""
        root = full_path(self._client.chroot or "", path)
        with self._lock:
            known = self._listeners.get(root, ())
            if listener not in known:
                self._listeners = {**self._listeners, root: known + (listener,)}
        return send_request(self._client, AddWatch(root, PERSISTENT_RECURSIVE))

    def forget(self, path: str, listener: TreeListener) -> None:
        """Stop delivering to `listener` (the server-side watch lasts until the
        connection ends; its events are then dropped here)."""
        root = full_path(self._client.chroot or "", path)
        with self._lock:
            left = tuple(x for x in self._listeners.get(root, ()) if x != listener)
            listeners = dict(self._listeners)
            if left:
                listeners[root] = left
            else:
                listeners.pop(root, None)
            self._listeners = listeners

    def _deliver(self, event_type: int, path: str,
                 listeners: dict[str, tuple[TreeListener, ...]]) -> None:
        kind = _TREE_EVENTS.get(event_type)
        if kind is None:
            return
        chroot = self._chroot
        relative = (path[len(chroot):] or "/") if chroot else path
        try:
            for root, found in listeners.items():
                if path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
                    for listener in found:
                        listener(kind, relative)
        except Exception:  # noqa: BLE001 - the connection thread must go on
            log.exception("A persistent watch listener failed")


# -- the connection's reads and writes ---------------------------------------------------

_CHUNK = 65536  # bytes read from the socket at once
_BATCH = 64  # requests written at once
_FAST_IO: "weakref.WeakKeyDictionary[KazooClient, FastIO]" = weakref.WeakKeyDictionary()


class FastIO:
    """Fewer system calls, and fewer thread wake-ups, per ZooKeeper message on kazoo's
    connection thread (`install`).

    kazoo's loop handles one message per turn: for a reply, a wait, a wait and read of its
    length, a wait and read of its body; for a request, a wait, a wait for the socket to be
    writable, a send and the read of its one wake-up byte. Each of those system calls lets
    go of the GIL, so with other threads busy every message is several thread switches, and
    a thread woken by one message (a cache's queue, a waiting caller) runs once per message.

    - Replies: when the loop finds the socket readable, what is there (up to 64 KiB) is read
      at once and every complete message in it handled in turn by kazoo's own
      `_read_socket`, served from that buffer, without a system call in between (so a
      thread woken by the first finds the others queued too). A message cut at the end of
      the buffer waits there for its rest, which makes the socket readable again; the next
      turn completes it with kazoo's blocking reads, as kazoo reads every message. The
      buffer belongs to one socket: a new connection starts empty.
    - Requests: when more than one is queued, up to 64 are numbered, moved to the pending
      list and written with one send, in queue order, as kazoo would send them one by one.
      A request is counted as sent before its bytes go out, so a connection that breaks
      during that write fails them with ConnectionLoss (like a request whose answer was
      lost) instead of sending them again on the next connection, where the ones already
      received would run twice. kazoo's special requests (authentication, close, its test
      sentinels), and one that does not encode, end a batch and go out through kazoo's
      own code.

    Only for plain TCP: over TLS, kazoo's own code runs unchanged (an SSL socket's reads
    do not map to the socket's readiness). Requests, their order and the replies' handling
    are kazoo's; only the grouping of the system calls changes.
    """

    def __init__(self, client: KazooClient) -> None:
        self._client = client
        self._connection = connection = client._connection
        self._read_header_one = connection._read_header
        self._read_socket_one = connection._read_socket
        self._send_request_one = connection._send_request
        self._socket: Any = None  # the socket `_buffer` was read from
        self._buffer = b""
        self._offset = 0
        # Counters (`ZkClient.io_counts`, for tests): request batches
        # written, the requests in them, socket reads that held more than one message.
        self.batches = 0
        self.batched = 0
        self.grouped_reads = 0

    @classmethod
    def install(cls, client: KazooClient) -> "FastIO":
        fast = cls(client)
        _FAST_IO[client] = fast
        connection = client._connection
        connection._read_header = fast._read_header
        connection._read_socket = fast._read_socket
        connection._send_request = fast._send_request
        return fast

    @staticmethod
    def of(client: KazooClient) -> "FastIO | None":
        """The one installed on `client` (None: kazoo's own reads and writes)."""
        return _FAST_IO.get(client)

    def _buffered(self) -> bool:
        """Whether a complete message is buffered (from the connection's current socket)."""
        if self._socket is not self._connection._socket:
            self._socket, self._buffer, self._offset = self._connection._socket, b"", 0
            return False
        buffer, offset = self._buffer, self._offset
        available = len(buffer) - offset
        return available >= 4 and available - 4 >= int_struct.unpack_from(buffer, offset)[0]

    def _read_header(self, timeout: float) -> tuple[Any, bytes, int]:
        if self._socket is not self._connection._socket or self._offset >= len(self._buffer):
            self._socket, self._buffer, self._offset = self._connection._socket, b"", 0
            return self._read_header_one(timeout)  # type: ignore[no-any-return]
        buffer, offset = self._buffer, self._offset
        rest = len(buffer) - offset
        if rest >= 4:
            length = int_struct.unpack_from(buffer, offset)[0]
            if rest - 4 >= length:
                body = buffer[offset + 4:offset + 4 + length]
                self._offset = offset + 4 + length
                header, at = ReplyHeader.deserialize(body, 0)
                return header, body, at
        # The buffer ends inside this message: the rest as kazoo reads it.
        part = buffer[offset:]
        self._buffer, self._offset = b"", 0
        connection = self._connection
        if len(part) < 4:
            part += connection._read(4 - len(part), timeout)
        length = int_struct.unpack_from(part, 0)[0]
        body = part[4:]
        if len(body) < length:
            body += connection._read(length - len(body), timeout)
        header, at = ReplyHeader.deserialize(body, 0)
        return header, body, at

    def _read_socket(self, read_timeout: float) -> Any:
        connection = self._connection
        sock = connection._socket
        if hasattr(sock, "pending"):  # TLS: kazoo's reads
            return self._read_socket_one(read_timeout)
        if self._socket is not sock or self._offset >= len(self._buffer):
            try:
                chunk = sock.recv(_CHUNK)
            except BlockingIOError:
                return None  # not readable after all: back to the loop's wait
            except OSError as exc:
                raise ConnectionDropped(f"socket connection error: {exc.strerror}") from exc
            if not chunk:
                raise ConnectionDropped("socket connection broken")
            self._socket, self._buffer, self._offset = sock, chunk, 0
        first = True
        while True:
            response = self._read_socket_one(read_timeout)
            if response == kazoo_connection.CLOSE_RESPONSE or not self._buffered():
                if self._offset >= len(self._buffer):
                    self._buffer, self._offset = b"", 0
                return response
            if first:
                first = False
                self.grouped_reads += 1

    def _send_request(self, read_timeout: float, connect_timeout: float) -> None:
        connection, client = self._connection, self._client
        queue = client._queue
        if len(queue) < 2 or hasattr(connection._socket, "pending"):
            return self._send_request_one(read_timeout, connect_timeout)  # type: ignore
        message = bytearray()
        count = 0
        pending = client._pending
        debug = connection.logger.isEnabledFor(logging.DEBUG)
        while queue and count < _BATCH:
            request, async_object = queue[0]
            if request is kazoo_connection._SESSION_EXPIRED \
                    or request is kazoo_connection._CONNECTION_DROP \
                    or request.type in (Auth.type, Close.type):
                break
            try:
                encoded = request.serialize()
            except Exception:  # noqa: BLE001 - kazoo's own path reports it, as it would
                break
            xid = connection._xid = (connection._xid % 2147483647) + 1
            body = bytearray(int_struct.pack(xid))
            if request.type:
                body.extend(int_struct.pack(request.type))
            body += encoded
            message += int_struct.pack(len(body))
            message += body
            queue.popleft()
            pending.append((request, async_object, xid))
            count += 1
            if debug:
                connection.logger.debug("Sending request(xid=%s): %s", xid, request)
        if not count:
            return self._send_request_one(read_timeout, connect_timeout)  # type: ignore
        self.batches += 1
        self.batched += count
        connection._write(bytes(message), connect_timeout)
        # One wake-up byte was (or is about to be) written per queued request; those not
        # read here make the loop look at an empty queue once each, as kazoo handles.
        connection._read_sock.recv(count)
        return None


# -- paths --------------------------------------------------------------------------------

def chroot_prefix(chroot: str) -> str:
    """The normalised chroot ("" without one), to prepend to already normal paths."""
    return str(_prefix_root(chroot, "/x"))[:-2]


def full_path(chroot: str, path: str, trailing: bool = False) -> str:
    """`path` under the chroot, normalised as kazoo does (`trailing` keeps a final "/")."""
    return str(_prefix_root(chroot, path, trailing=trailing))


# -- transactions -------------------------------------------------------------------------

def add_create(tx: TransactionRequest, chroot: str, path: str, data: bytes,
               acl: Any, ephemeral: bool, sequence: bool) -> None:
    """Add a create to `tx`, keeping a trailing "/" of a sequential create (as
    `KazooClient.create` does; `TransactionRequest.create` would drop it, turning
    "/nodepool/nodes/" + sequence into "/nodepool/nodes<seq>")."""
    flags = (1 if ephemeral else 0) | (2 if sequence else 0)
    tx.operations.append(Create(full_path(chroot, path, trailing=sequence), data, acl, flags))


# -- the poll handler ---------------------------------------------------------------------

_POLL_READ = select.POLLIN | select.POLLPRI
_POLL_WRITE = select.POLLOUT
_NOT_OUT = ~select.POLLOUT
_NOT_IN = ~select.POLLIN
_pollers = threading.local()


def _fd(fileobj: Any) -> int:
    fd = fileobj if type(fileobj) is int else fileobj_to_fd(fileobj)
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return int(fd)


def poll_select(rlist: list[Any], wlist: list[Any], xlist: list[Any],
                timeout: float | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """kazoo's `selector_select` with one `poll()` call instead of an epoll object.

    kazoo 2.11 creates, registers and closes an epoll selector for every wait of its
    connection loop, before every request it writes and for every read: four system calls
    where one does. `poll()` keeps no kernel state, so a poll object per thread and set of
    descriptors is reused. Same results: a descriptor ready for reading (or in error /
    hung up, as selectors report it) is listed in the first list, else a writable one in
    the second; the third is always empty.

    It runs three times per ZooKeeper message on kazoo's connection thread (the loop's
    wait, then before each read or write), so the usual call (sockets, a float timeout)
    takes a short path: descriptors from `fileno()` in one comprehension, the reused poll
    object looked up by them, the ready descriptors mapped back without a generator.
    """
    if timeout is not None:
        if type(timeout) is not float and not isinstance(timeout, (int, float)):
            raise TypeError("timeout must be a number")
        if timeout < 0:
            raise ValueError("timeout must be non-negative")
    try:
        rfds = tuple([f if type(f) is int else f.fileno() for f in rlist])
        wfds = tuple([f if type(f) is int else f.fileno() for f in wlist])
    except (AttributeError, TypeError, ValueError):  # not a file: kazoo's own error
        rfds = tuple(_fd(f) for f in rlist)
        wfds = tuple(_fd(f) for f in wlist)
    if (rfds and min(rfds) < 0) or (wfds and min(wfds) < 0):  # closed: as selectors say
        raise ValueError(f"Invalid file descriptor: {min(rfds + wfds)}")
    try:
        cache: dict[tuple[tuple[int, ...], tuple[int, ...]], Any] = _pollers.cache
    except AttributeError:
        cache = _pollers.cache = {}
    key = (rfds, wfds)
    poller = cache.get(key)
    if poller is None:
        poller = _new_poller(cache, key)
    ready = poller.poll(None if timeout is None else math.ceil(timeout * 1e3))
    if not ready:
        return [], [], []
    revents: list[Any] = []
    wevents: list[Any] = []
    for fd, events in ready:
        if events & select.POLLNVAL:  # not open: what registering it with epoll raised
            raise ValueError("Invalid event mask or fd")
        # As selectors map poll/epoll events: anything but POLLOUT counts as readable,
        # anything but POLLIN as writable (for a descriptor registered for that).
        if events & _NOT_OUT and fd in rfds:
            for f, d in zip(rlist, rfds):
                if d == fd:
                    revents.append(f)
        elif events & _NOT_IN and fd in wfds:
            for f, d in zip(wlist, wfds):
                if d == fd:
                    wevents.append(f)
    return revents, wevents, []


def _new_poller(cache: dict[tuple[tuple[int, ...], tuple[int, ...]], Any],
                key: tuple[tuple[int, ...], tuple[int, ...]]) -> Any:
    """A poll object for (read fds, write fds), kept in this thread's `cache` (at most 16:
    a reconnect brings new descriptors)."""
    if len(cache) >= 16:
        cache.clear()
    rfds, wfds = key
    masks: dict[int, int] = {}
    for fd in rfds:
        masks[fd] = masks.get(fd, 0) | _POLL_READ
    for fd in wfds:
        masks[fd] = masks.get(fd, 0) | _POLL_WRITE
    poller = select.poll()
    for fd, mask in masks.items():
        poller.register(fd, mask)
    cache[key] = poller
    return poller


class PollThreadingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, waiting with `poll_select` (see there)."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return poll_select(*args, **kwargs)


# -- the self-test ------------------------------------------------------------------------

_checked = threading.Lock()
_result: list[str] = []  # "" once passed, else the failure message


def problems() -> list[str]:
    """What does not match this module's expectations of the installed kazoo ([] = fine)."""
    found: list[str] = []
    version = _parse(installed_version())
    low, high = SUPPORTED
    if not low <= version[:2] < high:
        found.append(f"version outside the supported range >={'.'.join(map(str, low))},"
                     f"<{'.'.join(map(str, high))}")
    if not callable(getattr(KazooClient, "_call", None)):
        found.append("KazooClient._call is missing")
    client = KazooClient(hosts="127.0.0.1:1")
    try:
        if not callable(getattr(getattr(client, "_connection", None), "_read_watch_event",
                                None)):
            found.append("KazooClient._connection._read_watch_event is missing")
        for name in ("_data_watchers", "_child_watchers", "_stopped", "_queue", "_pending"):
            if not hasattr(client, name):
                found.append(f"KazooClient.{name} is missing")
        connection = getattr(client, "_connection", None)
        for name in ("_read_socket", "_read_header", "_send_request", "_read", "_write"):
            if not callable(getattr(connection, name, None)):
                found.append(f"KazooClient._connection.{name} is missing")
        for name in ("_xid", "_socket", "_read_sock", "logger"):
            if not hasattr(connection, name):
                found.append(f"KazooClient._connection.{name} is missing")
        tx = TransactionRequest(client)
        if not isinstance(getattr(tx, "operations", None), list):
            found.append("TransactionRequest.operations is not a list")
        else:
            add_create(tx, "/c", "/n/", b"x", [], False, True)
            if tx.operations[-1] != Create("/c/n/", b"x", [], 2):
                found.append(f"a transaction create encodes as {tx.operations[-1]!r}")
    finally:
        client.close()
    if chroot_prefix("/c/") != "/c" or chroot_prefix("") != "" \
            or full_path("/c", "/a/b") != "/c/a/b":
        found.append("kazoo.protocol.paths._prefix_root prefixes chroots differently")
    for name in ("_SESSION_EXPIRED", "_CONNECTION_DROP", "CLOSE_RESPONSE"):
        if not hasattr(kazoo_connection, name):
            found.append(f"kazoo.protocol.connection.{name} is missing")
    if getattr(kazoo_connection, "CLOSE_RESPONSE", None) != Close.type:
        found.append("kazoo's close response is not the close request's type")
    reply = struct.pack("!iqi", 7, 9, 0)
    if ReplyHeader.deserialize(reply, 0) != (ReplyHeader(7, 9, 0), 16):
        found.append("reply headers decode differently")
    if (GetData.type, GetChildren.type) != (4, 8):
        found.append("getData/getChildren opcodes changed")
    encoded = bytes(MultiRead([get_data("/a")]).serialize())
    expected = (struct.pack("!iBi", 4, 0, -1) + struct.pack("!i", 2) + b"/a" + b"\x00"
                + struct.pack("!iBi", -1, 1, -1))
    if encoded != expected:
        found.append("the multiRead encoding differs")
    reply = struct.pack("!iBi", 8, 0, 0) + struct.pack("!i", 1) + struct.pack("!i", 1) + b"x" \
        + struct.pack("!iBi", -1, 1, -1)
    if MultiRead.deserialize(reply, 0) != [["x"]]:
        found.append("the multiRead reply decoding differs")
    if bytes(AddWatch("/a", PERSISTENT_RECURSIVE).serialize()) != \
            struct.pack("!i", 2) + b"/a" + struct.pack("!i", 1):
        found.append("the addWatch encoding differs")
    event = struct.pack("!ii", 2, 3) + struct.pack("!i", 4) + b"/a/b"
    if Watch.deserialize(event, 0)[0] != Watch(2, 3, "/a/b") \
            or EVENT_TYPE_MAP.get(2) != EventType.DELETED:
        found.append("watch events decode differently")
    found.extend(_select_problems())
    return found


def _same(ours: Any, theirs: Any) -> bool:
    # kazoo's selector_select lists a descriptor given twice twice; the sets must match.
    return [set(map(id, x)) for x in ours] == [set(map(id, x)) for x in theirs]


def _select_problems() -> list[str]:
    """The poll handler's select answers as kazoo's own does on a socket pair (the calls of
    kazoo's connection loop: read list only, write list only, both)."""
    ours, theirs = PollThreadingHandler(), SequentialThreadingHandler()
    a, b = socket.socketpair()
    try:
        cases: list[tuple[str, tuple[Any, ...]]] = [
            ("idle", ([a], [], [], 0)), ("writable", ([], [a], [], 0)),
            ("both", ([a, b], [a], [], 0))]
        for label, args in cases:
            if not _same(ours.select(*args), theirs.select(*args)):
                return [f"the poll handler's select differs from kazoo's ({label})"]
        b.send(b"x")
        for label, args in (("readable", ([a], [], [], 1)), ("read+write", ([a], [a], [], 1))):
            if not _same(ours.select(*args), theirs.select(*args)):
                return [f"the poll handler's select differs from kazoo's ({label})"]
        return []
    except Exception as exc:  # noqa: BLE001 - any failure is a finding
        return [f"the handlers' select failed: {type(exc).__name__}: {exc}"]
    finally:
        a.close()
        b.close()


def check() -> None:
    """Run the self-test once per process; KazooIncompatible on any finding."""
    with _checked:
        if not _result:
            found = problems()
            _result.append("; ".join(found))
        message = _result[0]
    if message:
        raise KazooIncompatible(
            f"kazoo {installed_version()} is not supported by nodepool_k8s.zk._kazoo_ext "
            f"(written for >={'.'.join(map(str, SUPPORTED[0]))},"
            f"<{'.'.join(map(str, SUPPORTED[1]))}): {message}")
