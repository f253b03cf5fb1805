"""Running node launches: a bounded thread pool per provider and the retry policy.

Owns: calling `provider.launch` for one node (attempt after attempt, up to the provider's
`launch-retries`), recording the external id on the node as soon as the driver reports it
(so a crash leaves a traceable record), classifying the outcome and reporting
`nodepool.launch.*` stats. Launches run on a `LaunchPool`: at most `max-concurrency`
threads per provider (or `launch_workers` when unlimited), never one thread per node. All
of them start with the pool (`threads.fixed_pool`), so the thread count is known from the
start and never grows.

Before anything else a launch collects the answer to the node's lock + `building`
transaction, which the pool worker sent without waiting (so it could go on to the next
request of a burst): only a node locked by us is launched.

Outcomes (`LaunchEnd`): READY (with the LaunchResult), FAILED (every attempt failed, or a
non-retryable error), ABORTED (the cloud refused for quota, or the provider cannot act at
all now, `ProviderUnavailable`, e.g. its credentials are refused: not a failure, counted
against no label, the request waits), CANCELLED (shutdown or session loss set the cancel
event), UNLOCKED (the node could not be locked: nothing was launched, the handler
replaces the node). This module writes only the external id; the request handler writes
every other state change.

Tracing: a launch's span (`NodeLaunch.span`, under its request's) has one child per launch
phase of each attempt, named after the node condition the phase makes True (`Launched`,
`Registered`, `Initialized`): a phase ends when the driver reports its condition True, and
the one still open when an attempt fails carries the failure (status ERROR, reason code).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.runtime import stats, threads
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.runtime.tracing import NOOP_SPAN, Span
from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.driver.base import LaunchResult, LaunchSpec, Provider, RequestInfo
from nodepool_k8s.core.errors import LaunchError, ProviderUnavailable, QuotaExceeded, TemporaryError
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.launcher.precedence import LaunchFirst
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore, PendingLock


class LaunchEnd(enum.Enum):
    READY = "ready"
    FAILED = "failed"
    ABORTED = "aborted"
    CANCELLED = "cancelled"
    UNLOCKED = "unlocked"  # the new node could not be locked: nothing was launched


@dataclass(frozen=True)
class LaunchOutcome:
    kind: LaunchEnd
    result: LaunchResult | None = None
    error: str = ""
    attempts: int = 0
    # The type of the last attempt's exception (FAILED, ABORTED): stats tell a driver's
    # LaunchError from anything unexpected by type, never by the error text.
    error_type: type[BaseException] | None = None
    reason: str = ""  # one of conditions.REASONS for failed and aborted outcomes


class LaunchPool:
    """The bounded set of launch threads of one provider (shared by its pools).

    Each launch counts with `first` (the launcher's `LaunchFirst`) from its submission until
    `done` told its pool worker it returned: housekeeping yields to it meanwhile."""

    def __init__(self, provider: str, workers: int, first: LaunchFirst | None = None) -> None:
        self.provider = provider
        self.workers = workers
        self._executor = threads.fixed_pool(workers, f"launch-{provider}")
        self._lock = threading.Lock()
        self._in_flight = 0
        self._first = first

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def submit(self, fn: Callable[[], LaunchOutcome],
               done: Callable[[], None]) -> "Future[LaunchOutcome]":
        with self._lock:
            self._in_flight += 1
        first = self._first
        if first is not None:
            first.launch_queued()

        def run() -> LaunchOutcome:
            try:
                return fn()
            finally:
                with self._lock:
                    self._in_flight -= 1

        def returned(_future: "Future[LaunchOutcome]") -> None:
            try:
                done()
            finally:
                if first is not None:
                    first.launch_returned()

        try:
            future = self._executor.submit(run)
        except BaseException:
            with self._lock:
                self._in_flight -= 1
            if first is not None:
                first.launch_returned()
            raise
        # `done` (the pool worker's wake) must run once the future reports done: called
        # from inside `run` it could wake the worker before the result is set, the worker
        # would see the launch still running and sleep until some unrelated event.
        future.add_done_callback(returned)
        return future

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=False)


def apply_result(node: Node, result: LaunchResult) -> None:
    """Copy what the driver reported onto the node record (written at fulfilment)."""
    node.set(external_id=result.external_id, connection_type=result.connection_type,
             connection_port=result.connection_port, interface_ip=result.interface_ip,
             host_id=result.host_id, cloud=result.cloud, python_path=result.python_path,
             shell_type=result.shell_type, driver_data=result.driver_data)
    if result.resources:
        node.set(resources=dict(result.resources))
    if result.hostname:
        node.set(hostname=result.hostname)
    if result.username:
        node.set(username=result.username)
    if result.extra:
        node.extra.update(result.extra)


def request_info(request: NodeRequest) -> RequestInfo:
    return RequestInfo(id=request.id, labels=tuple(request.node_types),
                       requestor=request.requestor, requestor_data=request.requestor_data,
                       relative_priority=request.relative_priority,
                       event_id=request.event_id, created_time=request.created_time,
                       tenant_name=request.tenant_name)


# The launch phases, named after the node condition each one makes True (the handler's
# `fulfil` span is the last, `Ready`).
PHASES = (cond.LAUNCHED, cond.REGISTERED, cond.INITIALIZED)


@dataclass
class NodeLaunch:
    """Everything one launch needs; `run` executes on a LaunchPool thread.

    The node's lock + `building` transaction was sent by the pool worker (`pending_lock`),
    which went on to its next request instead of waiting for the answer: the launch
    collects it first, and reports UNLOCKED (nothing launched) if it did not get the lock.
    """

    provider: Provider
    provider_config: ProviderConfig
    pool: PoolConfig
    label: PoolLabel
    request: NodeRequest
    node: Node
    pending_lock: PendingLock
    nodes: NodeStore
    cancel: threading.Event
    stats: stats.Stats
    log: logging.LoggerAdapter[logging.Logger]
    # Told of every failed attempt (attempt, reason, message): the event log.
    on_attempt_failed: Callable[[int, str, str], None] | None = None
    clock: Clock = SYSTEM_CLOCK
    # Set by `run` once the pending lock is ours: the handler takes it from here.
    lock: HeldLock | None = None
    # The launch's span (the handler's child of its request span), ended by `run`.
    span: Span = NOOP_SPAN
    # The running attempt, its phase not yet reported done (an index of PHASES) and that
    # phase's span; only the launch thread touches them.
    attempt: int = field(default=0, init=False)
    _phase: int = field(default=0, init=False)
    _phase_span: Span = field(default=NOOP_SPAN, init=False)

    def _open_phase(self, index: int, attempt: int) -> None:
        """Start phase `index` of `attempt` (no phase left past the last)."""
        self._phase = index
        self._phase_span = NOOP_SPAN
        if index < len(PHASES) and self.span.recording:
            self._phase_span = self.span.child(PHASES[index], {"nodepool.attempt": attempt})

    def _phases_done(self, updates: tuple[cond.Condition, ...]) -> None:
        """End the open phase once the driver reports it (or a later one) True."""
        for update in updates:
            if update.status != cond.TRUE or update.type not in PHASES:
                continue
            index = PHASES.index(update.type)
            if index < self._phase:
                continue
            self._phase_span.set("nodepool.phase.reason", update.reason)
            self._phase_span.end()
            self._open_phase(index + 1, self.attempt)

    def _phase_failed(self, reason: str, error: str) -> None:
        self._phase_span.fail(reason, error)
        self._phase_span.end()
        self._phase_span = NOOP_SPAN

    def _attempt_failed(self, attempt: int, reason: str, error: str) -> None:
        if self.on_attempt_failed is not None:
            try:
                self.on_attempt_failed(attempt, reason, error)
            except Exception as exc:  # best effort: never fails a launch
                self.log.debug("Could not record the failed attempt: %s", exc)

    def _progress(self, external_id: str, *updates: cond.Condition) -> None:
        # Condition updates ride along with the next write (the external id's now, or the
        # handler's final one): no write of their own.
        for update in updates:
            self.node.set_condition(update)
        self._phases_done(updates)
        if self.node.external_id == external_id:
            return
        self.node.set(external_id=external_id)
        self.span.set("nodepool.node.external_id", external_id)
        lock = self.lock
        assert lock is not None  # progress is reported only after `run` took the lock
        try:
            self.nodes.store(self.node, lock)
        except Exception as exc:
            # Without the lock nothing we do for this node counts any more: stop early.
            self.log.warning("Could not record external id %s: %s", external_id, exc)
            if not lock.valid:
                self.cancel.set()

    def run(self) -> LaunchOutcome:
        try:
            lock = self.pending_lock.result()
        except Exception as exc:
            self.log.warning("Could not lock the new node: %s", exc)
            self._end_span(LaunchEnd.UNLOCKED)
            return LaunchOutcome(LaunchEnd.UNLOCKED, error=f"{type(exc).__name__}: {exc}")
        if lock is None:
            self._end_span(LaunchEnd.UNLOCKED)
            return LaunchOutcome(LaunchEnd.UNLOCKED, error="someone else locked the new node")
        self.lock = lock
        try:
            outcome = self._run_locked(lock)
        except BaseException:
            self._phase_failed("Unknown", "the launch raised")
            self._end_span(LaunchEnd.FAILED, "Unknown", "the launch raised")
            raise
        self._end_span(outcome.kind, outcome.reason, outcome.error, outcome.attempts)
        return outcome

    def _end_span(self, kind: LaunchEnd, reason: str = "", error: str = "",
                  attempts: int = 0) -> None:
        """Anything but READY is an error of the launch (UNLOCKED launched nothing)."""
        span = self.span
        span.set("nodepool.outcome", kind.value)
        if attempts:
            span.set("nodepool.attempts", attempts)
        if kind is LaunchEnd.CANCELLED:
            span.fail("Cancelled", error)
        elif kind is LaunchEnd.FAILED or kind is LaunchEnd.ABORTED:
            span.fail(reason or "Unknown", error)
        span.end()

    def _run_locked(self, lock: HeldLock) -> LaunchOutcome:
        started = time.monotonic()
        outcome = self._attempts()
        result = {LaunchEnd.READY: stats.RESULT_READY,
                  LaunchEnd.ABORTED: stats.RESULT_QUOTA}.get(outcome.kind)
        if outcome.kind is LaunchEnd.ABORTED and outcome.error_type is not None \
                and issubclass(outcome.error_type, ProviderUnavailable):
            result = stats.RESULT_UNAVAILABLE
        if result is None:
            if outcome.kind is LaunchEnd.CANCELLED:
                result = stats.RESULT_ZKSESSION if not lock.valid \
                    else stats.RESULT_UNKNOWN
            else:
                failed_by_driver = outcome.error_type is not None \
                    and issubclass(outcome.error_type, LaunchError)
                result = stats.RESULT_NODEPOOL if failed_by_driver else stats.RESULT_UNKNOWN
        self.stats.launch(self.provider_config.name, self.request.requestor, result,
                          (time.monotonic() - started) * 1000.0)
        if outcome.kind in (LaunchEnd.FAILED, LaunchEnd.ABORTED):
            self.stats.launch_error(self.provider_config.name, outcome.reason)
        return outcome

    def _attempts(self) -> LaunchOutcome:
        attempts = max(1, self.provider_config.launch_retries)
        outcome = self._attempt_all(attempts)
        # The phase still open when the last attempt ended: READY leaves none from a driver
        # that reports every phase; any other outcome says why it stopped there.
        if outcome.kind is LaunchEnd.READY:
            self._phase_span.end()
        elif outcome.kind is LaunchEnd.CANCELLED:
            self._phase_failed("Cancelled", outcome.error)
        else:
            self._phase_failed(outcome.reason or "Unknown", outcome.error)
        return outcome

    def _attempt_all(self, attempts: int) -> LaunchOutcome:
        error = ""
        error_type: type[BaseException] | None = None
        reason = "Unknown"
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                # The previous attempt's failure ends the phase it stopped in.
                self._phase_failed(reason, error)
            if self.cancel.is_set():
                return LaunchOutcome(LaunchEnd.CANCELLED, attempts=attempt - 1)
            self.attempt = attempt
            self._open_phase(0, attempt)
            if attempt > 1:
                self.node.conditions = cond.restart(
                    self.node.conditions, self.clock.time(),
                    f"attempt {attempt}/{attempts} after {reason}: {error}")
            spec = LaunchSpec(node_id=self.node.id, provider=self.provider_config,
                              pool=self.pool, label=self.label,
                              request=request_info(self.request), attempt=attempt)
            try:
                result = self.provider.launch(spec, self.cancel, self._progress)
                self.log.info("Node launched as %s (attempt %d)", result.external_id, attempt)
                return LaunchOutcome(LaunchEnd.READY, result, attempts=attempt)
            except QuotaExceeded as exc:
                self.log.info("Cloud refused the launch for quota: %s", exc)
                return LaunchOutcome(LaunchEnd.ABORTED, error=f"QuotaExceeded: {exc}",
                                     attempts=attempt, error_type=type(exc),
                                     reason="QuotaExceeded")
            except ProviderUnavailable as exc:
                # The provider's trouble (its credentials refused, say), not the label's:
                # no further attempt now, no failure; the request waits and is retried.
                # The driver reports the cause once; this is one line per node.
                self.log.info("Provider cannot launch now; the request waits: %s", exc)
                reason = cond.reason(exc.reason)
                return LaunchOutcome(LaunchEnd.ABORTED, error=f"{reason}: {exc}", attempts=attempt,
                                     error_type=type(exc), reason=reason)
            except LaunchError as exc:
                if self.cancel.is_set():
                    return LaunchOutcome(LaunchEnd.CANCELLED, attempts=attempt)
                error, error_type = f"LaunchError({exc.reason}): {exc}", type(exc)
                reason = cond.reason(exc.reason)
                self.log.warning("Launch attempt %d/%d failed: %s", attempt, attempts, error)
                if not exc.retryable:
                    self._attempt_failed(attempt, reason, error)
                    break
            except TemporaryError as exc:
                error, error_type = f"{type(exc).__name__}: {exc}", type(exc)
                reason = "ApiError"
                self.log.warning("Launch attempt %d/%d failed: %s", attempt, attempts, error)
            except Exception as exc:
                error, error_type = f"{type(exc).__name__}: {exc}", type(exc)
                reason = "Unknown"
                self.log.exception("Launch attempt %d/%d failed unexpectedly", attempt,
                                   attempts)
            self._attempt_failed(attempt, reason, error)
        return LaunchOutcome(LaunchEnd.FAILED, error=error, attempts=attempts,
                             error_type=error_type, reason=reason)
