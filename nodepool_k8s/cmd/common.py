"""Plumbing shared by the `nodepool` subcommands that talk to ZooKeeper.

Owns: opening one short-lived ZooKeeper session from `-c/-s` (the configuration's
`zookeeper-servers`, `zookeeper-tls` and chroot), node id normalisation, and printing
results as a table or as JSON (the same views and keys as the web app, from `views`).

A command that only needs ZooKeeper works with a configuration that has errors elsewhere
(`config.loader.load_connection`): it warns once with the first problem and goes on with
the ZooKeeper keys alone; a command that needs providers or pools (`session(full=True)`,
or `require_full`) refuses with the whole file's problems. A ZooKeeper root that holds no
Nodepool data gets a warning (usually a wrong chroot), not a silent empty listing.

How it fails: a problem the operator must fix raises `CliError` (a `NodepoolError`) whose
message is the one line `nodepool` prints before exiting 1. An invalid configuration raises
`ConfigError`; ZooKeeper not answering within `CONNECT_TIMEOUT` raises `ZkConnectionError`.
Nothing here retries forever: a command either finishes or fails within seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from nodepool_k8s.views import listing
from nodepool_k8s.runtime import validate
from nodepool_k8s.config.loader import load_config, load_connection
from nodepool_k8s.config.model import Config, with_installation_id
from nodepool_k8s.core.errors import ConfigError, NodepoolError
from nodepool_k8s.zk import admin, paths
from nodepool_k8s.zk.client import ZkClient, ZkSettings
from nodepool_k8s.zk.identity import InstallationIdError
from nodepool_k8s.zk.identity import settle as settle_installation_id
from nodepool_k8s.zk.nodes import NodeStore
from nodepool_k8s.zk.reader import ZkReader

# Long enough for a TLS handshake to a remote ensemble, short enough that a typo in the
# configuration does not look like a hang.
CONNECT_TIMEOUT = 5.0
# Nodepool's CLI waits this long for a node lock.
LOCK_TIMEOUT = 5.0
NODE_ID_DIGITS = 10


class CliError(NodepoolError):
    """A problem the operator has to act on; the message is printed as is."""


@dataclass
class Session:
    """A loaded configuration with an open ZooKeeper session."""

    config: Config
    zk: ZkClient
    reader: ZkReader
    nodes: NodeStore
    # The whole file's problems when only its ZooKeeper keys could be used.
    config_error: ConfigError | None = None


@contextmanager
def session(args: argparse.Namespace, full: bool = False) -> Iterator[Session]:
    """Load `-c/-s`, connect (bounded), yield, and always close the session.

    `full`: the command needs the providers and pools, so the whole file must be valid."""
    env = getattr(args, "env", None) or os.environ
    if full:
        config, problem = load_config(args.config, args.secure, env=env), None
    else:
        config, problem = load_connection(args.config, args.secure, env=env)
        if problem is not None:
            first = str(problem).splitlines()
            warn(f"the configuration has errors ({first[0] if first else problem}); using"
                 " only its ZooKeeper settings (see `nodepool config-validate`)")
    client = admin.connect(ZkSettings.from_config(config), CONNECT_TIMEOUT)
    try:
        if client.exists(paths.ROOT) is None:
            warn(f"ZooKeeper {config.zk_hosts()} holds no Nodepool data (no {paths.ROOT}):"
                 " check the chroot of zookeeper-servers")
        yield Session(config, client, ZkReader(client), NodeStore(client), problem)
    finally:
        client.stop()


def require_full(s: Session, what: str) -> None:
    """Refuse `what` when the session runs on the ZooKeeper keys of a broken configuration."""
    if s.config_error is not None:
        raise CliError(f"{what} needs a valid configuration:\n{s.config_error}")


def with_identity(s: Session) -> Session:
    """`s` with the installation id settled, for a command that deletes cloud objects
    (`delete --now`): by the launcher's rules (the configuration, else the file the launcher
    pinned it in, checked against ZooKeeper; never taken from ZooKeeper alone). The CLI
    only reads: it pins and records nothing. A conflict is a `CliError`."""
    config = s.config
    try:
        settled = settle_installation_id(
            s.zk, configured=config.installation_id
            if config.installation_id_explicit else None,
            derived=config.installation_id, state_file=config.installation_id_file,
            write=False)
    except InstallationIdError as exc:
        raise CliError(f"installation id: {exc}") from exc
    return dataclasses.replace(s, config=with_installation_id(config, settled.value))


def node_id(text: str) -> str:
    """Accept `3` for `0000000003`: node ids are ZooKeeper's 10-digit sequence numbers.

    Anything but ASCII digits is refused (ValueError): an id becomes a ZooKeeper path, so
    `..`, `/` or other text must never reach one. Longer all-digit ids are kept as given
    (the protocol's sequence numbers may outgrow 10 digits)."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"a node id is digits only (e.g. 0000000042), got {text!r}")
    return text.zfill(NODE_ID_DIGITS)


def node_id_arg(text: str) -> str:
    """`node_id` as an argparse type: a bad id is a usage error (exit 2)."""
    try:
        return node_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_arg(text: str) -> float:
    """A finite, non-negative number of seconds, as an argparse type (NaN, inf refused)."""
    try:
        return validate.finite_number(text, allow_zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def now() -> float:
    return time.time()


def emit(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]],
         as_json: bool) -> None:
    """Print rows as Nodepool's table, or as the web app's JSON list."""
    text = listing.render_json(rows) if as_json else listing.render_table(rows, columns)
    sys.stdout.write(text + "\n")


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def add_json_option(parser: argparse.ArgumentParser, endpoint: str | None = None) -> None:
    """`--json`; `endpoint`: the web app's endpoint answering the same JSON, if one does."""
    same = f" (the same keys as the web app's {endpoint})" if endpoint else ""
    parser.add_argument("--json", action="store_true",
                        help=f"print the records as JSON instead of a table{same}")
