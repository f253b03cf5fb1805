"""The `nodepool` subcommands about one node's lifecycle, one request and the event log:
show, events.

Owns: `show NODE_ID` (the node, its conditions as a table, the phase timings, the failure
reason with what to do; `--json` for the web app's `/node/<id>` document), `show
REQUEST_ID` (the request, why each pool declined it and why it waits, with what to do;
`--json`) and `events`
(the installation's event log from `/nodepool_k8s/events`, filtered by provider, pool, node
and age, newest last). Read-only: one or two reads of ZooKeeper.

How it fails: an id that is neither a node id (digits) nor a request id
(`PRIO-SEQUENCE`), or an unparsable `--since`, is an argparse usage error (exit 2, before
ZooKeeper is contacted); `CliError` for an unknown node or request id;
ZooKeeper errors as in `common`.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from nodepool_k8s.views import listing, node_detail
from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.common import CliError
from nodepool_k8s.config import fingerprint
from nodepool_k8s.core.model import NodeView
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import locks, paths
from nodepool_k8s.zk import requests as request_codec

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
# A request id: Zuul's precedence prefix and ZooKeeper's sequence number (never a path).
_REQUEST_ID = re.compile(r"^\d{3}-\d+$")


def show_id_arg(text: str) -> str:
    """A request id (`100-0000000042`) as given, or a node id as `common.node_id_arg`."""
    text = text.strip()
    if _REQUEST_ID.match(text) and paths.is_request_id(text):
        return text
    try:
        return common.node_id(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"neither a node id (digits, e.g. 0000000042) nor a request id (e.g."
            f" 100-0000000042): {text!r}") from None


def duration_arg(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `1d` as seconds (an argparse type)."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 15m, 2h, 1d)")
    return float(match[1]) * _UNITS[match[2] or "s"]


def cmd_show(args: argparse.Namespace) -> int:
    if paths.is_request_id(args.id):
        return _show_request(args)
    node_id = common.node_id(args.id)
    with common.session(args) as s:
        node = s.nodes.get(node_id)
        if node is None:
            if s.zk.exists(paths.node_path(node_id)) is None:
                raise CliError(f"node {node_id} not found (`nodepool events --node "
                               f"{node_id}` shows its history if it was deleted)")
            raise CliError(f"node {node_id} has an unreadable record")
        children = s.zk.get_children(paths.node_lock_path(node_id)) or []
        view = NodeView(node, bool(locks.contenders(children)))
    detail = node_detail.node_detail(view, common.now(), fingerprint.config_hashes(s.config))
    if args.json:
        sys.stdout.write(listing.render_json_document(detail) + "\n")
    else:
        sys.stdout.write(node_detail.render_node_detail(detail) + "\n")
    return 0


def _show_request(args: argparse.Namespace) -> int:
    request_id = args.id
    with common.session(args) as s:
        found = s.zk.get(paths.request_path(request_id))
        if found is None:
            raise CliError(f"request {request_id} not found (Zuul deletes a request once it"
                           " took its nodes, or gave it up)")
        request = request_codec.parse(request_id, found[0], found[1].version)
        if request is None:
            raise CliError(f"request {request_id} has an unreadable record")
        pools = s.reader.pool_components()
    detail = node_detail.request_detail(request, common.now(), pools)
    if args.json:
        sys.stdout.write(listing.render_json_document(detail) + "\n")
    else:
        sys.stdout.write(node_detail.render_request_detail(detail) + "\n")
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    with common.session(args) as s:
        events = zk_events.read_events(s.zk)
    since = common.now() - args.since if args.since is not None else None
    # `--node` was checked and zero-padded by `common.node_id_arg` (a usage error, exit 2).
    selected = zk_events.select(events, provider=args.provider, pool=args.pool, node=args.node,
                                since=since)
    common.emit(node_detail.event_rows(selected), node_detail.EVENT_COLUMNS, args.json)
    return 0


def add_show(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "show", help="show one node's conditions, timings and failure reason, or why a"
                     " request waits",
        description="Show a node: its record, its lifecycle conditions (Launched,"
                    " Registered, Initialized, Ready, Deleting) with reasons and transition"
                    " times, the time each phase took, and for a failed node the reason and"
                    " what to do (doc/operation.md). Or show a request (an id like"
                    " 100-0000000042): its record, why each pool declined it and why it"
                    " waits, with what to do.")
    parser.add_argument("id", type=show_id_arg,
                        help="node id (digits; leading zeros may be omitted) or request id"
                             " (PRIO-SEQUENCE)")
    common.add_json_option(parser)
    parser.set_defaults(func=cmd_show)


def add_events(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "events", help="recent lifecycle events of this installation",
        description="Show the installation's recent lifecycle events (launches, failed"
                    " attempts and launches with their reason, deletions, pool pauses and"
                    " resumes, configuration reloads), newest last, from the bounded log"
                    " every launcher shares in ZooKeeper.")
    parser.add_argument("--provider", default=None, help="only events of this provider")
    parser.add_argument("--pool", default=None, help="only events of this pool")
    parser.add_argument("--node", type=common.node_id_arg, default=None,
                        help="only events of this node id (digits; leading zeros may be"
                             " omitted)")
    parser.add_argument("--since", type=duration_arg, default=None, metavar="D",
                        help="only events of the last D (e.g. 90s, 15m, 2h, 1d)")
    common.add_json_option(parser, "/events")
    parser.set_defaults(func=cmd_events)
