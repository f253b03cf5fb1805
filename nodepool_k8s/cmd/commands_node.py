"""The `nodepool` subcommands that change a node: delete and hold.

Owns: the operator's side of the node lock protocol. Every change is made while holding the
node's lock (`/nodepool/nodes/<id>/lock`, the kazoo recipe Zuul and the launchers use), on
a copy re-read after locking, with a versioned write; the lock is then released.

- `delete`: lock (waiting up to `--lock-timeout`, 5 s), write `deleting`, unlock; the
  launcher serving the node's provider deletes the resource and the znode (it removes
  unlocked `deleting` nodes). `--now` does that work here instead, with the launcher's own
  protocol (`launcher.deleter.delete_locked`): the provider is built from the
  configuration, the resource deleted, then the znode removed with its lock. A
  resource that is not provably this installation's (and this node's) is not touched: the
  reason is written to the record as `delete_refused`, the command says so on stderr, and
  the znode is removed all the same (exactly what the launcher does).
- A node whose record cannot be decoded (see `records`: malformed, empty, out-of-range
  numbers) is refused by plain `delete`, which names `--now`; `--now` removes its znode
  and lock dir only (under its lock, and only while the data is still what was judged
  unreadable) and touches nothing in the cluster: nothing such a record names can be
  trusted. The command says so on stderr.
- A node whose lock is held by someone else (Zuul holds it for the whole job, a launcher
  while building or deleting) is refused, naming the reason. `--force` breaks that lock
  (see `zk.admin.break_lock`): the holder's lock contender is removed, the node is locked
  by us, re-read and marked `deleting`. The holder is not asked: a running job loses its
  node; a launcher notices at its next write (its writes check its lock) and stops.
- `hold`: lock, write `hold` with the reason as `comment`, unlock. Nodes being deleted
  and nodes locked by someone else are refused; there is no `--force`.

How it fails: `CliError` for unknown ids, locked nodes, a provider missing from the
configuration (`--now`) and a resource that could not be deleted (the node then stays
`deleting`, unlocked, so its launcher retries). Lock-protocol errors from `zk` propagate as
`NodepoolError`s; the lock is always released on the way out.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable

from nodepool_k8s.core import model, records
from nodepool_k8s.views import listing
from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.common import CliError, Session
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver import registry
from nodepool_k8s.driver.base import Deletion, Gone, Provider, delete_and_wait
from nodepool_k8s.core.errors import NodepoolError, NotFound, NotOwned
from nodepool_k8s.launcher.upkeep import deleter
from nodepool_k8s.core.model import Node
from nodepool_k8s.core.transition import transition
from nodepool_k8s.zk import admin, paths
from nodepool_k8s.zk import nodes as node_codec
from nodepool_k8s.zk.errors import VersionConflict
from nodepool_k8s.zk.locks import HeldLock

GONE_STATES = (model.NodeState.DELETING, model.NodeState.DELETED)
DEFAULT_HOLD_REASON = "held with nodepool hold"
NOW_REASON = "deleted with nodepool delete --now"
DELETE_REASON = "deleted with nodepool delete"


@dataclass
class Locked:
    """A node we hold locked, freshly read."""

    node: Node
    lock: HeldLock


# -- shared ------------------------------------------------------------------------------------

def _locked_by_other(node_id: str) -> str:
    return f"node {node_id} is locked by another client (in use?)"


def _require_node(s: Session, node_id: str) -> Node:
    """The node's record; unknown ids and unreadable records raise."""
    node = s.nodes.get(node_id)
    if node is not None:
        return node
    if s.zk.exists(paths.node_path(node_id)) is None:
        raise CliError(f"node {node_id} not found")
    raise CliError(f"node {node_id} has an unreadable record (empty or not a node); it"
                   " cannot be changed with this command")


def _unreadable(s: Session, node_id: str) -> tuple[str, int] | None:
    """(why, data version) when the node's znode holds no usable record, None when it
    holds one; unknown ids raise."""
    found = s.zk.get(paths.node_path(node_id))
    if found is None:
        raise CliError(f"node {node_id} not found")
    try:
        node_codec.decode(node_id, found[0], found[1].version)
    except records.Malformed as exc:
        return exc.reason, found[1].version
    return None


def _lock(s: Session, node_id: str, timeout: float) -> Locked | None:
    """Lock and re-read; None when someone else kept the lock. Unknown ids raise."""
    got = s.nodes.lock_and_read(node_id, blocking=True, timeout=timeout)
    if got is not None:
        return Locked(got[1], got[0])
    _require_node(s, node_id)  # raises unless it exists: then it is locked elsewhere
    return None


