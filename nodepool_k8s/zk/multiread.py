"""Batched reads: ZooKeeper's `multiRead` (3.6+), which kazoo 2.11 does not offer.

Owns: `read_many`, which reads thousands of znodes in a handful of round trips with
multiRead requests (opcode 22: a list of getData/getChildren operations framed like a
multi; the wire encoding and the sending are in `_kazoo_ext`, the one module that touches
kazoo's internals). kazoo sends each ordinary request with its own wake-up
of the connection thread (about 0.1 ms each on a small machine), so 20,000 pipelined reads
take seconds; batched, ten thousand nodes with their lock dirs list in a fraction of that.

Unlike a write multi, a multiRead is not all-or-nothing: each operation has its own result,
and a missing znode yields `None` for that entry only. So does a znode whose ACL does not
let us read it (another client's): it is reported once with its path (`UNREADABLE`), and
one such znode cannot fail every batch it is part of. A server without multiRead (older
than 3.6) answers with an error; `read_many` then falls back to pipelined single reads.
"""

from __future__ import annotations

import collections
import logging
from typing import Any, Iterable, Iterator, Sequence

from kazoo import exceptions as kex

from nodepool_k8s.core import records
from nodepool_k8s.zk import _kazoo_ext

log = logging.getLogger("nodepool_k8s.zk.multiread")

GET = "get"
CHILDREN = "children"
BATCH = 500
# multiReads in flight at once: the server answers the next batch while this process
# decodes the previous one (10,000 nodes: 40 batches of about 1 MB each).
WINDOW = 4

ReadResult = Any  # (bytes, ZnodeStat) for GET, list[str] for CHILDREN, None when missing
UNREADABLE = "not readable: its ACL grants us no READ (NoAuthError)"


def report_unreadable(what: str, path: str) -> None:
    """Log a znode we may not read, once (it is skipped like a missing one)."""
    records.REPORTS.report(what, path, -1, UNREADABLE)


class MultiReadUnsupported(Exception):
    pass


def _send(client: Any, ops: Sequence[tuple[str, str]]) -> Any:
    """Queue one multiRead; returns its kazoo AsyncResult."""
    chroot = client.chroot
    root = _kazoo_ext.chroot_prefix(chroot)

    def full(path: str) -> str:
        # kazoo's normalisation costs more than the rest of a 10,000-node listing's
        # request building; our paths are already normal: just prepend the chroot.
        if path[:1] == "/" and "//" not in path and "/." not in path \
                and (len(path) == 1 or path[-1] != "/"):
            return root + path if path != "/" or not root else root
        return _kazoo_ext.full_path(chroot, path)

    get_data, get_children = _kazoo_ext.get_data, _kazoo_ext.get_children
    records = [get_data(full(path)) if kind == GET else get_children(full(path))
               for kind, path in ops]
    return _kazoo_ext.send_request(client, _kazoo_ext.MultiRead(records))


def _batch(client: Any, ops: Sequence[tuple[str, str]]) -> list[ReadResult]:
    return _collect(_send(client, ops), ops)


def _collect(async_result: Any, ops: Sequence[tuple[str, str]]) -> list[ReadResult]:
    try:
        results = async_result.get()
    except (kex.UnimplementedError, kex.MarshallingError, kex.BadArgumentsError) as exc:
        raise MultiReadUnsupported(str(exc)) from exc
    out: list[ReadResult] = []
    for (_, path), result in zip(ops, results):
        if isinstance(result, kex.NoNodeError):
            out.append(None)
        elif isinstance(result, kex.NoAuthError):
            report_unreadable("znode", path)
            out.append(None)
        elif isinstance(result, Exception):
            raise result
        else:
            out.append(result)
    return out


def _pipelined(client: Any, ops: Sequence[tuple[str, str]]) -> list[ReadResult]:
    pending = [client.get_async(path) if kind == GET else client.get_children_async(path)
               for kind, path in ops]
    out: list[ReadResult] = []
    for (_, path), result in zip(ops, pending):
        try:
            value = result.get()
        except kex.NoNodeError:
            value = None
        except kex.NoAuthError:
            report_unreadable("znode", path)
            value = None
        out.append(list(value) if isinstance(value, list) else value)
    return out


class BatchReader:
    """Reads many znodes; remembers whether the server supports multiRead."""

    def __init__(self) -> None:
        self.supported: bool | None = None

    def read_many(self, client: Any, ops: Iterable[tuple[str, str]],
                  batch: int = BATCH, window: int = WINDOW) -> list[ReadResult]:
        out: list[ReadResult] = []
        for part in self.iter_many(client, ops, batch, window):
            out.extend(part)
        return out

    def iter_many(self, client: Any, ops: Iterable[tuple[str, str]],
                  batch: int = BATCH, window: int = WINDOW) -> Iterator[list[ReadResult]]:
        """`read_many` in consecutive parts, each as soon as it has arrived: a caller that
        decodes a part meanwhile overlaps its work with the server's on the next ones."""
        ops = list(ops)
        if self.supported is False:
            yield _pipelined(client, ops)
            return
        starts = list(range(0, len(ops), batch))
        in_flight: collections.deque[tuple[int, Any]] = collections.deque()
        sent = 0
        while sent < len(starts) or in_flight:
            # Without confirmed support, one batch at a time: an old server refuses each.
            limit = window if self.supported else 1
            while sent < len(starts) and len(in_flight) < limit:
                start = starts[sent]
                in_flight.append((start, _send(client, ops[start:start + batch])))
                sent += 1
            start, result = in_flight.popleft()
            try:
                part = _collect(result, ops[start:start + batch])
                self.supported = True
            except MultiReadUnsupported as exc:
                log.info("ZooKeeper has no multiRead (%s); using pipelined reads", exc)
                self.supported = False
                yield _pipelined(client, ops[start:])
                return
            yield part
