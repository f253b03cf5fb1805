"""Fleet control commands: `nodepool pause`, `drain`, `resume` and `pool-state`.

Owns: writing the operator's pause/drain for `PROVIDER` or `PROVIDER/POOL` to ZooKeeper
(`zk.pool_state`, with who = user@host, when and `--reason`), removing it again, and the
per-pool listing that shows what governs each configured pool (operator or maintenance
window), the drain's progress (spare nodes still to go, nodes in use) and the next
maintenance window. Every launcher watches the entries, so they take effect at once.

How it fails: an unknown provider or pool raises `CliError` (nothing is written); a
malformed entry in ZooKeeper is left out of the listing with a one-line warning on stderr
(the launchers ignore it too); see `common` for configuration and connection failures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import socket
import sys
import time
from typing import Any

from nodepool_k8s.core import model
from nodepool_k8s.cmd import common
from nodepool_k8s.config.model import Config, PoolConfig
from nodepool_k8s.core.model import NodeView
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.core.records import clip
from nodepool_k8s.zk.pool_state import DRAIN, PAUSE, PoolState, PoolStateStore, strongest

# How often `drain --wait` looks again (a command in the foreground; launchers never poll).
WAIT_INTERVAL = 1.0

POOL_STATE_COLUMNS = (
    ("Provider", "provider"), ("Pool", "pool"), ("State", "state"), ("Source", "source"),
    ("By", "by"), ("Since", "since"), ("Reason", "reason"), ("Spare", "spare"),
    ("In Use", "in_use"), ("Deleting", "deleting"), ("Next Window", "next_window"),
)


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _utc(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _target(config: Config, text: str) -> tuple[str, list[PoolConfig]]:
    """The normalised target and the configured pools it covers (CliError if unknown)."""
    provider_name, _, pool_name = text.partition("/")
    provider = config.providers.get(provider_name)
    if provider is None:
        raise common.CliError(f"no provider {provider_name!r} in the configuration"
                              f" (known: {', '.join(sorted(config.providers)) or 'none'})")
    if not pool_name:
        return provider_name, list(provider.pools.values())
    pool = provider.pools.get(pool_name)
    if pool is None:
        raise common.CliError(f"provider {provider_name!r} has no pool {pool_name!r}"
                              f" (known: {', '.join(sorted(provider.pools)) or 'none'})")
    return f"{provider_name}/{pool_name}", [pool]


Records = list[NodeView]


def _counts(records: Records) -> dict[tuple[str, str], dict[str, int]]:
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for view in records:
        node = view.node
        key = (str(node.provider), str(node.pool))
        entry = counts.setdefault(key, {"spare": 0, "in_use": 0, "deleting": 0})
        if node.state in (model.NodeState.DELETING, model.NodeState.DELETED):
            entry["deleting"] += 1
        elif node.state == model.NodeState.READY and not node.allocated_to:
            # Locked but unallocated: a launcher (the deleter draining it, or a request
            # taking it over) holds it for a moment; it is still a spare until it is gone
            # or allocated, so a drain is not reported done while it exists.
            entry["spare"] += 1
        else:
            entry["in_use"] += 1
    return counts


def pool_rows(config: Config, states: list[PoolState],
              records: Records, now: float) -> list[dict[str, Any]]:
    """One row per configured pool: what governs it and how far a drain has come."""
    counts = _counts(records)
    rows = []
    for provider in config.providers.values():
        for pool in provider.pools.values():
            governing = strongest([s for s in states if s.covers(provider.name, pool.name)]
                                  + [s for s in [maintenance.active(pool, now)] if s])
            count = counts.get((provider.name, pool.name),
                               {"spare": 0, "in_use": 0, "deleting": 0})
            upcoming = maintenance.next_window(pool, now)
            row: dict[str, Any] = {
                "provider": provider.name, "pool": pool.name,
                "state": _state(governing, count), "action": governing.action
                if governing else None, "source": governing.source if governing else None,
                "target": governing.target if governing else None,
                "by": governing.by if governing else None,
                "since": _utc(governing.time) if governing else None,
                "reason": governing.reason if governing else None, **count,
                "next_window": (f"{_utc(upcoming[0])} {upcoming[2].action}"
                                f" until {_utc(upcoming[1])}") if upcoming else None,
                "next_window_start": _utc(upcoming[0]) if upcoming else None,
                "next_window_end": _utc(upcoming[1]) if upcoming else None,
            }
            rows.append(row)
    return rows


def _state(governing: PoolState | None, count: dict[str, int]) -> str:
    if governing is None:
        return "active"
    if governing.action == PAUSE:
        return "paused"
    if count["spare"] or count["deleting"]:
        return "draining"
    return "drained" if count["in_use"] else "empty"


def _warn_malformed(path: str, reason: str) -> None:
    # Left out of the rows, as every launcher ignores it; said once, so a pause or drain
    # that an operator believes in force but is not is visible.
    common.warn(f"ignoring malformed pool-state entry {path}: {clip(reason)} (the"
                " launchers ignore it too; pause or drain again to replace it, resume to"
                " remove it)")


def _rows(s: common.Session, only: list[PoolConfig] | None) -> list[dict[str, Any]]:
    states = PoolStateStore(s.zk).list(_warn_malformed)
    rows = pool_rows(s.config, states, s.reader.nodes(), common.now())
    if only is not None:
        wanted = {(p.provider, p.name) for p in only}
        rows = [r for r in rows if (r["provider"], r["pool"]) in wanted]
    return rows


def _show(args: argparse.Namespace, s: common.Session, only: list[PoolConfig] | None) -> None:
    common.emit(_rows(s, only), POOL_STATE_COLUMNS, args.json)


def _wait_empty(args: argparse.Namespace, s: common.Session, pools: list[PoolConfig]) -> int:
    """`drain --wait`: one progress line (stderr) whenever a pool's counts change, until
    every pool is empty; 1 if the drain is lifted or `--timeout` passes first."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    said: dict[tuple[str, str], str] = {}
    while True:
        rows = _rows(s, pools)
        for row in rows:
            line = (f"{row['provider']}/{row['pool']}: {row['state']} (spare {row['spare']},"
                    f" deleting {row['deleting']}, in use {row['in_use']})")
            if said.get((row["provider"], row["pool"])) != line:
                said[(row["provider"], row["pool"])] = line
                print(line, file=sys.stderr, flush=True)
        if all(row["state"] == "empty" for row in rows):
            return 0
        lifted = [f"{r['provider']}/{r['pool']}" for r in rows if r["action"] != DRAIN]
        if lifted:
            common.warn(f"no longer draining: {', '.join(lifted)} (resumed or paused"
                        " instead); stopped waiting")
            return 1
        if deadline is not None and time.monotonic() >= deadline:
            common.warn(f"not empty after {args.timeout:g}s; the drain stays in force")
            return 1
        time.sleep(WAIT_INTERVAL)


