"""The engine's side of node lifecycle conditions and request decline and waiting reasons.

Owns: what the request handler, the pool worker and the deleter add to records they are
about to write anyway (no write of its own, but for a failed deletion's note): the
per-pool `declined_reasons` of a request (an extra key, from a `plan.Decline`; Zuul reads
`declined_by`, which is unchanged), the per-pool `waiting_reasons` (from a `plan.Waiting`;
the caller writes the request only when `note_waiting` says it changed), the failed
deletion's `Deleting` condition, the phase timings reported once a node is ready, how long
a finished request waited, and the event log entries of launches and deletions. The
conditions a state implies are set by
`core.transition`.
"""

from __future__ import annotations

from typing import Any

from nodepool_k8s.config.model import PoolConfig
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model
from nodepool_k8s.core.model import WAITING_REASONS, Node, NodeRequest
from nodepool_k8s.launcher.plan import Decline, Waiting
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk.events import EventLog
from nodepool_k8s.zk.locks import HeldLock
from nodepool_k8s.zk.nodes import NodeStore

DECLINED_REASONS = "declined_reasons"


def note_decline(request: NodeRequest, pool_id: str, decline: Decline) -> None:
    """Record why pool `pool_id` declined `request` (under `declined_reasons`)."""
    reasons: Any = request.extra.get(DECLINED_REASONS)
    if not isinstance(reasons, dict):
        reasons = {}
    reasons[pool_id] = {"reason": decline.code,
                        "message": decline.message[:cond.MESSAGE_LIMIT]}
    request.extra[DECLINED_REASONS] = reasons


def declined_reasons(request: NodeRequest) -> dict[str, dict[str, str]]:
    reasons = request.extra.get(DECLINED_REASONS)
    if not isinstance(reasons, dict):
        return {}
    return {str(k): v for k, v in reasons.items() if isinstance(v, dict)}


def waiting_note(request: NodeRequest, pool_id: str) -> dict[str, str] | None:
    """What `request` records of why pool `pool_id` holds it back (None: nothing)."""
    reasons = request.extra.get(WAITING_REASONS)
    entry = reasons.get(pool_id) if isinstance(reasons, dict) else None
    return entry if isinstance(entry, dict) else None


def note_waiting(request: NodeRequest, pool_id: str, waiting: Waiting | None) -> bool:
    """Record (None: drop) why pool `pool_id` holds `request` back, under
    `waiting_reasons`; whether that changed the record (only then is it written)."""
    wanted = waiting.to_dict() if waiting is not None else None
    if waiting_note(request, pool_id) == wanted:
        return False
    reasons: Any = request.extra.get(WAITING_REASONS)
    reasons = dict(reasons) if isinstance(reasons, dict) else {}
    if wanted is None:
        reasons.pop(pool_id, None)
    else:
        reasons[pool_id] = wanted
    if reasons:
        request.extra[WAITING_REASONS] = reasons
    else:
        request.extra.pop(WAITING_REASONS, None)
    return True


def note_delete_failed(nodes: NodeStore, node: Node, lock: HeldLock, message: str,
                       now: float) -> None:
    """A deletion that could not be confirmed: `Deleting` False/DeleteFailed and the count
    of failed tries (`delete_failures`) on the record (the failure path: one write, best
    effort), so `nodepool show` says why a node stays `deleting`."""
    failures = node.extra.get("delete_failures")
    count = (failures if isinstance(failures, int) else 0) + 1
    node.extra["delete_failures"] = count
    node.set_condition(cond.Condition(cond.DELETING, cond.FALSE, "DeleteFailed",
                                      f"try {count}: {message}", now))
    try:
        nodes.store(node, lock)
    except Exception:  # noqa: BLE001 - the deletion is retried either way
        pass


def report_ready(stats: Stats, node: Node) -> None:
    """Phase timings of a node that just became ready."""
    seconds = cond.timings(node.conditions, node.created_time)
    if seconds:
        stats.phases(node.provider or "", node.pool or "", node.label or "", seconds)


