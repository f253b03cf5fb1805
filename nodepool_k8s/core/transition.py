"""State changes of nodes and requests: the one place a record's `state` is set.

Owns: `transition` (a node) and `transition_request` (a request), which set the state, its
`state_time` and, for a node, the lifecycle condition that state implies, together, so a
record never carries a state its conditions contradict:

- `building`: the launch conditions start as Unknown/Pending (kept when a launch already
  set them);
- `ready`: `Ready` True (HandedToZuul);
- `deleting`: `Deleting` True (DeletionStarted), the message saying why;
- `failed`, `aborted`: the first launch condition not yet True turns False with the reason
  (a code of `conditions.REASONS`; anything else is written as `Unknown`);
- any other state (Zuul's `in-use`, `used`, `hold`; our `deleted` marker): no condition.

Pure: time is passed in, nothing is written. A caller that must not change its record
before a write succeeds moves a copy (`Node.copy`, `NodeRequest.copy`) and applies the same
transition to the original once the write went through.
"""

from __future__ import annotations

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core.model import (
    WAITING_REASONS, Node, NodeRequest, NodeState, RequestState)

READY_MESSAGE = "the node is ready for Zuul"


def transition(node: Node, state: NodeState, now: float, *, reason: str | None = None,
               message: str = "") -> None:
    """Move `node` to `state` at `now` (wall time) with the condition `state` implies.

    `reason` (failed, aborted): why, one of `conditions.REASONS`; `message`: the
    condition's message (the error, or why the node is deleted).
    """
    node.state = state
    node.state_time = now
    if state is NodeState.BUILDING:
        if not node.conditions:
            node.conditions = cond.initial(now)
    elif state is NodeState.READY:
        node.set_condition(cond.Condition(cond.READY, cond.TRUE, "HandedToZuul",
                                          message or READY_MESSAGE, now))
    elif state is NodeState.DELETING:
        node.set_condition(cond.Condition(cond.DELETING, cond.TRUE, "DeletionStarted",
                                          message, now))
    elif state is NodeState.FAILED or state is NodeState.ABORTED:
        node.conditions = cond.fail(node.conditions, reason or "Unknown", message, now)


def transition_request(request: NodeRequest, state: RequestState, now: float) -> None:
    """Move `request` to `state` at `now` (wall time). Requests carry no conditions; why it
    waited (`WAITING_REASONS`) belonged to the state it leaves, so it goes with it."""
    request.state = state
    request.state_time = now
    request.extra.pop(WAITING_REASONS, None)
