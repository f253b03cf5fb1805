"""Serialising quota decisions across launcher processes, without a lock round trip.

Owns: the guard znodes (`/nodepool_k8s/guards/provider-<name>`, `tenant-<name>`,
`min-ready`) and the authoritative usage read. A decision that adds usage ("create these
node znodes", "create these min-ready requests") is made like this:

1. take the version `v` of every guard that covers the decision: counted from the guards'
   persistent watch where it may (zk/guard_versions.py; see "Versions without reading"
   below), else read;
2. read usage authoritatively: the ids of every node that exists, from the node cache
   (see "Which nodes exist" below) or else the child list of `/nodepool/nodes` (sent
   together with step 1: one round trip, answered in order), with records from the
   cache, from this process's own record of nodes it just created, and a pipelined fetch
   of every other id the cache does not have yet;
3. check the limits (pure `quota` functions);
4. commit one transaction: `set(guard, version=v)` for each guard plus the creates.

Every launcher creates nodes only this way, so if the commit succeeds no other creation
covered by the same guard happened between steps 1 and 4, and step 2 saw every node
created before `v` (ZooKeeper's per-session ordering). A concurrent decision makes
the commit fail with `VersionConflict` on a guard; the caller re-reads and decides again.

Which nodes exist, without listing them (`QuotaGuard(nodes=...)`, the node cache on a
persistent recursive watch of `/nodepool/nodes`): ZooKeeper orders a connection's watch
events with its other events, watches and replies, in the order the service applied the
changes (Programmer's Guide, "What ZooKeeper Guarantees about Watches"); the server
applies a transaction whole, and queues its watch events on the connection as it does,
before it serves a later read. So when the answer to our `exists` of a guard (version
`v`) arrives, the creation event of every node the server had created by then (by any
client, guarded or not) came before it on the same connection. kazoo reads a connection's
messages one at a time on its connection thread; the persistent watch's listener
(`_kazoo_ext.RecursiveWatches`) runs inside that read, and the cache's listener applies a
creation or deletion to the cache's set of names there and then, before kazoo reads the
next message, let alone hands an answer to its caller (`ChildMirror.children_through`).
So once the caller holds the answer, the cache's names hold every node created before
`v`, those created before the watch was added on this connection coming from the listing
its resync took after adding it. Nodes deleted meanwhile are missing, and rightly (they
are gone: the listing would have over-counted them); nodes created since may be there
(over-counting, which only errs on the safe side, and a guarded one fails the commit
anyway). So the ids count every node the listing would have, and step 4 checks the rest
as before: one round trip, no listing (with ten thousand nodes, a ten-thousand-name answer
to decode per decision). The listing is read instead, after the versions, whenever that
chain does not hold: no persistent watches (a server before 3.6, or switched off), the
cache not synced or resyncing, a reconnect between sending the read and reading its
answer, or an answer on another connection than the one the cache's watch and listing
were made on.

Versions without reading (`GuardVersions`, with the node cache only): the guards' persistent
watch delivers, on the same connection and the same kazoo thread as the node cache's, one
data-change event per guard bump, in the order the server applied the changes, so a guard's
version is known from one `exists` answer on the connection plus the events counted since
(zk/guard_versions.py says why that is exact). A decision takes the counted versions first,
then the cache's names, on the same connection: every event read before the count was
taken was applied to the names before it. Our transactions put the guard bumps after the
creates (`add_bumps` appends them to the transaction; the server applies a multi's
operations and queues their events in order), so the creation events of the nodes a commit
made come before the event of that commit's bump: when the count includes a bump, the
names include that commit's nodes, and so every node created under a version up to the
one counted (those created since are there or not: over-counting at worst). Counted
versions are those of a moment a little before the decision (the last event read), not of
an answer to a request sent now: a bump made since but not yet read makes the commit fail
on the guard, as a read answer overtaken by another launcher's commit does, and the retry
counts it (its event came before our failure's answer; `GuardVersions.conflicted`). The
version is read instead, with the ids after its answer as above, whenever that chain does
not hold (a new connection, a guard not read on it yet, re-created, or in doubt after a
failed commit). A guard counted on needs no read at all: `known_listing` gives way to it.

The guard bump rides inside the transaction that creates the nodes, so serialisation costs
no extra write. Deleting nodes needs no guard (usage only goes down). `commit_guarded` is
that loop, written once (the request handler and min-ready use it).

Node `provider`, `pool` and `resources` never change after creation, so cached copies of
existing nodes are exact for provider and pool usage. A node's `tenant_name` can change
when a ready node is reused; tenant usage of such nodes is as fresh as the cache.

What it holds, bounded: the nodes this process created that the cache did not show yet
(`note_created`), for at most `CREATED_TRUST` seconds each: a node the cache has not shown
by then (it may already be gone: created, launched, used and deleted between two
decisions) is read like any other missing id, counted if it exists and dropped if not. So
the table holds at most the nodes created in the last `CREATED_TRUST` seconds, and the
remembered listing never keeps a deleted node's id for longer than that. It also keeps the
usage record of each node-cache entry it priced (`UsageMemo`), bounded by twice the
entries the cache still holds.
"""