def _set(args: argparse.Namespace, action: str) -> int:
    with common.session(args, full=True) as s:
        target, pools = _target(s.config, args.target)
        PoolStateStore(s.zk).set(target, action, args.reason or "", _who(), common.now())
        _show(args, s, pools)
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    return _set(args, PAUSE)


def cmd_drain(args: argparse.Namespace) -> int:
    if not args.wait:
        return _set(args, DRAIN)
    with common.session(args, full=True) as s:
        target, pools = _target(s.config, args.target)
        PoolStateStore(s.zk).set(target, DRAIN, args.reason or "", _who(), common.now())
        status = _wait_empty(args, s, pools)
        _show(args, s, pools)
    return status


def cmd_resume(args: argparse.Namespace) -> int:
    with common.session(args, full=True) as s:
        target, pools = _target(s.config, args.target)
        if not PoolStateStore(s.zk).clear(target):
            common.warn(f"{target} was neither paused nor drained by an operator")
        _show(args, s, pools)
    return 0


def cmd_pool_state(args: argparse.Namespace) -> int:
    with common.session(args, full=True) as s:
        pools = _target(s.config, args.target)[1] if args.target else None
        _show(args, s, pools)
    return 0


def _target_arg(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    parser.add_argument("target", metavar="PROVIDER[/POOL]", nargs="?" if optional else None,
                        help="a provider (all its pools) or one pool of it")


def add_parsers(subparsers: Any) -> None:
    for name, func, text in (
            ("pause", cmd_pause, "stop accepting requests; nodes in use are untouched and"
             " requests only this pool could serve wait (they are not declined)"),
            ("drain", cmd_drain, "like pause, and delete the spare (ready, unallocated,"
             " unlocked) nodes; pool-state shows the progress until only nodes in use"
             " remain (drained), then none (empty)")):
        parser = subparsers.add_parser(name, help=f"{name} a provider or pool",
                                       description=f"{name.capitalize()} PROVIDER[/POOL] on"
                                       f" every launcher at once: {text}.")
        _target_arg(parser)
        parser.add_argument("--reason", default=None, help="why (shown by pool-state)")
        if name == "drain":
            parser.add_argument("--wait", action="store_true",
                                help="stay until every pool of the target is empty (nodes in"
                                     " use are released by Zuul, spares deleted), printing"
                                     " each change of its counts on stderr; exit 1 if the"
                                     " drain is lifted or --timeout passes first")
            parser.add_argument("--timeout", type=common.seconds_arg, default=None,
                                metavar="SECONDS", help="with --wait: give up after this long"
                                " (the drain stays in force)")
        common.add_json_option(parser)
        parser.set_defaults(func=func)
    parser = subparsers.add_parser(
        "resume", help="undo pause or drain",
        description="Remove the operator's pause or drain of PROVIDER[/POOL] (maintenance"
                    " windows in the configuration still apply).")
    _target_arg(parser)
    common.add_json_option(parser)
    parser.set_defaults(func=cmd_resume)
    parser = subparsers.add_parser(
        "pool-state", help="show paused, draining and drained pools",
        description="One row per configured pool: State (active, paused, draining, drained,"
                    " empty), Source (operator or maintenance), By, Since, Reason, the"
                    " Spare / In Use / Deleting node counts, and the Next Window.")
    _target_arg(parser, optional=True)
    common.add_json_option(parser)
    parser.set_defaults(func=cmd_pool_state)
