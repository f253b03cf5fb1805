"""min-ready on its own: one `run_once` is one pass; its back-off moves only with the
ManualClock (no worker thread, no wait)."""

from __future__ import annotations

import json

from nodepool_k8s.core import model
from nodepool_k8s.core.model import Node, NodeRequest
from nodepool_k8s.launcher.requests.handler import RequestHandler
from nodepool_k8s.launcher import maintenance
from nodepool_k8s.launcher.requests.min_ready import MinReadyWorker
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.pool_state import DRAIN, PAUSE, PoolState
from tests.launcher.requests.conftest import MakeDeps
from tests.launcher.requests.support import SETTINGS, Deps, InlineLaunches, ReadThroughNodes


# The ManualClock starts at 2023-11-14 22:13:20 UTC: inside this window, 46m40s before its end.
MAINTENANCE = """
        maintenance:
          - schedule: "0 22 * * *"
            duration: 1h
            action: drain"""


def min_ready_requests(deps: Deps) -> list[NodeRequest]:
    return [r for r in deps.request_cache.requests()
            if r.requestor == model.MIN_READY_REQUESTOR]


def serve(deps: Deps, request: NodeRequest) -> RequestHandler:
    """Serve the request to its end, as the pool worker and a launch thread would."""
    fresh, lock = deps.accept(request.id)
    launches = InlineLaunches()
    handler = RequestHandler(deps, deps.ref, deps.provider, launches,  # type: ignore[arg-type]
                             fresh, lock, lambda: {deps.ref.pool_id}, lambda: None)
    handler.advance()
    launches.run_all()
    assert handler.done
    return handler


def test_creates_the_missing_requests_once(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=2)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]

    assert worker.run_once() is None
    requests = min_ready_requests(deps)
    assert len(requests) == 2 and worker.created == 2
    for request in requests:
        assert request.priority == model.MIN_READY_PRIORITY
        assert request.node_types == ["small"] and not request.reuse
        assert deps.request_cache.owner(request.id) == deps.zk.session_id  # ephemeral

    worker.run_once()
    assert len(min_ready_requests(deps)) == 2 and worker.created == 2


def test_a_fulfilled_request_leaves_a_spare(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=1)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]
    worker.run_once()
    [request] = min_ready_requests(deps)
    serve(deps, request)

    worker.run_once()

    assert deps.zk.exists(paths.request_path(request.id)) is None
    [node_id] = deps.nodes.ids()
    node = deps.nodes.get(node_id)
    assert node is not None and node.state == model.NodeState.READY and node.allocated_to is None
    assert min_ready_requests(deps) == []  # the spare counts: nothing more to ask for


def test_a_failed_request_backs_the_label_off(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=1, fail=True)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]
    worker.run_once()
    [request] = min_ready_requests(deps)
    serve(deps, request)
    failed = deps.requests.get(request.id)
    assert failed is not None and failed.state == model.RequestState.FAILED

    until = worker.run_once()

    assert until == deps.clock.monotonic() + SETTINGS.min_ready_backoff
    assert min_ready_requests(deps) == []
    deps.clock.advance(SETTINGS.min_ready_backoff - 1)
    assert worker.run_once() == until and min_ready_requests(deps) == []

    deps.clock.advance(1)
    assert worker.run_once() is None
    assert len(min_ready_requests(deps)) == 1 and worker.created == 2


def test_the_request_carries_every_key_zuul_reads(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=1)
    MinReadyWorker(deps).run_once()  # type: ignore[arg-type]
    [request] = min_ready_requests(deps)

    got = deps.zk.get(paths.request_path(request.id))
    assert got is not None
    data, stat = got
    body = json.loads(data)
    for key in ("requestor", "requestor_data", "node_types", "provider", "state",
                "state_time", "event_id"):
        assert key in body
    assert body["requestor"] == "NodePool:min-ready" and body["reuse"] is False
    assert body["node_types"] == ["small"] and body["state"] == model.RequestState.REQUESTED
    assert stat.ephemeral_owner == deps.zk.session_id