from __future__ import annotations

import enum
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Protocol, Sequence, TypeVar

from nodepool_k8s.core import quota
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.core.model import Resources
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.guard_versions import GuardVersions
from nodepool_k8s.zk.nodes import parse
from nodepool_k8s.zk.txn import Txn


R = TypeVar("R")

# Seconds a node this process created is priced from its own record while the cache does
# not show it; the cache normally shows it within milliseconds.
CREATED_TRUST = 30.0


class Contended(enum.Enum):
    """Every attempt of `commit_guarded` lost to a concurrent decision."""

    CONTENDED = "contended"


CONTENDED = Contended.CONTENDED


@dataclass(frozen=True)
class GuardedWrite(Generic[R]):
    """What one attempt decided to write: the guard versions the decision was based on, the
    transaction (without the bumps) and what to return once it committed."""

    versions: dict[str, int]
    txn: Txn
    committed: Callable[[list[Any]], R]


def commit_guarded(zk: ZkClient, attempts: int,
                   attempt: Callable[[], "GuardedWrite[R] | R"],
                   guard: "QuotaGuard | None" = None) -> "R | Contended":
    """Steps 1-4 of the module docstring, retried on a guard conflict.

    `attempt()` reads the guard versions and decides: a `GuardedWrite` to commit (the guard
    bumps are added here), or any other value, which is returned as it is (nothing to
    write). On a conflict on one of the read guards the attempt is made again, up to
    `attempts` times (then CONTENDED); any other failure raises the typed cause. `guard`:
    the QuotaGuard whose versions `attempt` takes, told of each conflict (`conflicted`).
    """
    lost = 0
    for _ in range(attempts):
        decided = attempt()
        if not isinstance(decided, GuardedWrite):
            return decided
        write: GuardedWrite[R] = decided
        QuotaGuard.add_bumps(write.txn, write.versions)
        try:
            results = write.txn.commit(zk)
        except errors.TxnFailed as exc:
            if QuotaGuard.is_conflict(exc, write.versions):
                if guard is not None:
                    guard.conflicted(exc.path, write.versions[exc.path], again=lost > 0)
                lost += 1
                continue  # another launcher decided meanwhile: decide again
            raise exc.cause from exc
        return write.committed(results)
    return CONTENDED


class MirroredIds(Protocol):
    """The node cache as step 2 of the module docstring asks it (on the guard's client)."""

    @property
    def zk(self) -> ZkClient: ...

    def ids_through(self, connection: int) -> list[str] | None: ...


class NodeLookup(Protocol):
    def get(self, node_id: str) -> quota.NodeUsage | None: ...

    def unusable(self, node_id: str) -> bool:
        """Known to hold no usable record (malformed, unreadable): not counted."""
        ...


Fallback = Callable[[quota.NodeUsage], Resources | None]
# Which nodes a decision needs (e.g. "of this provider, or of this tenant"); None: all.
Keep = Optional[Callable[[quota.NodeUsage], bool]]


