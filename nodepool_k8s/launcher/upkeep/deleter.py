"""Deleting nodes and leaked cloud resources, on a bounded pool of threads.

Owns: the node deletion protocol and its retries. For a node: lock it (non-blocking),
re-read, re-check that it should still go (`check`), write `deleting`, have the provider
delete the resource and confirm it is gone, then remove the znode with its lock in
one transaction (`deleted` is written first only when another contender waits). A node
whose resource could not be confirmed gone keeps its znode and is retried later with
backoff: nothing is forgotten. A node whose record names a resource that is not provably
ours (`NotOwned`: e.g. `kube-system`, or another installation's namespace) gets the reason
written as `delete_refused`, one WARNING, `nodepool.provider.<p>.delete_refused`, and its
znode removed; the cloud is not touched. Leaked resources (no node) go through `delete_leak`.
A deletion the provider reports stuck (`Underway.stuck`: a namespace Terminating past
`terminating-grace`) is shown once per node or leak: the `Deleting` condition False with
reason `DeletionStuck`, a `delete-stuck` event and `nodepool.provider.<p>.delete_stuck`.

Idempotent: a node already being deleted by this process is not submitted twice; another
launcher holding the lock simply makes this attempt a no-op.

Deletion is a reconcile loop over `Provider.delete`, which never waits and is safe to call
again: `Gone` finishes the node, `Underway` parks it with its lock still held (a leak's
deletion is parked the same way, without a lock) and the thread goes on to other work. The
deleter alone keeps the deadlines, in one table (`_going`: what is underway, when to look
again, when `delete-timeout` runs out, counted from the first `Underway`): a parked deletion
is looked at again at the provider's `recheck_at` or at once on the provider's wake-up,
whichever comes first; the wake-up only moves that time (it decides nothing, and a lost one
costs only the wait until `recheck_at`). Past `delete-timeout` one verifying call (the
provider asks the cloud, not its watch) decides: still underway is a failure, retried with
back-off and a fresh deadline. So a gate reset that releases hundreds of nodes has every
deletion in the cluster at once, however few deleter threads there are.

Bounded: `delete_workers` threads, all started with the deleter (`threads.fixed_pool`); the
retry table only holds work that is still wanted. A node's entry is dropped
when the deletion succeeds or the node is gone (`forget`, `prune`, called by the cleanup
worker), a leak's when the resource is no longer listed (`prune_leaks`); `next_retry` only
names future retries of work that is not running, so the cleanup worker never wakes for a
deadline that nothing will act on.

Launch first (`precedence.LaunchFirst`): a deletion submitted with its provider (the
cleanup's, of used and other unwanted nodes; leaks) does not start while this launcher's
launches are queued or running and no pool sharing that provider waits for quota or
capacity: it waits in `_deferred` (claimed, so `busy`; in FIFO order) and starts the moment
the last launch returned or a pool began to wait, or after `delete_defer_max` seconds
whatever runs (the cleanup worker wakes for that through `next_retry`). A deletion asked for
without a provider (making room at quota, a drain or expiry, `nodepool delete`) starts at
once. A node whose deletion waits is still `used` in ZooKeeper and counts against quota,
as any node until its znode goes; a shutdown drops the waiting ones (the next launcher's
cleanup finds them).

Retries and a parked deletion's next look are due on monotonic time: a backward step of
the wall clock by an hour must not hold every failed deletion for that hour.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.runtime import logconfig, threads
from nodepool_k8s.core import model, records
from nodepool_k8s.config import schema
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.core.errors import (DeletionBlocked, NotOwned, ProviderUnavailable,
                                      TemporaryError, ZkSessionLost)
from nodepool_k8s.launcher import lifecycle
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.driver.base import Deletion, Provider, Underway
from nodepool_k8s.launcher.settings import EngineSettings, next_backoff
from nodepool_k8s.core.model import Node
from nodepool_k8s.core.transition import transition
from nodepool_k8s.zk.errors import ZkAuthError, ZkConnectionError
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore

log = logging.getLogger("nodepool_k8s.NodeDeleter")

# The `Deleting` condition's reason while the provider reports the deletion stuck.
STUCK_REASON = "DeletionStuck"

Check = Callable[[Node], bool]


@dataclass(frozen=True)
class LeakKey:
    """A leaked cloud resource in the retry table (node deletions are keyed by node id)."""

    provider: str
    external_id: str


RetryKey = str | LeakKey


@dataclass(frozen=True)
class Retry:
    due: float  # monotonic
    delay: float


class Removal(enum.Enum):
    """How `delete_locked` ended."""

    DELETED = "deleted"  # the resource (if any) is gone and so is the znode
    REFUSED = "refused"  # the resource is not ours: left alone; the znode is gone
    CONTENDED = "contended"  # the resource is handled; the znode stays (state deleted)


@dataclass(frozen=True)
class Removed:
    """How `delete_locked` ended when the resource is gone or refused."""

    removal: Removal
    refused: str | None = None  # why the resource was not touched (`NotOwned`)


class Outcome(enum.Enum):
    """How one pass of the deleter over a node or leak ended."""

    DONE = "done"  # nothing more to do (deleted, refused, gone, not ours to act on)
    FAILED = "failed"  # retried later with back-off
    # (A pass may also end in `Going`: the resource is going, the node waits locked.)


@dataclass(frozen=True)
class Deferred:
    """A deletion that waits for the launches (see the module docstring)."""

    provider: str
    reason: str
    check: Check | None
    until: float  # monotonic: it starts by then whatever runs


@dataclass
class Going:
    """A deletion underway with no thread waiting: a node's (its lock held) or a leaked
    resource's (`node` and `lock` None)."""

    node: Node | None
    lock: HeldLock | None
    reason: str
    recheck_at: float  # ask the provider again by then (monotonic), even without a wake-up
    deadline: float  # `delete-timeout` after the first `Underway` (monotonic)


