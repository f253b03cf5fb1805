"""The read-only `nodepool` subcommands: list, request-list, label-list, info.

Owns: what each listing shows. Every listing is one batched read of ZooKeeper through
`ZkReader` (nodes with their lock state come in a handful of multiRead round trips, never
one lock probe per node), rendered through `status` so the CLI, the web app and its JSON
agree on columns and keys. Secrets are redacted there (`connection_port` shows `redacted`).

How it fails: see `common` (configuration, ZooKeeper unreachable); `info` on a provider
that is neither configured nor known to ZooKeeper raises `CliError`. Nothing here writes.
"""

from __future__ import annotations

import argparse
import gc
import sys
from contextlib import contextmanager
from typing import Iterator

from nodepool_k8s.views import pools as pool_view, listing
from nodepool_k8s.cmd import common
from nodepool_k8s.config import fingerprint
from nodepool_k8s.core.records import MalformedRecord
from nodepool_k8s.zk.pool_status import POOL_STATUS, decode_pool_status, read_all


@contextmanager
def _no_gc() -> Iterator[None]:
    """Without cyclic garbage collection: decoding ten thousand records (none of them
    cyclic) triggers full collections that cost a sixth of the listing's CPU."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def cmd_list(args: argparse.Namespace) -> int:
    with _no_gc():
        return _list(args)


def _list(args: argparse.Namespace) -> int:
    malformed: list[MalformedRecord] = []
    with common.session(args) as s:
        hashes = fingerprint.config_hashes(s.config)
        now = common.now()
        table = s.reader.node_rows(lambda view: listing.node_row(view, now, hashes),
                                   malformed)
    if malformed:
        table.extend(listing.malformed_node_row(m) for m in malformed)
        table.sort(key=lambda row: str(row["id"]))
        _warn_malformed(len(malformed), "node")
    columns = listing.NODE_DETAIL_COLUMNS if args.detail else listing.NODE_COLUMNS
    common.emit(table, columns, args.json)
    return 0


def cmd_request_list(args: argparse.Namespace) -> int:
    malformed: list[MalformedRecord] = []
    with common.session(args) as s:
        requests = s.reader.requests(malformed)
        pools = s.reader.pool_components()
    if malformed:
        _warn_malformed(len(malformed), "request")
    columns = listing.REQUEST_DETAIL_COLUMNS if getattr(args, "detail", False) \
        else listing.REQUEST_COLUMNS
    common.emit(listing.request_list(requests, malformed, common.now(), pools), columns,
                args.json)
    return 0


def _warn_malformed(count: int, kind: str) -> None:
    sys.stderr.write(f"{count} malformed {kind} record(s), shown in state "
                     f"'{listing.MALFORMED}' (see doc/operation.md, Malformed records)\n")


def cmd_label_list(args: argparse.Namespace) -> int:
    """Labels some running pool serves right now (the union of registered pools' labels)."""
    with common.session(args) as s:
        pools = s.reader.pool_components()
    rows = listing.label_list(p.supported_labels for p in pools)
    common.emit(rows, listing.LABEL_COLUMNS, args.json)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """The nodes of one provider and the pools registered for it."""
    with _no_gc():
        return _info(args)


def _info(args: argparse.Namespace) -> int:
    provider = args.provider
    with common.session(args) as s:
        views = [v for v in s.reader.nodes() if v.node.provider == provider]
        pools = [p.data for p in s.reader.pool_components() if p.provider_name == provider]
        configured = provider in s.config.providers
    if not (configured or views or pools):
        raise common.CliError(
            f"provider {provider!r} is not in the configuration and has neither nodes nor"
            " registered pools")
    now = common.now()
    nodes = [listing.node_row(view, now) for view in views]
    pool_rows = listing.pool_list(pools)
    if args.json:
        sys.stdout.write(listing.render_json_document(
            {"provider": provider, "nodes": nodes, "pools": pool_rows}) + "\n")
        return 0
    print("Nodes:")
    print(listing.render_table(nodes, listing.PROVIDER_NODE_COLUMNS))
    print("Pools:")
    print(listing.render_table(pool_rows, listing.POOL_COLUMNS))
    return 0


def cmd_pool_list(args: argparse.Namespace) -> int:
    """One status per running pool, combined from every launcher's (see pool_view)."""
    with common.session(args) as s:
        records = read_all(s.zk, POOL_STATUS, decode_pool_status)
    pools = pool_view.combine(records.values())
    if args.json:
        sys.stdout.write(listing.render_json(pools) + "\n")
    else:
        common.emit(pool_view.pool_rows(pools), pool_view.POOL_STATUS_COLUMNS, False)
    return 0
