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
import sys

from nodepool_k8s import status
from nodepool_k8s.cmd import common


def cmd_list(args: argparse.Namespace) -> int:
    with common.session(args) as s:
        rows = s.reader.nodes()
    table = status.node_list(common.node_views(rows), common.now())
    columns = status.NODE_DETAIL_COLUMNS if args.detail else status.NODE_COLUMNS
    common.emit(table, columns, args.json)
    return 0


def cmd_request_list(args: argparse.Namespace) -> int:
    with common.session(args) as s:
        requests = s.reader.requests()
    common.emit(status.request_list(requests), status.REQUEST_COLUMNS, args.json)
    return 0


def cmd_label_list(args: argparse.Namespace) -> int:
    """Labels some running pool serves right now (the union of registered pools' labels)."""
    with common.session(args) as s:
        pools = s.reader.pool_components()
    rows = status.label_list(p.supported_labels for p in pools)
    common.emit(rows, status.LABEL_COLUMNS, args.json)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    """The nodes of one provider and the pools registered for it."""
    provider = args.provider
    with common.session(args) as s:
        node_rows = [r for r in s.reader.nodes() if r.node.provider == provider]
        pools = [p.data for p in s.reader.pool_components() if p.provider_name == provider]
        configured = provider in s.config.providers
    if not (configured or node_rows or pools):
        raise common.CliError(
            f"provider {provider!r} is not in the configuration and has neither nodes nor"
            " registered pools")
    nodes = status.node_list(common.node_views(node_rows), common.now())
    pool_rows = status.pool_list(pools)
    if args.json:
        sys.stdout.write(status.render_json_document(
            {"provider": provider, "nodes": nodes, "pools": pool_rows}) + "\n")
        return 0
    print("Nodes:")
    print(status.render_table(nodes, status.PROVIDER_NODE_COLUMNS))
    print("Pools:")
    print(status.render_table(pool_rows, status.POOL_COLUMNS))
    return 0