def usage_record(node: quota.NodeUsage, fallback: Fallback) -> quota.UsageRecord:
    """`node`'s usage; the label's quota (`fallback`) is looked up only for a node whose
    record carries no usable `resources`."""
    resources = quota.own_resources(node.resources)
    if resources is None:
        resources = quota.node_resources(None, fallback(node))
    return quota.UsageRecord(provider=node.provider, pool=node.pool, tenant=node.tenant_name,
                             resources=resources)


class UsageMemo:
    """The usage records of the node cache's entries, one per entry object.

    Every quota decision and every status pass prices the provider's nodes, so a burst
    priced each of its nodes hundreds of times. A cache entry is a summary (`summary`
    true): decoded once per record version, never changed afterwards (a new version is a
    new object), so its record is worked out once and reused while the cache holds that
    very object. Only records made from the node's own `resources` are kept: the label's
    quota a node without them counts for comes from the configuration, which a reload
    replaces, so those are made afresh each time. Whole records (nodes just created,
    records read directly) are never kept: they may be changed in place.

    Bounded: past twice the entries kept after the last pruning (at least MEMO_FLOOR), the
    entries the cache no longer holds (that object under that id) are dropped. Nodes of
    one label carry equal resources: records share one (immutable) Resources per distinct
    value, at most MEMO_FLOOR of them (forgotten all at once past that). Threads may race
    on it; the worst outcome is a record made twice.
    """

    MEMO_FLOOR = 1024

    def __init__(self) -> None:
        self._known: dict[str, tuple[quota.NodeUsage, quota.UsageRecord]] = {}
        self._limit = self.MEMO_FLOOR
        self._shared: dict[tuple[tuple[str, float], ...], Resources] = {}

    def __len__(self) -> int:
        return len(self._known)

    def record(self, node_id: str, node: quota.NodeUsage, fallback: Fallback,
               cache: "NodeLookup") -> quota.UsageRecord:
        known = self._known.get(node_id)
        if known is not None and known[0] is node:
            return known[1]
        resources = quota.own_resources(node.resources)
        if resources is None or not getattr(node, "summary", False):
            return usage_record(node, fallback)
        # Equal amounts compare equal across a zero's sign: a -0.0 keeps its own value.
        value = tuple((k, v) for k, v in resources.items() if v or math.copysign(1.0, v) > 0)
        shared = self._shared.get(value) if len(value) == len(resources) else resources
        if shared is None:
            if len(self._shared) >= self.MEMO_FLOOR:
                self._shared = {}
            shared = self._shared[value] = resources
        record = quota.UsageRecord(provider=node.provider, pool=node.pool,
                                   tenant=node.tenant_name, resources=shared)
        if len(self._known) >= self._limit:
            self._known = {k: v for k, v in self._known.items() if cache.get(k) is v[0]}
            self._limit = max(self.MEMO_FLOOR, 2 * len(self._known))
        self._known[node_id] = (node, record)
        return record


@dataclass
class _Known:
    versions: dict[str, int]
    ids: list[str]
    epoch: int


