"""The request handler driven step by step: each `advance` is one pool-worker pass, each
`run_all` the launch threads finishing; time moves only when the test steps the clock."""

from __future__ import annotations

from nodepool_k8s.core import model
from nodepool_k8s.core.errors import QuotaExceeded
from nodepool_k8s.launcher.requests.allocation import SlotState
from nodepool_k8s.launcher.requests.handler import HandlerState, RequestHandler
from nodepool_k8s.zk import paths
from tests.launcher.requests.conftest import MakeDeps
from tests.launcher.requests.support import SETTINGS, Deps, InlineLaunches


def handler_for(deps: Deps, labels: list[str], launches: InlineLaunches,
                **submit: bool) -> tuple[RequestHandler, list[int]]:
    request, lock = deps.accept(deps.submit(labels, **submit))
    wakes: list[int] = []
    handler = RequestHandler(deps, deps.ref, deps.provider, launches,  # type: ignore[arg-type]
                             request, lock, lambda: {deps.ref.pool_id},
                             lambda: wakes.append(1))
    return handler, wakes


def stored(deps: Deps, request_id: str) -> model.NodeRequest:
    request = deps.requests.get(request_id)
    assert request is not None
    return request


def test_fulfils_a_request_in_three_steps(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    handler, wakes = handler_for(deps, ["small", "small"], launches)

    assert handler.advance() is False  # nodes created, their launches submitted
    assert handler.state is HandlerState.ACTIVE
    assert [s.state for s in handler.slots] == [SlotState.LAUNCHING] * 2
    assert launches.in_flight == 2
    assert stored(deps, handler.request.id).state == model.RequestState.PENDING

    assert launches.run_all() == 2  # each launch thread's return finishes it at once
    assert wakes
    assert handler.done and handler.state is HandlerState.DONE
    request = stored(deps, handler.request.id)
    assert request.state == model.RequestState.FULFILLED and len(request.nodes) == 2
    for node_id in request.nodes:
        node = deps.nodes.get(node_id)
        assert node is not None and node.state == model.NodeState.READY
        assert node.allocated_to == request.id
        assert not deps.node_cache.is_locked(node_id)
    assert handler.advance() is False  # nothing more to do


def test_waits_at_quota_and_resumes_when_a_node_goes(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(max_servers=1), InlineLaunches()
    first, _ = handler_for(deps, ["small"], launches)
    first.advance()
    launches.run_all()
    assert first.done

    second, _ = handler_for(deps, ["small"], launches, reuse=False)
    assert second.advance() is True
    assert second.state is HandlerState.AT_QUOTA and second.paused
    assert second.blocked_scope == "pool"
    assert second.next_deadline is None  # capacity, not time, ends this wait
    assert second.advance() is True and launches.in_flight == 0

    node_id = stored(deps, first.request.id).nodes[0]
    got = deps.nodes.lock_and_read(node_id)
    assert got is not None
    assert deps.nodes.delete(got[1], got[0])

    assert second.advance() is False
    assert second.state is HandlerState.ACTIVE and not second.paused
    assert launches.run_all() == 1
    assert stored(deps, second.request.id).state == model.RequestState.FULFILLED


def test_queued_behind_a_waiting_request_takes_nothing(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    handler, _ = handler_for(deps, ["small"], launches)

    assert handler.advance(may_allocate=False) is True
    assert handler.state is HandlerState.QUEUED
    assert deps.nodes.ids() == [] and launches.in_flight == 0

    assert handler.advance(may_allocate=True) is False
    assert handler.state is HandlerState.ACTIVE and launches.in_flight == 1


def test_backs_off_after_the_cloud_refuses_then_launches_again(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    deps.provider.fail_next(1, QuotaExceeded("cluster full"))
    handler, _ = handler_for(deps, ["small"], launches)
    handler.advance()
    launches.run_all()

    assert handler.advance() is True
    assert handler.state is HandlerState.BACKING_OFF
    assert handler.next_deadline == deps.clock.monotonic() + SETTINGS.quota_retry
    aborted = [deps.nodes.get(i) for i in deps.nodes.ids()]
    assert [n.state for n in aborted if n is not None] == [model.NodeState.ABORTED]

    deps.clock.advance(SETTINGS.quota_retry - 1)
    assert handler.advance() is True and launches.in_flight == 0

    deps.clock.advance(1)
    assert handler.advance() is False
    assert handler.state is HandlerState.ACTIVE and handler.next_deadline is None
    assert launches.run_all() == 1
    assert handler.done
    assert stored(deps, handler.request.id).state == model.RequestState.FULFILLED


def test_a_failed_launch_declines_the_request(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(fail=True), InlineLaunches()
    handler, _ = handler_for(deps, ["small"], launches)
    handler.advance()
    launches.run_all()

    assert handler.done
    request = stored(deps, handler.request.id)
    # The only registered pool declined it: it failed.
    assert request.state == model.RequestState.FAILED
    assert request.declined_by == [deps.ref.pool_id]
    failed = [deps.nodes.get(i) for i in deps.nodes.ids()]
    assert [n.state for n in failed if n is not None] == [model.NodeState.FAILED]


def test_a_cancelled_request_keeps_its_node_for_reuse(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    handler, _ = handler_for(deps, ["small"], launches)
    handler.advance()
    deps.zk.delete(paths.request_path(handler.request.id))  # the requestor gave up
    launches.run_all()

    assert handler.advance() is False
    assert handler.done
    [node_id] = deps.nodes.ids()
    node = deps.nodes.get(node_id)
    assert node is not None and node.state == model.NodeState.READY and node.allocated_to is None
    assert not deps.node_cache.is_locked(node_id)


def test_abandons_without_writing_once_its_lock_is_gone(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    handler, _ = handler_for(deps, ["small"], launches)
    handler.lock.release()

    assert handler.advance() is False
    assert handler.done and handler.cancel.is_set()
    assert stored(deps, handler.request.id).state == model.RequestState.PENDING
    assert deps.nodes.ids() == []


def test_a_backward_wall_clock_step_does_not_stall_the_relaunch(make_deps: MakeDeps) -> None:
    """The wait after the cloud's refusal is on monotonic time: a backward step of the
    wall clock (chrony's makestep, a resumed VM) does not hold it for as long."""
    deps, launches = make_deps(), InlineLaunches()
    deps.provider.fail_next(1, QuotaExceeded("cluster full"))
    handler, _ = handler_for(deps, ["small"], launches)
    handler.advance()
    launches.run_all()
    assert handler.advance() is True and handler.state is HandlerState.BACKING_OFF

    deps.clock.step_wall(-3600.0)
    deps.clock.advance(SETTINGS.quota_retry + 1)

    assert handler.advance() is False and launches.run_all() == 1
    request = stored(deps, handler.request.id)
    assert request.state == model.RequestState.FULFILLED and request.declined_by == []
    keys = deps.stats.backend.keys("incr")  # type: ignore[attr-defined]
    assert "nodepool.launch.error.quota" in keys and "nodepool.launch.ready" in keys


def test_a_min_ready_request_at_quota_is_declined_not_paused(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(max_servers=1), InlineLaunches()
    first, _ = handler_for(deps, ["small"], launches)
    first.advance()
    launches.run_all()
    assert first.done
    request, lock = deps.accept(deps.submit(["small"], reuse=False))
    request.requestor = model.MIN_READY_REQUESTOR
    min_ready = RequestHandler(deps, deps.ref, deps.provider, launches,  # type: ignore[arg-type]
                               request, lock, lambda: {deps.ref.pool_id}, lambda: None)

    assert min_ready.advance() is False
    assert min_ready.done and not min_ready.paused
    assert stored(deps, request.id).state == model.RequestState.FAILED
    assert len(deps.nodes.ids()) == 1 and launches.in_flight == 0


def waiting(deps: Deps, request_id: str) -> dict[str, str] | None:
    entries = stored(deps, request_id).extra.get(model.WAITING_REASONS) or {}
    entry = entries.get(deps.ref.pool_id)
    return {"reason": entry["reason"], "message": entry["message"]} if entry else None


def test_why_it_waits_is_written_when_it_changes_and_dropped_when_it_ends(
        make_deps: MakeDeps) -> None:
    deps, launches = make_deps(max_servers=1), InlineLaunches()
    handler, _ = handler_for(deps, ["small"], launches)
    request_id = handler.request.id

    assert handler.advance(may_allocate=False) is True
    assert waiting(deps, request_id) == {
        "reason": "QueuedInPool",
        "message": "behind an earlier request of this pool that waits"}
    version = stored(deps, request_id).version
    assert handler.advance(may_allocate=False) is True  # the same cause: no write
    assert stored(deps, request_id).version == version

    assert handler.advance() is False  # it goes on: the note goes
    assert handler.state is HandlerState.ACTIVE
    assert waiting(deps, request_id) is None
    assert stored(deps, request_id).state == model.RequestState.PENDING
    launches.run_all()
    assert handler.done

    second, _ = handler_for(deps, ["small"], launches, reuse=False)
    assert second.advance() is True and second.state is HandlerState.AT_QUOTA
    assert waiting(deps, second.request.id) == {
        "reason": "WaitingForQuota", "message": "waits until its nodes fit the pool limit"}
    version = stored(deps, second.request.id).version
    assert second.advance() is True
    assert stored(deps, second.request.id).version == version


def test_a_backing_off_request_says_why(make_deps: MakeDeps) -> None:
    deps, launches = make_deps(), InlineLaunches()
    deps.provider.fail_next(1, QuotaExceeded("cluster full"))
    handler, _ = handler_for(deps, ["small"], launches)
    handler.advance()
    launches.run_all()

    assert handler.advance() is True and handler.state is HandlerState.BACKING_OFF
    note = waiting(deps, handler.request.id)
    assert note is not None and note["reason"] == "LaunchBackoff"
    assert "QuotaExceeded" in note["message"]

    deps.clock.advance(SETTINGS.quota_retry)
    assert handler.advance() is False
    assert launches.run_all() == 1 and handler.done
    request = stored(deps, handler.request.id)
    assert request.state == model.RequestState.FULFILLED
    assert model.WAITING_REASONS not in request.extra