def report_request_done(stats: Stats, request: NodeRequest, provider: str,
                        pool: PoolConfig, now: float) -> None:
    """How long a request this launcher just fulfilled or failed waited, from its
    requestor's `created_time` (nothing reported without a usable one). Labels the pool
    does not know are not named: they come from requestors (unbounded)."""
    created = request.created_time
    if not isinstance(created, (int, float)) or isinstance(created, bool) \
            or request.state not in (model.RequestState.FULFILLED, model.RequestState.FAILED):
        return
    known = [t for t in request.node_types if t in pool.labels]
    labels = known if len(known) == len(request.node_types) else []
    stats.request_done(provider, pool.name, labels, request.state.value, now - created)


# -- the event log (zk/events.py) -----------------------------------------------------------

def _where(node: Node) -> dict[str, Any]:
    return {"provider": node.provider, "pool": node.pool, "node": node.id,
            "label": node.label}


def record_attempt_failed(events: EventLog, node: Node, attempt: int, reason: str,
                          message: str) -> None:
    # Batched: the launch thread must not wait for ZooKeeper between attempts; the node's
    # final failure (`record_outcome`) writes the batch at once.
    events.record_batched(zk_events.ATTEMPT_FAILED, reason=reason, message=message,
                          attempt=attempt, external_id=node.external_id, **_where(node))


def record_outcome(events: EventLog, node: Node, kind: str, reason: str,
                   message: str) -> None:
    """A launch that failed or was aborted (written at once: the failure path), with the
    conditions written onto the node (the record is deleted soon after; this stays)."""
    events.record(kind, reason=reason, message=message, external_id=node.external_id,
                  conditions=cond.serialise(node.conditions), **_where(node))


def record_ready(events: EventLog, node: Node) -> None:
    """A node handed to Zuul (batched: the success path)."""
    total = cond.timings(node.conditions, node.created_time).get("total")
    events.record_batched(zk_events.LAUNCHED, reason="HandedToZuul",
                          message=f"ready in {total:.1f}s" if total is not None else "",
                          external_id=node.external_id, host_id=node.host_id,
                          **_where(node))


def record_declined(events: EventLog, request: NodeRequest, provider: str, pool: str,
                    decline: Decline) -> None:
    """A request this launcher's decline failed for good (every registered pool declined
    it, or it was a pool's own min-ready request), after the write went through. Batched:
    a burst of requests for a label nobody serves must not cost a write each. A decline
    that leaves the request to other pools is not an event (`declined_reasons` on the
    request says it)."""
    if request.state != model.RequestState.FAILED:
        return
    events.record_batched(zk_events.DECLINED, provider=provider, pool=pool,
                          label=",".join(request.node_types), reason=decline.code,
                          message=decline.message, request=request.id,
                          requestor=request.requestor)


def record_deleted(events: EventLog, node: Node, why: str, refused: str | None) -> None:
    if refused is not None:
        events.record(zk_events.DELETE_REFUSED, reason="NotOwned", message=refused,
                      external_id=node.external_id, **_where(node))
        return
    seconds = None
    deleting = cond.find(node.conditions, cond.DELETING)
    if deleting is not None and deleting.last_transition_time is not None:
        seconds = max(0.0, events.clock.time() - deleting.last_transition_time)
    events.record_batched(zk_events.DELETED, reason="ResourceDeleted", message=why,
                          external_id=node.external_id, seconds=seconds, **_where(node))


def record_stuck(events: EventLog, provider: str, what: str, node: Node | None = None,
                 external_id: str | None = None) -> None:
    """A deletion stuck past its provider's grace (written at once: an operator signal)."""
    where: dict[str, Any] = _where(node) if node is not None else {"provider": provider}
    events.record(zk_events.DELETE_STUCK, reason="DeletionStuck", message=what,
                  external_id=node.external_id if node is not None else external_id,
                  **where)


def report_deleted(stats: Stats, events: EventLog, node: Node) -> None:
    """The deletion phase's duration (Deleting -> gone) as a timer."""
    deleting = cond.find(node.conditions, cond.DELETING)
    if deleting is not None and deleting.last_transition_time is not None \
            and deleting.status == cond.TRUE:
        seconds = max(0.0, events.clock.time() - deleting.last_transition_time)
        stats.phases(node.provider or "", node.pool or "", node.label or "",
                     {"deletion": seconds})