class QuotaGuard:
    def __init__(self, zk: ZkClient, clock: Clock = SYSTEM_CLOCK,
                 nodes: MirroredIds | None = None) -> None:
        """`nodes`: the node cache, whose ids replace the listing where they may (module
        docstring); it must follow `zk`'s connection, whose order the argument rests on."""
        if nodes is not None and nodes.zk is not zk:
            raise ValueError("the node cache must use the guard's ZooKeeper client")
        self.zk = zk
        self.clock = clock
        self.memo = UsageMemo()
        self._nodes = nodes
        # Step 1 without a request where it may (zk/guard_versions.py): with the node cache,
        # whose names on the same connection step 2 then takes.
        self._counts = GuardVersions(zk) if nodes is not None else None
        # Step 2's sources, counted: node ids taken from the cache, listings read.
        self.mirrored = 0
        self.listings = 0
        # Nodes this process created that the caller's cache may not show yet (their
        # provider, pool and resources never change), with when (monotonic) they were
        # noted: priced from here instead of being fetched again by the next decision.
        # Pruned as the cache catches up, and after CREATED_TRUST seconds regardless.
        self._created: dict[str, tuple[quota.NodeUsage, float]] = {}
        self._created_lock = threading.Lock()
        # The guards and the listing as this process's last guarded commit left them
        # (`remember`): the next decision may start from it instead of reading (one round
        # trip less per decision in a burst). The commit checks the guard versions, so a
        # decision made on it is exact or fails with a conflict, which reads afresh.
        self._known: _Known | None = None
        # Listed ids found gone since the last `remember`: a decision that began before
        # they were found still carries them, and must not put them back (the known
        # listing would otherwise grow by every node ever deleted, and each decision
        # would read them all again). Node ids are never reused, so dropping one found
        # gone is always safe.
        self._gone: set[str] = set()

    def read_listing(self, guard_paths: list[str]) -> tuple[dict[str, int], list[str]]:
        """`read(guard_paths)` and the node ids for `usage(ids=...)`, in one round trip.

        With the node cache: the guards' versions, then the cache's ids as they stand
        once that answer is read (module docstring, "Which nodes exist").
        Else, or when the cache cannot tell, the listing: pipelined, or read after the
        versions; either way ZooKeeper answers it after the guard reads (one session, in
        order), so it shows every node created before the versions read.

        The versions are counted instead of read where they may (zk/guard_versions.py):
        no request; the ids are then as of the last event kazoo's connection thread has
        read, which may lag a little behind an answer's, never behind the versions.
        """
        if self._nodes is not None:
            assert self._counts is not None
            versions, before, asked_on = self._counts.current(guard_paths)
            connection = asked_on
            unread = [path for path in guard_paths if path not in versions]
            if unread:
                found, connection = self.zk.exists_all(unread)
                if any(stat is None for stat in found):
                    # A guard's first use: create it, then the ordinary two steps.
                    return self.read(guard_paths), self._listing()
                self._counts.answered(unread, found, before, asked_on, connection)
                read = {path: stat.version for path, stat in zip(unread, found)
                        if stat is not None}
                versions = {path: versions.get(path, read.get(path, 0))
                            for path in guard_paths}
            # The ids after the versions, counted or read (module docstring).
            ids = self._nodes.ids_through(connection) if connection is not None else None
            if ids is not None:
                self.mirrored += 1
                return versions, ids
            return versions, self._listing()
        stats, children = self.zk.exists_and_children(guard_paths, paths.NODES)
        self.listings += 1
        if any(stat is None for stat in stats):
            return self.read(guard_paths), self._listing()
        versions = {path: stat.version for path, stat in zip(guard_paths, stats)
                    if stat is not None}
        return versions, self._ids(children)

    def _listing(self) -> list[str]:
        self.listings += 1
        return self._ids(self.zk.get_children(paths.NODES))

    def known_listing(self, guard_paths: list[str]
                      ) -> tuple[dict[str, int], list[str]] | None:
        """What `read_listing(guard_paths)` would return if nobody else has written since
        this process's last guarded commit over the same guards, or None.

        Nodes deleted since are still listed (deletions bump no guard): usage can only be
        over-counted, never under-counted, so a caller must re-read before it pauses or
        declines on it; `usage` drops ids it finds gone. None as well while the guards'
        versions are counted (`read_listing` then sends no request either, and its ids
        come from the node cache: no deleted node among them to read again)."""
        if self.counts(guard_paths):
            return None
        with self._created_lock:
            known = self._known
            if known is None or known.epoch != self.zk.epoch \
                    or set(known.versions) != set(guard_paths):
                return None
            return dict(known.versions), list(known.ids)

    def remember(self, versions: dict[str, int], ids: list[str],
                 created: Sequence[str]) -> None:
        """A guarded commit over `versions` (read with listing `ids`) created `created`."""
        with self._created_lock:
            gone, self._gone = self._gone, set()
            self._known = _Known({p: v + 1 for p, v in versions.items()},
                                 [i for i in ids if i not in gone] + list(created),
                                 self.zk.epoch)

    def counts(self, guard_paths: list[str]) -> bool:
        """Whether `read_listing(guard_paths)` would count every version now (no request)."""
        return self._counts is not None and self._counts.holds(guard_paths)

    @property
    def counted(self) -> int:
        """Guard versions taken from the counts instead of read (zk/guard_versions.py)."""
        return self._counts.counted if self._counts is not None else 0

    def conflicted(self, path: str, used: int, again: bool = False) -> None:
        """A commit on version `used` of guard `path` failed on it (`again`: not the
        decision's first failed commit): see `GuardVersions.conflicted`."""
        if self._counts is not None:
            self._counts.conflicted(path, used, again)

    def forget(self) -> None:
        """Another process wrote a guard: the next decision reads afresh."""
        with self._created_lock:
            self._known = None
            self._gone.clear()

    @staticmethod
    def _ids(children: list[str] | None) -> list[str]:
        return [c for c in (children or []) if paths.is_node_id(c)]

    def note_created(self, nodes: Sequence[quota.NodeUsage], ids: Sequence[str]) -> None:
        """Nodes just created by a guarded transaction of this process."""
        now = self.clock.monotonic()
        with self._created_lock:
            for node_id, node in zip(ids, nodes):
                self._created[node_id] = (node, now)

    def created_pending(self) -> int:
        """How many created nodes are priced from this process's own record."""
        with self._created_lock:
            return len(self._created)

    def read(self, guard_paths: list[str]) -> dict[str, int]:
        """Current versions of the guards (created on first use)."""
        versions: dict[str, int] = {}
        for path in guard_paths:
            stat = self.zk.exists(path)
            if stat is None:
                try:
                    self.zk.create(path, b"", makepath=True)
                except errors.NodeExistsError:
                    pass
                stat = self.zk.exists(path)
                if stat is None:
                    raise errors.ZkConnectionError(f"guard {path} vanished")
            versions[path] = stat.version
        return versions

    @staticmethod
    def add_bumps(txn: Txn, versions: dict[str, int]) -> None:
        for path, version in versions.items():
            txn.set(path, b"", version=version)

    @staticmethod
    def is_conflict(exc: errors.TxnFailed, versions: dict[str, int]) -> bool:
        return exc.path in versions and isinstance(exc.cause, errors.VersionConflict)

    def usage(self, cache: NodeLookup, fallback: Fallback,
              keep: Keep = None, ids: list[str] | None = None) -> list[quota.UsageRecord]:
        """Usage records of every node that exists now (see the module docstring), or of
        those `keep` accepts: a decision about one provider need not price the nodes of
        all others (with ten thousand nodes that was most of a request's time).
        `ids`: the listing from `read_listing` (else listed here)."""
        if ids is None:
            ids = self._listing()
        records: list[quota.UsageRecord] = []
        missing: list[str] = []
        with self._created_lock:
            created = self._created
            if created:
                # Forget what the cache shows now, what is no longer listed, and what the
                # cache has not shown for CREATED_TRUST seconds: such a node may have come
                # and gone between two decisions; it is read below like any missing id.
                listed = set(ids)
                stale = self.clock.monotonic() - CREATED_TRUST
                for node_id in [i for i, (_, noted) in created.items()
                                if i not in listed or noted < stale
                                or cache.get(i) is not None]:
                    del created[node_id]
            for node_id in ids:
                node = cache.get(node_id)
                if node is None:
                    mine = created.get(node_id)
                    node = mine[0] if mine is not None else None
                    if node is None:
                        # A record the cache found unusable would not count either: read
                        # at every decision, ten thousand junk znodes cost seconds each
                        # and, past the report memory, a warning each every time.
                        if not cache.unusable(node_id):
                            missing.append(node_id)
                        continue
                if keep is None or keep(node):
                    records.append(self.memo.record(node_id, node, fallback, cache))
        gone: set[str] = set()
        for path, found in self.zk.get_many([paths.node_path(i) for i in missing]):
            if found is None or not found[0]:
                gone.add(paths.basename(path))
                continue
            node = parse(paths.basename(path), found[0], found[1].version)
            if node is not None and (keep is None or keep(node)):
                records.append(usage_record(node, fallback))
        if gone:
            with self._created_lock:
                self._gone |= gone
                if self._known is not None:
                    self._known.ids = [i for i in self._known.ids if i not in gone]
        return records
