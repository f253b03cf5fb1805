"""The one way a record's state changes (`core.transition`): state, state time and the
condition the state implies move together; the states are the protocol's strings; copies
change without touching the original."""

from __future__ import annotations

import json

import pytest

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node, NodeRequest, NodeState, RequestState
from nodepool_k8s.core.transition import transition, transition_request
from nodepool_k8s.runtime.clock import ManualClock

PROTOCOL_NODE_STATES = ("building", "testing", "ready", "in-use", "used", "hold", "deleting",
                        "failed", "init", "aborted", "deleted")
PROTOCOL_REQUEST_STATES = ("requested", "pending", "fulfilled", "failed")


def node() -> Node:
    return Node(id="0000000001", state=NodeState.INIT, state_time=1.0, type=["small"])


def kinds(n: Node) -> list[tuple[str, str, str]]:
    return [(c.type, c.status, c.reason) for c in n.conditions]


def test_states_are_the_protocol_strings_and_encode_as_before() -> None:
    assert [s.value for s in NodeState] == list(PROTOCOL_NODE_STATES)
    assert [s.value for s in RequestState] == list(PROTOCOL_REQUEST_STATES)
    n = node()
    transition(n, NodeState.IN_USE, 2.0)
    data = n.to_dict()
    assert type(data["state"]) is str and json.dumps(data["state"]) == '"in-use"'
    back = Node.from_dict(n.id, json.loads(json.dumps(data)))
    assert back.state is NodeState.IN_USE
    assert Node.from_dict(n.id, data, summary=True).state is NodeState.IN_USE
    r = NodeRequest.from_dict("100-0000000001", {"state": "pending"})
    assert r.state is RequestState.PENDING and type(r.to_dict()["state"]) is str


@pytest.mark.parametrize("state", ["bogus", "Ready", None, 3])
def test_unknown_states_are_refused_as_before(state: object) -> None:
    with pytest.raises(ValueError):
        Node.from_dict("1", {"state": state})
    with pytest.raises(ValueError):
        NodeRequest.from_dict("100-0000000001", {"state": state})


def test_building_starts_the_launch_conditions_once() -> None:
    clock = ManualClock(100.0)
    n = node()
    transition(n, NodeState.BUILDING, clock.time())
    assert (n.state, n.state_time) == (NodeState.BUILDING, 100.0)
    assert kinds(n) == [(t, cond.UNKNOWN, "Pending") for t in cond.LAUNCH_TYPES]
    n.set_condition(cond.Condition(cond.LAUNCHED, cond.TRUE, "NamespaceCreated", "", 101.0))
    clock.advance(5)
    transition(n, NodeState.BUILDING, clock.time())  # a relaunch keeps what happened
    assert kinds(n)[0] == (cond.LAUNCHED, cond.TRUE, "NamespaceCreated")
    assert n.state_time == 105.0


def test_ready_is_handed_to_zuul_at_the_same_time() -> None:
    clock = ManualClock(200.0)
    n = node()
    transition(n, NodeState.BUILDING, clock.time())
    clock.advance(7.5)
    transition(n, NodeState.READY, clock.time())
    ready = cond.find(n.conditions, cond.READY)
    assert ready == cond.Condition(cond.READY, cond.TRUE, "HandedToZuul",
                                   "the node is ready for Zuul", 207.5)
    assert (n.state, n.state_time) == (NodeState.READY, 207.5)


def test_deleting_says_why_and_keeps_its_start_when_repeated() -> None:
    clock = ManualClock(300.0)
    n = node()
    transition(n, NodeState.DELETING, clock.time(), message="max-ready-age reached")
    clock.advance(30)
    transition(n, NodeState.DELETING, clock.time(), message="again")
    deleting = cond.find(n.conditions, cond.DELETING)
    assert deleting is not None and deleting.status == cond.TRUE
    assert (deleting.reason, deleting.message) == ("DeletionStarted", "again")
    assert deleting.last_transition_time == 300.0  # the status did not change
    assert n.state_time == 330.0


@pytest.mark.parametrize("state", [NodeState.FAILED, NodeState.ABORTED])
def test_failure_marks_the_first_incomplete_phase_with_a_registry_code(
        state: NodeState) -> None:
    clock = ManualClock(400.0)
    n = node()
    transition(n, NodeState.BUILDING, clock.time())
    n.set_condition(cond.Condition(cond.LAUNCHED, cond.TRUE, "NamespaceCreated", "", 401.0))
    clock.advance(2)
    transition(n, state, clock.time(), reason="Forbidden", message="no create")
    assert kinds(n)[:2] == [(cond.LAUNCHED, cond.TRUE, "NamespaceCreated"),
                            (cond.REGISTERED, cond.FALSE, "Forbidden")]
    assert n.failure_reason == "Forbidden" and n.state is state and n.state_time == 402.0
    other = node()
    transition(other, state, clock.time(), reason="ValueError", message="")
    assert other.failure_reason == "Unknown"  # never a class name


@pytest.mark.parametrize("state", [NodeState.HOLD, NodeState.USED, NodeState.IN_USE,
                                   NodeState.DELETED, NodeState.TESTING, NodeState.INIT])
def test_other_states_leave_the_conditions_alone(state: NodeState) -> None:
    n = node()
    transition(n, NodeState.BUILDING, 1.0)
    before = n.conditions
    transition(n, state, 9.0)
    assert n.conditions == before and (n.state, n.state_time) == (state, 9.0)


def test_request_transition_moves_state_and_time() -> None:
    r = NodeRequest(id="100-0000000001")
    transition_request(r, RequestState.PENDING, 5.0)
    assert (r.state, r.state_time) == (RequestState.PENDING, 5.0)


def test_copies_change_alone() -> None:
    n = node()
    n.set(external_id="ns-1")
    n.extra["delete_failures"] = 1
    moved = n.copy()
    transition(moved, NodeState.BUILDING, 2.0)
    moved.set(external_id="ns-2", host_keys=["k"])
    moved.extra["delete_failures"] = 2
    moved.type.append("other")
    assert (n.state, n.state_time, n.conditions, n.external_id) == (
        NodeState.INIT, 1.0, [], "ns-1")
    assert n.host_keys == [] and n.extra == {"delete_failures": 1} and n.type == ["small"]
    summary = Node.from_dict("1", {"state": "ready"}, summary=True)
    with pytest.raises(model.SummaryError):
        summary.copy()
    r = NodeRequest(id="100-0000000001", nodes=["1"], extra={"x": {"y": 1}})
    c = r.copy()
    c.nodes.append("2")
    c.extra["x"]["y"] = 2
    transition_request(c, RequestState.FULFILLED, 3.0)
    assert (r.state, r.nodes, r.extra) == (RequestState.REQUESTED, ["1"], {"x": {"y": 1}})
