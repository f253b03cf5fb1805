"""The batch on its own: fresh requests gathered in one pass and accepted together, with
a small owner in place of the pool worker (what `BatchOwner` asks of it)."""

from __future__ import annotations

from nodepool_k8s.core import model
from nodepool_k8s.core.model import NodeRequest
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.launcher.requests.allocation import SlotState
from nodepool_k8s.launcher.requests.batch import Batch
from nodepool_k8s.launcher.requests.handler import HandlerState, RequestHandler
from nodepool_k8s.zk import paths
from nodepool_k8s.zk import requests as request_codec
from nodepool_k8s.zk.locks import HeldLock
from tests.launcher.requests.conftest import MakeDeps
from tests.launcher.requests.support import Deps, InlineLaunches


class Owner:
    """What a pool worker does for its batch, recorded."""

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.launches = InlineLaunches()
        self.seen: set[str] = set()
        self.kept: dict[str, RequestHandler] = {}
        self.refused: list[str] = []
        self.taken: dict[str, int] = {}

    def lock_dir_seen(self, request_id: str) -> bool:
        return request_id in self.seen

    def saw_lock_dir(self, request_id: str) -> None:
        self.seen.add(request_id)

    def taken_elsewhere(self, request: NodeRequest) -> None:
        self.taken[request.id] = request.version

    def new_handler(self, provider: Provider, request: NodeRequest,
                    lock: HeldLock, accept_started: int = 0) -> RequestHandler:
        return RequestHandler(self.deps, self.deps.ref, provider,  # type: ignore[arg-type]
                              self.launches, request, lock,  # type: ignore[arg-type]
                              lambda: {self.deps.ref.pool_id}, lambda: None, accept_started)

    def keep(self, handler: RequestHandler) -> None:
        self.kept[handler.request.id] = handler

    def adopt(self, handler: RequestHandler, paused: bool, may_allocate: bool) -> bool:
        self.keep(handler)
        return handler.advance(may_allocate=may_allocate) or paused

    def refuse(self, request: NodeRequest, exc: Exception) -> None:
        self.refused.append(request.id)


def batch_for(deps: Deps, owner: Owner) -> Batch:
    provider_cfg = deps.config.providers["fake"]
    return Batch(deps, owner, deps.ref, deps.provider, provider_cfg,  # type: ignore[arg-type]
                 provider_cfg.pools["main"])


def cached(deps: Deps, request_id: str) -> NodeRequest:
    request = deps.request_cache.get(request_id)
    assert request is not None
    return request


def state(deps: Deps, request_id: str) -> str:
    request = deps.requests.get(request_id)
    assert request is not None
    return request.state


def no_take(paused: bool) -> RequestHandler | None:
    raise AssertionError("taken the ordinary way")


def test_accepts_the_gathered_requests_with_one_guarded_create(make_deps: MakeDeps) -> None:
    deps = make_deps()
    owner = Owner(deps)
    batch = batch_for(deps, owner)
    ids = [deps.submit(["small"]) for _ in range(3)]

    assert all(batch.add(cached(deps, i), no_take) for i in ids)
    assert batch.node_count == 3
    assert batch.flush(paused=False) is False

    assert sorted(owner.kept) == sorted(ids)
    assert [state(deps, i) for i in ids] == [model.RequestState.PENDING] * 3
    assert len(deps.nodes.ids()) == 3 and owner.launches.in_flight == 3
    guard = deps.zk.exists(paths.provider_guard_path("fake"))
    assert guard is not None and guard.version == 1  # one guarded create for all three
    assert all(s.state is SlotState.LAUNCHING for h in owner.kept.values() for s in h.slots)
    owner.launches.run_all()
    assert [state(deps, i) for i in ids] == [model.RequestState.FULFILLED] * 3


def test_gathers_only_what_fits_and_was_never_locked(make_deps: MakeDeps) -> None:
    deps = make_deps(max_servers=2)
    owner = Owner(deps)
    batch = batch_for(deps, owner)
    seen, first, second, third = (deps.submit(["small"]) for _ in range(4))
    owner.seen.add(seen)

    assert not batch.add(cached(deps, seen), no_take)
    assert batch.add(cached(deps, first), no_take)
    assert batch.add(cached(deps, second), no_take)
    assert not batch.add(cached(deps, third), no_take)  # over max-servers with the two
    assert [r.id for r in batch.requests] == [first, second]


def test_a_request_locked_before_is_taken_the_ordinary_way(make_deps: MakeDeps) -> None:
    deps = make_deps()
    owner = Owner(deps)
    batch = batch_for(deps, owner)
    request_id = deps.submit(["small"])
    taken: list[bool] = []

    def take(paused: bool) -> RequestHandler | None:
        taken.append(paused)
        return None

    assert batch.add(cached(deps, request_id), take)
    deps.zk.ensure_path(paths.request_lock_path(request_id))  # somebody locked it meanwhile
    assert batch.flush(paused=False) is False

    assert taken == [False] and owner.lock_dir_seen(request_id)
    assert owner.kept == {} and deps.nodes.ids() == []
    assert state(deps, request_id) == model.RequestState.REQUESTED


def test_a_race_lost_to_another_launcher_costs_no_lock_attempt(make_deps: MakeDeps) -> None:
    """Another launcher's transaction locked the request and wrote `pending` first: ours
    fails on the lock dir, one read shows it taken, and no contender is created."""
    deps = make_deps()
    owner = Owner(deps)
    batch = batch_for(deps, owner)
    request_id = deps.submit(["small"])
    assert batch.add(cached(deps, request_id), no_take)
    winner = deps.requests.get(request_id)
    assert winner is not None
    winner.state = model.RequestState.PENDING
    deps.zk.ensure_path(paths.request_lock_path(request_id))
    deps.zk.set(paths.request_path(request_id), request_codec.encode(winner), winner.version)
    before = deps.zk.exists(paths.request_lock_path(request_id))
    assert before is not None

    assert batch.flush(paused=False) is False

    after = deps.zk.exists(paths.request_lock_path(request_id))
    assert after is not None and after.cversion == before.cversion  # no contender came
    assert owner.lock_dir_seen(request_id) and owner.kept == {}
    assert state(deps, request_id) == model.RequestState.PENDING


def test_a_paused_pool_locks_the_batch_but_creates_nothing(make_deps: MakeDeps) -> None:
    deps = make_deps()
    owner = Owner(deps)
    batch = batch_for(deps, owner)
    request_id = deps.submit(["small"])

    assert batch.add(cached(deps, request_id), no_take)
    assert batch.flush(paused=True) is True

    handler = owner.kept[request_id]
    assert handler.state is HandlerState.QUEUED
    assert deps.nodes.ids() == [] and owner.launches.in_flight == 0
    assert state(deps, request_id) == model.RequestState.PENDING