@dataclass(frozen=True)
class WakeUp:
    """The `wake` of a deletion (node id or LeakKey): equal for the same key and deleter,
    so a provider keeps one per deletion however often it is asked."""

    deleter: "NodeDeleter"
    key: RetryKey

    def __call__(self) -> None:
        self.deleter.wake(self.key)


class NodeWrites(Protocol):
    """The node store's writes the deletion protocol makes (`zk.nodes.NodeStore`)."""

    def store(self, node: Node, held: HeldLock) -> None: ...

    def delete(self, node: Node, held: HeldLock, attempts: int = ...) -> bool: ...


class ResourceDeleter(Protocol):
    """Deletes a node's cloud resource (`driver.base.Provider.delete`): one reconcile step,
    `Gone` or `Underway`; raises `NotOwned` for a resource that is not provably ours
    (untouched)."""

    def delete(self, external_id: str, node_id: str | None = None,
               wake: Callable[[], None] | None = None, verify: bool = False) -> Deletion: ...


def delete_locked(nodes: NodeWrites, node: Node, lock: HeldLock,
                  resource: ResourceDeleter | None, *, now: Callable[[], float],
                  reason: str, wake: Callable[[], None] | None = None,
                  verify: bool = False) -> Removed | Underway:
    """The node deletion protocol, for a node we hold locked (freshly read): the launcher's
    deleter and `nodepool delete --now` both run it.

    With `resource` (the node's provider): write `deleting` (with the `Deleting` condition)
    unless already there, delete the resource, on `NotOwned` write the reason as
    `delete_refused` (and `Deleting` False/NotOwned) and leave the resource alone. Then remove
    the znode with its lock. Without `resource` only the znode is removed. Errors of the
    resource deletion (`TemporaryError`) propagate with the node left in `deleting`; the
    caller decides about retries. `Underway` is returned the same way, the znode kept: the
    caller keeps the lock and calls again (after `recheck_at` or `wake`).
    """
    refused: str | None = None
    if resource is not None:
        if node.state != model.NodeState.DELETING:
            # Recorded first, so a failure below leaves a node its launcher finishes.
            transition(node, model.NodeState.DELETING, now(), message=reason)
            nodes.store(node, lock)
        if node.external_id:
            try:
                step = resource.delete(node.external_id, node_id=node.id, wake=wake,
                                       verify=verify)
            except NotOwned as exc:
                refused = str(exc)
                node.extra["delete_refused"] = refused
                node.set_condition(cond.Condition(cond.DELETING, cond.FALSE, "NotOwned",
                                                  refused, now()))
                nodes.store(node, lock)
            else:
                if isinstance(step, Underway):
                    return step
    if not nodes.delete(node, lock):
        return Removed(Removal.CONTENDED, refused)
    return Removed(Removal.DELETED if refused is None else Removal.REFUSED, refused)