def _force_lock(s: Session, node_id: str) -> Locked:
    """Take the lock from its holder (delete --force) and re-read the node under it."""
    try:
        broken = admin.break_lock(s.zk, paths.node_lock_path(node_id))
    except NotFound as exc:  # the lock dir's parent, the node, is gone
        raise CliError(f"node {node_id} not found") from exc
    if broken.removed:
        common.warn(f"node {node_id}: broke the lock held by another client (removed "
                    f"{len(broken.removed)} lock contender(s)); its holder loses the node")
    node = s.nodes.get(node_id)
    if node is None:
        broken.held.release()
        _require_node(s, node_id)  # names the problem (gone, unreadable)
        raise CliError(f"node {node_id} changed while it was being locked; try again")
    return Locked(node, broken.held)


def _print_node(node: Node, locked: bool = False) -> None:
    rows = [listing.node_row(listing.NodeView(node, locked), common.now())]
    common.emit(rows, listing.NODE_COLUMNS, as_json=False)


def _mark(node: Node, state: model.NodeState, why: str = "") -> None:
    transition(node, state, common.now(), message=why)


# -- delete ------------------------------------------------------------------------------------

def cmd_delete(args: argparse.Namespace) -> int:
    """Delete each node given; one failure is reported and the others are still done."""
    ids = [common.node_id(i) for i in args.id]
    failed = 0
    with common.session(args) as s:
        for node_id in dict.fromkeys(ids):  # once each, in the order given
            try:
                _delete(s, node_id, args)
            except NodepoolError as exc:
                if len(ids) == 1:
                    raise
                print(f"nodepool delete: {node_id}: {exc}", file=sys.stderr)
                failed += 1
    return 1 if failed else 0


def _delete(s: Session, node_id: str, args: argparse.Namespace) -> None:
    unreadable = _unreadable(s, node_id)
    if unreadable is not None:
        if not args.now:
            raise CliError(
                f"node {node_id} has an unreadable record ({records.clip(unreadable[0])});"
                " nothing in it can be trusted, so no launcher will delete it: use"
                f" `nodepool delete --now {node_id}` to remove the record (only the"
                " record: nothing in the cluster is touched)")
        _remove_unreadable(s, node_id, args)
        return
    if args.now:
        # Only a deletion in the cluster needs to know which installation is ours.
        s = common.with_identity(s)
    seen = _require_node(s, node_id)
    if args.now:
        # Refuse before touching the node when the resource could not be deleted here.
        _provider_config(s, seen)
    locked = _lock(s, node_id, args.lock_timeout)
    if locked is None:
        if not args.force:
            raise CliError(f"{_locked_by_other(node_id)}; use --force to delete it anyway")
        locked = _force_lock(s, node_id)
    try:
        node = locked.node
        if args.now:
            _delete_now(s, locked)
        elif node.state not in GONE_STATES:  # else already on its way: no write
            _mark(node, model.NodeState.DELETING, DELETE_REASON)
            s.nodes.store_and_release(node, locked.lock)
    finally:
        locked.lock.release()
    _print_node(node)


def _provider_config(s: Session, node: Node) -> ProviderConfig | None:
    """The configured provider whose resource `--now` must delete (None: nothing to delete)."""
    if node.provider is None or not node.external_id or node.state == model.NodeState.DELETED:
        return None
    common.require_full(s, "--now")
    provider = s.config.providers.get(node.provider)
    if provider is None:
        raise CliError(
            f"node {node.id} belongs to provider {node.provider!r}, which is not in the"
            f" configuration {s.config.sources[0] if s.config.sources else ''}; --now needs"
            " it to delete the resource (without --now the provider's launcher deletes it)")
    return provider


def _delete_now(s: Session, locked: Locked) -> None:
    """The launcher's deletion protocol (`launcher.deleter.delete_locked`), in the
    foreground: `deleting`, resource, znode."""
    node = locked.node
    provider_config = _provider_config(s, node)
    resource = _Resource(provider_config, node.id) if provider_config is not None else None
    try:
        done = deleter.delete_locked(s.nodes, node, locked.lock, resource, now=common.now,
                                     reason=NOW_REASON)
    finally:
        if resource is not None:
            resource.stop()
    if not isinstance(done, deleter.Removed):  # `_Resource` waits: not expected
        raise CliError(f"node {node.id}: {done.detail}; the node stays in state deleting and"
                       " its launcher finishes it")
    if done.refused is not None:
        common.warn(f"node {node.id}: NOT deleting {node.external_id} of provider"
                    f" {node.provider}: {done.refused}; only the node record is removed")
    if done.removal is deleter.Removal.CONTENDED:
        common.warn(f"node {node.id}: other clients keep contending for its lock; it is left"
                    " in state deleted for a launcher to remove")
    _mark(node, model.NodeState.DELETED)


