"""The `nodepool` command-line tool: operator commands against a running installation.

Owns: argument parsing (global `-c/--config`, `-s/--secure`, `-l/--logconfig`,
`--env-file`, `--debug`, `--version`) and the subcommand table. Each subcommand is one
`_add_<name>(subparsers)` function that registers its parser and sets `func` to a
`cmd_<name>(args) -> int` handler; add new ones to `SUBCOMMANDS`.

The handlers of the ZooKeeper commands live in `commands_list` (list, request-list,
label-list, info: read-only) and `commands_node` (delete, hold); `common` opens the session.

How it fails: handlers return the exit status (0 success, 1 failure) and print problems to
stderr; `main` never lets a `NodepoolError` escape as a traceback (ZooKeeper unreachable,
unknown node, locked node, invalid configuration: one line, exit 1). argparse usage errors
exit 2; Ctrl-C exits 130; a closed pipe on stdout exits 1 quietly.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

from nodepool_k8s import __version__
from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.commands_list import (cmd_info, cmd_label_list, cmd_list,
                                            cmd_pool_list, cmd_request_list)
from nodepool_k8s.cmd.commands_pool import add_parsers as _add_pool_control
from nodepool_k8s.cmd.commands_show import add_events, add_show
from nodepool_k8s.config.loader import load_config
from nodepool_k8s.core.errors import ConfigError, NodepoolError
from nodepool_k8s.runtime import envfile, logconfig

DEFAULT_CONFIG = "/etc/nodepool/nodepool.yaml"
# What the systemd unit (etc/nodepool-launcher.service) runs the launcher with: the CLI finds
# the same files without retyping them.
DEFAULT_SECURE = "/etc/nodepool/secure.conf"
DEFAULT_ENV_FILE = "/etc/default/nodepool-launcher"

Subparsers = Any  # argparse's _SubParsersAction is private


def cmd_delete(args: argparse.Namespace) -> int:
    # Imported when used: the deleter and the drivers are a sixth of every other command's
    # start-up (`nodepool list` included).
    from nodepool_k8s.cmd import commands_node
    return commands_node.cmd_delete(args)


def cmd_hold(args: argparse.Namespace) -> int:
    from nodepool_k8s.cmd import commands_node
    return commands_node.cmd_hold(args)


def cmd_config_validate(args: argparse.Namespace) -> int:
    """Load the configuration exactly as the launcher would; problems to stderr, exit 1."""
    try:
        config = load_config(args.config, args.secure, env=args.env)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(line, file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(warning, file=sys.stderr)
    return 0


def _add_config_validate(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "config-validate", help="check the configuration (exit 1 with the problems)",
        description="Validate the configuration and the secure file the way the launcher"
                    " loads them. Prints one problem per line to stderr and exits 1, or exits"
                    " 0 (warnings, if any, go to stderr).")
    parser.set_defaults(func=cmd_config_validate)


def _add_list(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "list", help="list nodes",
        description="List every node: ID, Provider, Label, Server ID, Public IPv4, IPv6,"
                    " State, Age, Locked. Secrets (a Kubernetes node's connection data)"
                    " are shown as 'redacted'.")
    parser.add_argument("--detail", action="store_true",
                        help="add Pool, Hostname, Private IPv4, AZ, Username, Port, Launcher,"
                             " Allocated To, Hold Job, Comment, User Data, Driver Data,"
                             " Token Expires, Host ID (the Kubernetes node of a pod),"
                             " Reason (why a node failed) and Drifted (built from an older"
                             " configuration of its label than the one loaded here)")
    common.add_json_option(parser, "/node-list")
    parser.set_defaults(func=cmd_list)


def _add_delete(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "delete", help="delete nodes",
        description="Mark a node 'deleting' (its launcher deletes it), or with --now delete"
                    " its resource and record here. Nodes locked by another client (Zuul"
                    " holds the lock while a job runs) are refused unless --force is given.")
    parser.add_argument("id", type=common.node_id_arg, nargs="+",
                        help="node id (digits; leading zeros may be omitted); several may be"
                             " given: each is deleted, a failure is reported and the rest go"
                             " on (exit 1 if any failed)")
    parser.add_argument("--now", action="store_true",
                        help="delete the resource through the configured provider and remove"
                             " the node record, in the foreground")
    parser.add_argument("--force", action="store_true",
                        help="break the lock of another client (a running job loses the node)")
    _add_lock_timeout(parser)
    parser.set_defaults(func=cmd_delete)


def _add_hold(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "hold", help="hold a node",
        description="Put a node in state 'hold' so it is kept (until max-hold-age) for"
                    " inspection. Nodes locked by another client are refused.")
    parser.add_argument("id", type=common.node_id_arg,
                        help="node id (digits; leading zeros may be omitted)")
    parser.add_argument("--reason", default=None,
                        help="stored as the node's comment (shown by list --detail)")
    _add_lock_timeout(parser)
    parser.set_defaults(func=cmd_hold)


def _add_lock_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock-timeout", type=common.seconds_arg, default=common.LOCK_TIMEOUT,
                        metavar="SECONDS",
                        help=f"how long to wait for the node lock (default:"
                             f" {common.LOCK_TIMEOUT:g})")


def _add_request_list(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "request-list", help="list node requests",
        description="List node requests: Request ID, Priority (relative priority), State,"
                    " Requestor, Node Types, Nodes, Declined By, Event ID, Age (since"
                    " submission).")
    parser.add_argument("--detail", action="store_true",
                        help="add Declined Reasons (pool id: reason, per declining pool) and"
                             " Waiting (pool id: why the request waits there)")
    common.add_json_option(parser, "/request-list")
    parser.set_defaults(func=cmd_request_list)


def _add_label_list(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "label-list", help="list the labels running pools serve",
        description="List the labels that the registered (running) pools support.")
    common.add_json_option(parser, "/label-list")
    parser.set_defaults(func=cmd_label_list)


def _add_info(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "info", help="show a provider's nodes and registered pools",
        description="Show the nodes of PROVIDER (ID, Server ID, State, Label, Pool) and the"
                    " pools registered for it (Pool, Pool ID, Hostname, Supported Labels,"
                    " Paused, State).")
    parser.add_argument("provider", help="provider name")
    common.add_json_option(parser)
    parser.set_defaults(func=cmd_info)


# Each entry registers one subcommand.
def _add_pool_list(subparsers: Subparsers) -> None:
    parser = subparsers.add_parser(
        "pool-list", help="show each running pool's status",
        description="Show one status per running pool, combined from every launcher"
                    " serving it (listed in Launchers, a paused or not ready one noted): its"
                    " conditions (Validated, AtTarget, Quota, Capacity, Credentials,"
                    " ApiReachable; the reason in the table, every detail with --json; the"
                    " worst launcher's wins), suspended labels, drifted spares, nodes by"
                    " state, launches in progress and the requests that wait on it"
                    " (queued), summed over the launchers.")
    common.add_json_option(parser, "/pool-list")
    parser.set_defaults(func=cmd_pool_list)


SUBCOMMANDS: list[Callable[[Subparsers], None]] = [
    _add_config_validate,
    _add_list,
    _add_delete,
    _add_hold,
    _add_request_list,
    _add_label_list,
    _add_info,
    _add_pool_control,  # pause, drain, resume, pool-state
    add_show,
    add_events,
    _add_pool_list,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodepool",
                                     description="Operate a nodepool_k8s installation.")
    parser.add_argument("-c", "--config", default=None,
                        help="main configuration file (default: $NODEPOOL_CONFIG, else"
                             f" {DEFAULT_CONFIG})")
    parser.add_argument("-s", "--secure", default=None,
                        help="secure file overriding the ZooKeeper keys (default:"
                             f" $NODEPOOL_SECURE, else {DEFAULT_SECURE} if it exists)")
    parser.add_argument("-l", "--logconfig", default=None,
                        help="logging configuration (.yaml/.json dictConfig or INI), as the"
                             " launcher's -l")
    parser.add_argument("--env-file", default=None, metavar="FILE",
                        help="KEY=VALUE lines (systemd EnvironmentFile syntax) whose NODEPOOL_*"
                             " values the configuration may substitute; the environment wins"
                             f" (default: $NODEPOOL_ENV_FILE, else {DEFAULT_ENV_FILE} if it"
                             " exists)")
    parser.add_argument("--debug", action="store_true", help="log debug messages to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for add in SUBCOMMANDS:
        add(subparsers)
    # Accept the global options after the subcommand too (`nodepool list -c FILE`); there
    # they only override what was given before it.
    for sub in subparsers.choices.values():
        sub.add_argument("-c", "--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("-s", "--secure", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("-l", "--logconfig", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--env-file", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
    return parser


def resolve_files(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Fill in `-c`, `-s` and `--env-file` from the environment and the unit's defaults;
    `args.env` becomes `env` with the env file's NODEPOOL_* values added (set ones win)."""
    args.env = dict(env)
    if args.config is None:
        args.config = env.get("NODEPOOL_CONFIG") or DEFAULT_CONFIG
    if args.secure is None:
        args.secure = env.get("NODEPOOL_SECURE") or (
            DEFAULT_SECURE if os.path.exists(DEFAULT_SECURE) else None)
    path = args.env_file or env.get("NODEPOOL_ENV_FILE")
    if path is None and os.path.exists(DEFAULT_ENV_FILE):
        path = DEFAULT_ENV_FILE
    if path is None:
        return
    for key, value in envfile.read(path).items():
        if key.startswith("NODEPOOL_"):
            args.env.setdefault(key, value)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.logconfig is not None:
            logconfig.setup(args.logconfig, debug=args.debug)
        else:
            logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        resolve_files(args, os.environ)
    except ConfigError as exc:
        print(f"nodepool: {exc}", file=sys.stderr)
        return 1
    # As the program (no `argv`), the quiet lasts until the process exits: an abandoned
    # connection attempt's thread (zk/client.py) can still log kazoo's "Failed
    # connecting" after the command printed its one-line outcome. Called with `argv`
    # (tests, other programs), the levels are restored when the command returns.
    with _quiet_connection_logs(not args.debug, restore=argv is not None):
        try:
            return int(args.func(args))
        except NodepoolError as exc:
            print(f"nodepool {args.command}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"nodepool {args.command}: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:
            # `nodepool list | head`: the reader is gone. Silence the flush at exit too.
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):  # stdout is not a file descriptor (tests)
                pass
            return 1


# Connection retries are logged by kazoo and our client once per attempt; a command reports
# the outcome in one line instead (`--debug` shows them).
_CHATTY_LOGGERS = ("kazoo", "nodepool_k8s.zk.client")


@contextmanager
def _quiet_connection_logs(quiet: bool, restore: bool = True) -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in _CHATTY_LOGGERS}
    if quiet:
        for name in _CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        if restore:
            for name, level in saved.items():
                logging.getLogger(name).setLevel(level)


if __name__ == "__main__":
    sys.exit(main())