class DeleterDeps(Protocol):
    """What the deleter uses of the launcher's shared state (`context.Engine` is one)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> EngineSettings: ...

    @property
    def stopping(self) -> threading.Event: ...

    @property
    def acting(self) -> bool: ...

    @property
    def nodes(self) -> NodeStore: ...

    @property
    def providers(self) -> Mapping[str, Provider]: ...

    @property
    def stats(self) -> Stats: ...

    @property
    def events(self) -> EventLog: ...

    def provider_config(self, name: str | None) -> ProviderConfig | None: ...


class NodeDeleter:
    def __init__(self, engine: DeleterDeps, workers: int,
                 on_done: Callable[[], None] = lambda: None,
                 executor: Executor | None = None, first: LaunchFirst | None = None) -> None:
        """`first`: the launcher's launch-first signals (None: no deletion waits)."""
        self.engine = engine
        # Tests may pass an executor that runs each pass at once, in the caller's thread.
        self._executor = executor or threads.fixed_pool(workers, "deleter")
        self._lock = threading.Lock()
        self._in_flight: set[RetryKey] = set()
        self._retry: dict[RetryKey, Retry] = {}
        # Deletions underway with no thread on them, by node id (the node locked) or
        # LeakKey: when to look again and when `delete-timeout` runs out.
        self._going: dict[RetryKey, Going] = {}
        # A wake-up came while a pass over the key still ran: its next look is due at once.
        self._woken: set[RetryKey] = set()
        self.deleted = 0
        self.leaks_deleted = 0
        self.refused = 0
        # Called after a deletion completed or failed (the cleanup worker re-evaluates).
        self.on_done = on_done
        # Nodes ZooKeeper would not let us lock, write or remove (another client's ACL):
        # said once; their retries (with backoff) are quiet.
        self._refused: set[str] = set()
        # Leaked resources whose stuck deletion was reported (once each).
        self._stuck_leaks: set[LeakKey] = set()
        # Deletions waiting for the launches, oldest first; their keys are in `_in_flight`
        # (claimed: not submitted twice, `busy`) until they start or are dropped.
        self._deferred: dict[RetryKey, Deferred] = {}
        self._first = first
        if first is not None:
            first.subscribe(self.start_deferred)

    # -- scheduling -----------------------------------------------------------------------
    def _claim(self, key: RetryKey) -> bool:
        with self._lock:
            if key in self._in_flight or key in self._going:
                return False
            retry = self._retry.get(key)
            if retry is not None and retry.due > self.engine.clock.monotonic():
                return False
            self._in_flight.add(key)
            return True

    def _release(self, key: RetryKey, result: Outcome | Going) -> None:
        settings = self.engine.settings
        going = result if isinstance(result, Going) else None
        with self._lock:
            # A wake-up may have overtaken the pass that parks: look again at once.
            resume = going is not None and key in self._woken
            self._woken.discard(key)
            if not resume:
                self._in_flight.discard(key)
                if going is not None:
                    self._going[key] = going
            if result is Outcome.FAILED:
                last = self._retry[key].delay if key in self._retry else 0.0
                delay = next_backoff(last, settings.delete_retry, settings.delete_retry_max)
                self._retry[key] = Retry(self.engine.clock.monotonic() + delay, delay)
            elif result is Outcome.DONE:
                self._retry.pop(key, None)
            # Going: a back-off entry stays for the next failure (not due while going).
        if resume and going is not None:
            self._look_again(key, going)  # it stays in flight
        self.on_done()

    def _waiting_retries(self) -> list[tuple[str, Retry]]:
        """Node retries that nothing is working on (lock held)."""
        return [(k, r) for k, r in self._retry.items() if isinstance(k, str)
                and k not in self._in_flight and k not in self._going]

    def busy(self, node_id: str) -> bool:
        with self._lock:
            return node_id in self._in_flight or node_id in self._going

    def next_retry(self) -> float:
        """When (monotonic) a node deletion is next due for a retry or a parked deletion
        (a node's or a leak's) for another look (leak retries follow the sweep)."""
        with self._lock:
            return min([r.due for _, r in self._waiting_retries()]
                       + [g.recheck_at for g in self._going.values()]
                       + [d.until for d in self._deferred.values()], default=math.inf)

    def due_retries(self) -> list[str]:
        now = self.engine.clock.monotonic()
        with self._lock:
            return [k for k, r in self._waiting_retries() if r.due <= now]

    def resume_due(self) -> None:
        """Look again at parked deletions whose time to look again has come, and start the
        waiting ones that may start (the cleanup pass calls this; `next_retry` wakes it in
        time)."""
        self.start_deferred()
        now = self.engine.clock.monotonic()
        with self._lock:
            due = [(k, g) for k, g in self._going.items() if g.recheck_at <= now]
            for key, _ in due:
                del self._going[key]
                self._in_flight.add(key)
        for key, going in due:
            self._look_again(key, going)

    def parked(self) -> int:
        """Deletions underway with no thread waiting (for tests and the status)."""
        with self._lock:
            return len(self._going)

    @property
    def first(self) -> LaunchFirst | None:
        """The launch-first signals this deleter yields to (the cleanup worker's too)."""
        return self._first

    def deferred(self) -> int:
        """Deletions waiting for the launches (for tests and the status)."""
        with self._lock:
            return len(self._deferred)

    def forget(self, node_id: str) -> None:
        """The node is gone (deleted by another launcher, or by hand): no retry."""
        with self._lock:
            going = self._going.pop(node_id, None)
            if self._deferred.pop(node_id, None) is not None:
                self._in_flight.discard(node_id)
            if node_id not in self._in_flight:
                self._retry.pop(node_id, None)
                self._refused.discard(node_id)
        if going is not None and going.lock is not None:
            going.lock.release()

    def prune(self, live_node_ids: Iterable[str]) -> None:
        """Drop node retries (and parked deletions) of nodes that no longer exist."""
        live = set(live_node_ids)
        with self._lock:
            for key in [k for k in self._retry if isinstance(k, str)
                        and k not in live and k not in self._in_flight]:
                del self._retry[key]
            self._refused &= live
            for key in [k for k in self._deferred if isinstance(k, str) and k not in live]:
                del self._deferred[key]
                self._in_flight.discard(key)
            gone = [self._going.pop(k) for k in list(self._going)
                    if isinstance(k, str) and k not in live]
        for going in gone:
            if going.lock is not None:
                going.lock.release()

    def prune_leaks(self, provider_name: str, listed: Iterable[str]) -> None:
        """Drop leak retries (and parked leak deletions) of a provider's resources that
        are no longer listed."""
        present = set(listed)
        with self._lock:
            for key in [k for k in self._retry if isinstance(k, LeakKey)
                        and k.provider == provider_name and k.external_id not in present
                        and k not in self._in_flight]:
                del self._retry[key]
            for key in [k for k in self._going if isinstance(k, LeakKey)
                        and k.provider == provider_name and k.external_id not in present]:
                del self._going[key]
            for key in [k for k in self._deferred if isinstance(k, LeakKey)
                        and k.provider == provider_name and k.external_id not in present]:
                del self._deferred[key]
                self._in_flight.discard(key)
            self._stuck_leaks = {k for k in self._stuck_leaks
                                 if k.provider != provider_name or k.external_id in present}

    def retry_entries(self) -> int:
        """Size of the retry table (bounded by the work still wanted; for tests)."""
        with self._lock:
            return len(self._retry)

    def submit(self, node_id: str, reason: str, check: Check | None = None,
               provider: str | None = None) -> bool:
        """Delete node `node_id` in the background; False if already in progress/backoff.
        With the node's `provider` the deletion may wait for the launches (launch first);
        without, it starts at once."""
        if not self._claim(node_id):
            return False
        if not self._defer(node_id, provider, reason, check):
            self._start(node_id, reason, check)
        return True

    def delete_leak(self, provider_name: str, external_id: str) -> bool:
        key = LeakKey(provider_name, external_id)
        if not self._claim(key):
            return False
        if not self._defer(key, provider_name, "leaked", None):
            self._start(key, "leaked", None)
        return True

    def _defer(self, key: RetryKey, provider: str | None, reason: str,
               check: Check | None) -> bool:
        """Keep the claimed deletion of `key` waiting for the launches if it may wait."""
        first = self._first
        bound = self.engine.settings.delete_defer_max
        if first is None or bound <= 0:
            return False
        # Decided under the lock `start_deferred` takes: a launch returning meanwhile finds
        # the entry there (or this check sees no launch), so none waits for nothing.
        with self._lock:
            if not first.may_defer(provider):
                return False
            assert provider is not None
            self._deferred[key] = Deferred(provider, reason, check,
                                           self.engine.clock.monotonic() + bound)
        return True

    def _start(self, key: RetryKey, reason: str, check: Check | None) -> None:
        try:
            if isinstance(key, LeakKey):
                self._executor.submit(self._delete_leak, key, None)
            else:
                self._executor.submit(self._delete_node, key, reason, check)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._in_flight.discard(key)

    def start_deferred(self) -> None:
        """Start the waiting deletions that may start now: launches all returned, a pool
        of their provider waits for quota, or they waited `delete_defer_max` (oldest
        first; quick: a thread takes each)."""
        first = self._first
        now = self.engine.clock.monotonic()
        with self._lock:
            if not self._deferred:
                return
            verdicts: dict[str, bool] = {}
            due: list[tuple[RetryKey, Deferred]] = []
            for key, deferred in self._deferred.items():
                if deferred.provider not in verdicts:
                    verdicts[deferred.provider] = first is not None \
                        and first.may_defer(deferred.provider)
                if deferred.until <= now or not verdicts[deferred.provider]:
                    due.append((key, deferred))
            for key, _ in due:
                del self._deferred[key]
        for key, deferred in due:
            self._start(key, deferred.reason, deferred.check)

    def shutdown(self, wait: bool) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=True)
        with self._lock:
            # Their nodes stay `deleting`; the locks go with the session the launcher is
            # about to close (releasing each here could wait for a ZooKeeper that is down),
            # and whoever runs next finishes them. Waiting deletions were never started.
            self._going.clear()
            for key in self._deferred:
                self._in_flight.discard(key)
            self._deferred.clear()

    # -- the provider's wake-up -----------------------------------------------------------
    def wake(self, key: RetryKey) -> None:
        """Look at the deletion of `key` (a node id or a leak) again now rather than at its
        `recheck_at`: the provider saw something change. Only a hint; may run on the
        provider's watch thread under its lock: hand the look to a deleter thread, nothing
        else."""
        with self._lock:
            going = self._going.pop(key, None)
            if going is None:
                if key in self._in_flight:
                    self._woken.add(key)  # `_release` looks again at once
                return
            self._in_flight.add(key)
        self._look_again(key, going)

    def _look_again(self, key: RetryKey, going: Going) -> None:
        try:
            if isinstance(key, LeakKey):
                self._executor.submit(self._delete_leak, key, going)
            else:
                self._executor.submit(self._finish, key, going)
        except RuntimeError:  # shut down meanwhile: the lock goes with the session
            with self._lock:
                self._in_flight.discard(key)

    def _timeout(self, provider: str) -> float:
        """The provider's `delete-timeout`: how long a deletion may stay underway."""
        config = self.engine.provider_config(provider)
        return float(config.delete_timeout) if config is not None else schema.DELETE_TIMEOUT

    def _next(self, going: Going | None, provider: str, step: Underway, node: Node | None,
              lock: HeldLock | None, reason: str) -> Going:
        """The parked deletion after `step`: the deadline set on the first `Underway`
        and kept across looks."""
        now = self.engine.clock.monotonic()
        deadline = going.deadline if going is not None else now + self._timeout(provider)
        return Going(node, lock, reason, recheck_at=min(step.recheck_at, deadline),
                     deadline=deadline)

    def _verifying(self, going: Going | None) -> bool:
        """Whether this look is the one that decides: `delete-timeout` has run out."""
        return going is not None and self.engine.clock.monotonic() >= going.deadline

    # -- work -----------------------------------------------------------------------------
    def _delete_node(self, node_id: str, reason: str, check: Check | None) -> None:
        self._run(node_id, lambda: self._delete_node_locked(node_id, reason, check))

    def _finish(self, node_id: str, going: Going) -> None:
        def proceed() -> Outcome | Going:
            assert going.node is not None and going.lock is not None  # a node's
            if not going.lock.valid:
                # The session that held the lock ended: start over like any node.
                log.info("[node: %s] Lost the lock while %s was being deleted; will retry",
                         node_id, records.clip(going.node.external_id or ""))
                going.lock.release()
                return Outcome.FAILED
            # The provider now configured under that name: a reload may have replaced the
            # one that took the deletion (its watch's stop is what woke us).
            provider = self.engine.providers.get(going.node.provider or "")
            if provider is None:
                going.lock.release()
                return Outcome.DONE  # not one of ours any more
            return self._proceed(going.node, going.lock, provider, going.reason, going)
        self._run(node_id, proceed)

    def _run(self, node_id: str, fn: Callable[[], "Outcome | Going"]) -> None:
        result: Outcome | Going = Outcome.FAILED
        try:
            result = fn()
        except (ZkSessionLost, ZkConnectionError) as exc:
            if not self.engine.stopping.is_set():
                log.warning("[node: %s] Deletion interrupted: %s", node_id, exc)
        except ZkAuthError as exc:
            with self._lock:
                first = node_id not in self._refused
                self._refused.add(node_id)
            log.log(logging.WARNING if first else logging.DEBUG,
                    "[node: %s] Cannot delete the node: %s; will retry", node_id, exc)
        except Exception:
            log.exception("[node: %s] Unexpected error while deleting", node_id)
        finally:
            self._release(node_id, result)

    def _delete_node_locked(self, node_id: str, reason: str,
                            check: Check | None) -> "Outcome | Going":
        engine = self.engine
        if not engine.acting:
            return Outcome.DONE
        got = engine.nodes.lock_and_read(node_id)
        if got is None:
            return Outcome.DONE  # gone, or someone else holds it
        lock, node = got
        handed_on = False
        try:
            if check is not None and not check(node):
                return Outcome.DONE
            if node.state == model.NodeState.DELETED or node.provider is None:
                return Outcome.DONE if engine.nodes.delete(node, lock) else Outcome.FAILED
            provider = engine.providers.get(node.provider)
            if provider is None:
                return Outcome.DONE  # not one of ours (any more)
            handed_on = True
            return self._proceed(node, lock, provider, reason, None)
        finally:
            if not handed_on and not lock.released:
                lock.release()

    def _proceed(self, node: Node, lock: HeldLock, provider: Provider, reason: str,
                 going: Going | None) -> "Outcome | Going":
        """Delete a locked node's resource and then the node; `Going` (the lock kept) while
        the provider answers `Underway`."""
        engine = self.engine
        nlog = logconfig.annotate(log, node_id=node.id)
        keep_lock = False
        verify = self._verifying(going)
        try:
            try:
                done = delete_locked(engine.nodes, node, lock, provider,
                                     now=engine.clock.time, reason=reason,
                                     wake=WakeUp(self, node.id), verify=verify)
                if isinstance(done, Underway) and verify:
                    raise TemporaryError(
                        f"{done.detail}, still after the provider's delete-timeout"
                        f" ({self._timeout(provider.name):g}s)")
            except (ZkSessionLost, ZkConnectionError):
                raise  # ZooKeeper, not the resource: interrupted (see _run)
            except TemporaryError as exc:
                # Refused credentials are the provider's, reported once by the driver, and
                # so is a deletion blocked by what the provider could not clear: not a
                # WARNING per node and retry.
                level = logging.INFO if isinstance(exc, (ProviderUnavailable, DeletionBlocked)) \
                    else logging.WARNING
                nlog.log(level, "Could not delete %s yet (%s); will retry",
                         records.clip(node.external_id or ""), exc)
                lifecycle.note_delete_failed(engine.nodes, node, lock, str(exc),
                                             engine.clock.time())
                return Outcome.FAILED
            if isinstance(done, Underway):
                keep_lock = True
                nlog.debug("Deletion of %s underway: %s", records.clip(node.external_id or ""),
                           done.detail)
                if done.stuck is not None:
                    self._stuck(node, lock, provider.name, done.stuck)
                return self._next(going, provider.name, done, node, lock, reason)
            refused = done.refused is not None
            if refused:
                # Never retried and never deleted: the record is dropped, the reason kept.
                nlog.warning("Refusing to delete %s of provider %s (%s); removing the node"
                             " record only", records.clip(node.external_id or ""),
                             node.provider, done.refused)
                engine.stats.delete_refused(provider.name)
            if done.removal is Removal.CONTENDED:
                nlog.info("Node is contended; left in state deleted for the next pass")
                return Outcome.FAILED
            with self._lock:
                self.deleted += 1
                self.refused += int(refused)
            lifecycle.record_deleted(engine.events, node, reason, done.refused)
            if not refused:
                lifecycle.report_deleted(engine.stats, engine.events, node)
            if refused:
                nlog.info("Removed the node record; %s was left alone (%s)",
                          records.clip(node.external_id or ""), reason)
            else:
                nlog.info("Deleted node %s (%s)", node.external_id or "", reason)
            return Outcome.DONE
        finally:
            if not keep_lock and not lock.released:
                lock.release()

    def _stuck(self, node: Node, lock: HeldLock, provider: str, what: str) -> None:
        """A node's resource has been going for longer than its provider allows: shown
        once per node (condition, event, metric) before the provider clears what holds it."""
        current = cond.find(node.conditions, cond.DELETING)
        if current is not None and current.reason == STUCK_REASON:
            return
        engine = self.engine
        logconfig.annotate(log, node_id=node.id).warning(
            "Deletion of %s is stuck: %s", records.clip(node.external_id or ""), what)
        node.set_condition(cond.Condition(cond.DELETING, cond.FALSE, STUCK_REASON, what,
                                          engine.clock.time()))
        try:
            engine.nodes.store(node, lock)
        except Exception as exc:  # noqa: BLE001 - the node stays parked either way
            log.info("[node: %s] Could not record the stuck deletion: %s", node.id, exc)
        lifecycle.record_stuck(engine.events, provider, what, node=node)
        engine.stats.delete_stuck(provider)

    def _delete_leak(self, key: LeakKey, going: Going | None) -> None:
        provider_name, external_id = key.provider, key.external_id
        result: Outcome | Going = Outcome.DONE
        try:
            provider = self.engine.providers.get(provider_name)
            if provider is not None:
                verify = self._verifying(going)
                try:
                    step = provider.delete(external_id, wake=WakeUp(self, key), verify=verify)
                except NotOwned as exc:
                    # Listed as ours, not ours on a closer look (labels changed): leave it.
                    log.warning("Not deleting resource %s of provider %s: %s", external_id,
                                provider_name, exc)
                    return
                if isinstance(step, Underway):
                    if verify:
                        raise TemporaryError(
                            f"{step.detail}, still after the provider's delete-timeout"
                            f" ({self._timeout(provider_name):g}s)")
                    # Going: no thread waits for it (a wake-up or `recheck_at` resumes it).
                    if step.stuck is not None and self._first_stuck(key):
                        log.warning("Deletion of leaked resource %s of provider %s is stuck:"
                                    " %s", external_id, provider_name, step.stuck)
                        lifecycle.record_stuck(self.engine.events, provider_name, step.stuck,
                                               external_id=external_id)
                        self.engine.stats.delete_stuck(provider_name)
                    result = self._next(going, provider_name, step, None, None, "leaked")
                    return
                self.engine.stats.leaked_nodes(provider_name)
                with self._lock:
                    self.leaks_deleted += 1
                log.info("Deleted leaked resource %s of provider %s", external_id,
                         provider_name)
        except Exception as exc:
            log.warning("Could not delete leaked resource %s of provider %s: %s",
                        external_id, provider_name, exc)
            result = Outcome.FAILED
        finally:
            if not isinstance(result, Going):
                with self._lock:
                    self._stuck_leaks.discard(key)
            self._release(key, result)

    def _first_stuck(self, key: LeakKey) -> bool:
        with self._lock:
            first = key not in self._stuck_leaks
            self._stuck_leaks.add(key)
            return first
