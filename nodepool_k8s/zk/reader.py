"""Read-only views of the Nodepool tree for the CLI and the web app, without caches.

Owns: listing nodes (with a "locked" flag from lock contenders), requests and registered
components straight from ZooKeeper. All reads of a listing are batched (ZooKeeper's
multiRead, see multiread.py; pipelined single reads on servers without it), so ten thousand
nodes with their lock state list in about a quarter of a second. Malformed znodes (see
`records`) are reported once and returned separately, so the views can show them. Nothing
here writes.

Failure: `ZkConnectionError` when ZooKeeper cannot be read.
"""

from __future__ import annotations

import itertools
from typing import Callable, TypeVar

from nodepool_k8s.core import records
from nodepool_k8s.core.model import NodeRequest, NodeView
from nodepool_k8s.core.records import MalformedRecord
from nodepool_k8s.zk import locks, multiread, paths
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.cache import Component, decode_component
from nodepool_k8s.zk.client import ZkClient


T = TypeVar("T")


def _view(view: NodeView) -> NodeView:
    return view


class ZkReader:
    def __init__(self, zk: ZkClient) -> None:
        self.zk = zk

    def nodes(self, malformed: list[MalformedRecord] | None = None) -> list[NodeView]:
        """Every usable node; malformed ones are appended to `malformed` when given."""
        return self.node_rows(_view, malformed)

    def node_rows(self, shape: Callable[[NodeView], T],
                  malformed: list[MalformedRecord] | None = None) -> list[T]:
        """`shape(view)` of every usable node, made as each node is decoded: a listing
        that keeps only its rows never holds ten thousand whole records (with their
        tokens and certificates) at once."""
        ids = sorted(c for c in (self.zk.get_children(paths.NODES) or [])
                     if paths.is_node_id(c))
        return self._rows(ids, shape, malformed)

    def node(self, node_id: str) -> NodeView | None:
        rows = self._rows([node_id], _view)
        return rows[0] if rows else None

    def _rows(self, ids: list[str], shape: Callable[[NodeView], T],
              malformed: list[MalformedRecord] | None = None) -> list[T]:
        """The nodes of `ids` (in that order) with their lock state, shaped: one decoder
        for every listing (`nodes.decode`, the strict `records.decode_node` underneath)."""
        ops: list[tuple[str, str]] = []
        for node_id in ids:
            ops.append((multiread.GET, paths.node_path(node_id)))
            ops.append((multiread.CHILDREN, paths.node_lock_path(node_id)))
        rows: list[T] = []
        decode, contenders = node_codec.decode, locks.contenders
        # Decoded part by part as the batches arrive (overlapping the server's work on
        # the next ones); each node's two results are consecutive.
        results = itertools.chain.from_iterable(self.zk.iter_many(ops))
        for node_id in ids:
            found, children = next(results), next(results)
            if not found or not found[0]:
                continue
            try:
                node = decode(node_id, found[0], found[1].version)
            except records.Malformed as exc:
                _report(malformed, "node", node_id, found[1].version, exc.reason)
                continue
            rows.append(shape(NodeView(node, bool(children) and bool(contenders(children)))))
        return rows

    def requests(self, malformed: list[MalformedRecord] | None = None
                 ) -> list[NodeRequest]:
        """Every usable request in precedence order; malformed ones go to `malformed`."""
        ids = [c for c in (self.zk.get_children(paths.REQUESTS) or [])
               if paths.is_request_id(c)]
        out: list[NodeRequest] = []
        for path, found in self.zk.get_many([paths.request_path(i) for i in ids]):
            if found is None:
                continue
            request_id = paths.basename(path)
            try:
                out.append(request_codec.decode(request_id, found[0], found[1].version))
            except records.Malformed as exc:
                _report(malformed, "request", request_id, found[1].version, exc.reason)
        return sorted(out, key=NodeRequest.sort_key)

    def components(self, kind: str) -> list[Component]:
        base = f"{paths.COMPONENTS}/{kind}"
        names = sorted(self.zk.get_children(base) or [])
        out: list[Component] = []
        for path, found in self.zk.get_many([f"{base}/{n}" for n in names]):
            if found is not None:
                component = decode_component(kind, paths.basename(path), found[0],
                                             found[1].ephemeral_owner, found[1].version)
                if component is not None:
                    out.append(component)
        return out

    def pool_components(self) -> list[Component]:
        return self.components("pool")


def _report(into: list[MalformedRecord] | None, kind: str, record_id: str, version: int,
            reason: str) -> None:
    path = paths.node_path(record_id) if kind == "node" else paths.request_path(record_id)
    records.REPORTS.report(kind, path, version, reason)
    if into is not None:
        into.append(MalformedRecord(kind, record_id, reason))