def test_a_backward_wall_clock_step_does_not_stall_the_back_off(make_deps: MakeDeps) -> None:
    """The back-off after a failed request is on monotonic time."""
    deps = make_deps(min_ready=1, fail=True)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]
    worker.run_once()
    [request] = min_ready_requests(deps)
    serve(deps, request)
    assert worker.run_once() is not None and min_ready_requests(deps) == []

    deps.clock.step_wall(-3600.0)
    deps.clock.advance(SETTINGS.min_ready_backoff + 1)

    assert worker.run_once() is None and len(min_ready_requests(deps)) == 1


def test_a_paused_or_drained_pool_asks_for_no_spares(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=2)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]
    for action in (DRAIN, PAUSE):
        deps.pool_states.states = [PoolState(target="fake/main", action=action)]
        assert worker.run_once() is None
        assert min_ready_requests(deps) == [] and worker.created == 0, action
    deps.pool_states.states = []  # resumed: the spares are asked for again
    worker.run_once()
    assert len(min_ready_requests(deps)) == 2


def test_a_maintenance_window_holds_min_ready_until_it_ends(make_deps: MakeDeps) -> None:
    deps = make_deps(min_ready=1, maintenance=MAINTENANCE)
    worker = MinReadyWorker(deps)  # type: ignore[arg-type]
    start = deps.clock.time()
    assert maintenance.in_force(deps.pool_states, "fake", deps.config.providers["fake"]
                                .pools["main"], start) is not None
    wake = worker.run_once()
    assert min_ready_requests(deps) == []
    # It asks to be woken when the window ends, and then asks for the spare.
    assert wake is not None and wake > deps.clock.monotonic()
    deps.clock.advance(wake - deps.clock.monotonic())
    worker.run_once()
    assert len(min_ready_requests(deps)) == 1


class UnreadNodes(ReadThroughNodes):
    """A node cache that shows some nodes as read before their latest changes (as the
    real one leaves changes made under another launcher's lock unread) until refreshed."""

    def __init__(self, fresh: ReadThroughNodes, old: dict[str, Node]) -> None:
        super().__init__(fresh.zk, fresh.store)
        self.old = old
        self.refreshed: list[str] = []

    def get(self, node_id: str) -> Node | None:
        return self.old.get(node_id) or super().get(node_id)

    def nodes(self) -> list[Node]:
        return [self.old.get(n.id, n) for n in super().nodes()]

    def stale(self) -> set[str]:
        return set(self.old)

    def refresh(self, ids: list[str] | None = None, timeout: float = 10.0) -> bool:
        for node_id in list(self.old) if ids is None else ids:
            if self.old.pop(node_id, None) is not None:
                self.refreshed.append(node_id)
        return True


def test_a_spare_turned_ready_under_another_launchers_lock_is_read_before_counting(
        make_deps: MakeDeps) -> None:
    """Another launcher's min-ready request is fulfilled; its node turned ready under that
    launcher's lock, so our cache still holds it `building`. Counted from that copy it is
    no spare, and the fulfilled request does not count it either (the node is known): the
    count reads it first and asks for nothing."""
    deps = make_deps(min_ready=1)
    MinReadyWorker(deps).run_once()  # type: ignore[arg-type]
    [request] = min_ready_requests(deps)
    serve(deps, request)
    [node] = deps.node_cache.nodes()
    assert node.state == model.NodeState.READY and node.allocated_to == request.id
    building = Node.from_dict(node.id, {**node.to_dict(), "state": model.NodeState.BUILDING})
    deps.request_cache.owner = lambda request_id: None  # type: ignore[method-assign]
    unread = UnreadNodes(deps.node_cache, {node.id: building})
    deps.node_cache = unread  # type: ignore[assignment]

    MinReadyWorker(deps).run_once()  # type: ignore[arg-type]

    assert [r.id for r in min_ready_requests(deps)] == [request.id]
    assert unread.refreshed == [node.id]
