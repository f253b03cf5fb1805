"""The event log's operator signals (real ZooKeeper, fake driver): each kind appears when
its branch runs.

Aspects: a request no registered pool serves is failed by this launcher's decline and
logged once as `declined` (reason LabelNotServed, the request's id and labels); an
operator's pause and resume of the pool are `pool-paused` / `pool-resumed`; an applied
reload is `config-reloaded`; a deletion the provider refuses (the resource is not provably
ours) is `delete-refused` with reason NotOwned, and the node record goes.
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.client import KazooClient

from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.pool_state import PAUSE, PoolStateStore
from tests.helpers import ZkConnection, wait_for
from tests.launchers import BASIC, LauncherFactory, make_config


def events_of(launcher: Launcher, kind: str) -> list[dict[str, Any]]:
    # Batched kinds are written at the latest `batch_age` after the first: not waited for.
    launcher.engine.events.flush()
    return [e for e in zk_events.read_events(launcher.zk) if e.get("kind") == kind]


def test_a_request_nobody_serves_is_one_declined_event(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(BASIC)
    request_id = zuul.submit(["nope"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "failed"
    wait_for(lambda: events_of(launcher, zk_events.DECLINED), 15,
             message="the declined event written")
    (event,) = events_of(launcher, zk_events.DECLINED)
    assert (event["provider"], event["pool"], event["reason"], event["request"],
            event["label"]) == ("fake", "main", "LabelNotServed", request_id, "nope")
    # A fulfilled request is no decline.
    zuul.run_build(["small"])
    assert len(events_of(launcher, zk_events.DECLINED)) == 1


def test_pause_resume_and_reload_are_events(launchers: LauncherFactory,
                                            zk: ZkConnection) -> None:
    launcher = launchers(BASIC)
    store = PoolStateStore(launcher.zk)
    store.set("fake/main", PAUSE, "upgrade", "ops@host", 1.0)
    wait_for(lambda: events_of(launcher, zk_events.POOL_PAUSED), 15,
             message="pool-paused written")
    assert events_of(launcher, zk_events.POOL_PAUSED)[0]["pool"] == "main"
    store.clear("fake/main")
    wait_for(lambda: events_of(launcher, zk_events.POOL_RESUMED), 15,
             message="pool-resumed written")
    launcher.reload(make_config(zk, BASIC))
    wait_for(lambda: events_of(launcher, zk_events.CONFIG_RELOADED), 15,
             message="config-reloaded written")
    assert events_of(launcher, zk_events.CONFIG_RELOADED)[-1]["message"] == "1 pool(s)"


def test_a_refused_deletion_is_an_event(launchers: LauncherFactory, zk: ZkConnection,
                                        zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    fake = FakeProvider(make_config(zk, BASIC).providers["fake"])
    launcher = launchers(BASIC, provider_factory=lambda cfg, clock: fake)
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    held = zuul.accept(request_id)
    zuul.use(held)
    node_id = held.nodes[0].id
    record = json.loads(kazoo_client.get(paths.node_path(node_id))[0])
    with fake.cloud.lock:
        fake.cloud.foreign.add(record["external_id"])  # someone else's now
    zuul.release(held)
    wait_for(lambda: events_of(launcher, zk_events.DELETE_REFUSED), 30,
             message="delete-refused written")
    (event,) = events_of(launcher, zk_events.DELETE_REFUSED)
    assert (event["node"], event["reason"]) == (node_id, "NotOwned")
    assert "not ours" in event["message"]