def _remove_unreadable(s: Session, node_id: str, args: argparse.Namespace) -> int:
    """`delete --now` of a node whose record cannot be decoded: its znode and lock dir
    only, under its lock, and only while the data is the unreadable data we judged. No
    cloud resource is touched: which one such a record names (if any, and whose) cannot
    be trusted."""
    held = s.nodes.lock(node_id, blocking=True, timeout=args.lock_timeout)
    if held is None:
        if s.zk.exists(paths.node_path(node_id)) is None:
            raise CliError(f"node {node_id} not found")
        if not args.force:
            raise CliError(f"{_locked_by_other(node_id)}; use --force to delete it anyway")
        try:
            broken = admin.break_lock(s.zk, paths.node_lock_path(node_id))
        except NotFound as exc:
            raise CliError(f"node {node_id} not found") from exc
        if broken.removed:
            common.warn(f"node {node_id}: broke the lock held by another client (removed "
                        f"{len(broken.removed)} lock contender(s))")
        held = broken.held
    try:
        # Judged again under the lock: it may have been rewritten (or removed) meanwhile.
        unreadable = _unreadable(s, node_id)
        if unreadable is None:
            raise CliError(f"node {node_id} was rewritten with a readable record while it"
                           " was being locked; try again")
        try:
            removed = s.nodes.delete_unreadable(node_id, held, unreadable[1])
        except VersionConflict as exc:
            raise CliError(f"node {node_id} was rewritten while it was being removed;"
                           " try again") from exc
    finally:
        held.release()
    if not removed:
        raise CliError(f"node {node_id}: other clients keep contending for its lock; its"
                       " record was not removed, try again")
    common.warn(f"node {node_id}: removed its unreadable record ({records.clip(unreadable[0])})"
                " and its lock, nothing else: nothing in such a record can be trusted, so"
                " no cluster resource was deleted (one of this installation labelled with"
                " this node id is a leak now, for its launcher's leak sweep)")
    return 0


class _Resource:
    """The node's provider, built from the configuration and started on first use; its
    errors other than `NotOwned` become a `CliError` (the node stays `deleting`)."""

    def __init__(self, config: ProviderConfig, node_id: str) -> None:
        self._config = config
        self._node_id = node_id
        self._provider: Provider | None = None
        self._started = False

    def delete(self, external_id: str, node_id: str | None = None,
               wake: Callable[[], None] | None = None, verify: bool = False) -> Deletion:
        # The command waits until the resource is gone (within the provider's
        # `delete-timeout`): never `Underway`.
        if self._provider is None:
            self._provider = registry.make_provider(self._config)
        try:
            if not self._started:
                self._started = True
                self._provider.start()
            delete_and_wait(self._provider, external_id, node_id,
                            timeout=float(self._config.delete_timeout))
        except NotOwned:
            raise
        except NodepoolError as exc:  # the driver contract: TemporaryError (or config error)
            raise CliError(f"could not delete {external_id} of node {self._node_id} ({exc});"
                           " the node stays in state deleting and its launcher retries"
                           ) from exc
        return Gone()

    def stop(self) -> None:
        if self._provider is not None:
            self._provider.stop()


# -- hold --------------------------------------------------------------------------------------

def cmd_hold(args: argparse.Namespace) -> int:
    node_id = common.node_id(args.id)
    with common.session(args) as s:
        locked = _lock(s, node_id, args.lock_timeout)
        if locked is None:
            raise CliError(f"{_locked_by_other(node_id)}; cannot hold it")
        node = locked.node
        try:
            if node.state in GONE_STATES:
                raise CliError(f"node {node_id} is being deleted (state {node.state});"
                               " cannot hold it")
            _mark(node, model.NodeState.HOLD)
            node.set(comment=args.reason or DEFAULT_HOLD_REASON)
            s.nodes.store_and_release(node, locked.lock)
        finally:
            locked.lock.release()
    _print_node(node)
    return 0
