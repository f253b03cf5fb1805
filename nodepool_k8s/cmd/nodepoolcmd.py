"""The `nodepool` command-line tool: operator commands against a running installation.

Owns: argument parsing (global `-c/--config`, `-s/--secure`, `--debug`, `--version`) and the
subcommand table. Each subcommand is one `_add_<name>(subparsers)` function that registers its
parser and sets `func` to a `cmd_<name>(args) -> int` handler; add new ones to `SUBCOMMANDS`.

How it fails: handlers return the exit status (0 success, 1 failure) and print problems to
stderr; `main` never lets a `NodepoolError` escape as a traceback. argparse usage errors exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable, Sequence

from nodepool_k8s import __version__
from nodepool_k8s.config.loader import load_config
from nodepool_k8s.exceptions import ConfigError, NodepoolError

DEFAULT_CONFIG = "/etc/nodepool/nodepool.yaml"

Subparsers = Any  # argparse's _SubParsersAction is private


def cmd_config_validate(args: argparse.Namespace) -> int:
    """Load the configuration exactly as the launcher would; problems to stderr, exit 1."""
    try:
        config = load_config(args.config, args.secure)
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


# Each entry registers one subcommand.
SUBCOMMANDS: list[Callable[[Subparsers], None]] = [
    _add_config_validate,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodepool",
                                     description="Operate a nodepool_k8s installation.")
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG,
                        help=f"main configuration file (default: {DEFAULT_CONFIG})")
    parser.add_argument("-s", "--secure", default=None,
                        help="secure file overriding zookeeper-servers and zookeeper-tls")
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
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except NodepoolError as exc:
        print(f"nodepool {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
