"""The published pool status: its statsd gauges, and its record across a session expiry.

Aspects: `stats.pool_status_gauges` turns a pool status record into Nodepool-style keys
(conditions as 1/0, usage and limit per scope and resource, nodes by state, queued
requests) and skips odd entries; a running launcher sends them whenever its pool worker
publishes its status, with the values of the published record.
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.runtime import stats
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk.pool_status import status_path
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory
from tests.sessions import expire_session


def test_keys_from_a_record() -> None:
    record = {
        "provider": "kube", "pool": "main.east",
        "conditions": [{"type": "Quota", "status": "True", "reason": "Under"},
                       {"type": "Capacity", "status": "Unknown"}, "odd", {"status": "True"}],
        "usage": [{"scope": "pool", "resource": "instances", "used": 2, "limit": 10},
                  {"scope": "provider", "resource": "cores", "used": 4}, 7],
        "nodes": {"ready": 1, "in-use": 1, "bad": "x"},
        "requests_queued": 3,
    }
    assert stats.pool_status_gauges(record) == {
        "nodepool.pool.kube.main.east.condition.Quota": 1.0,
        "nodepool.pool.kube.main.east.condition.Capacity": 0.0,
        "nodepool.pool.kube.main.east.usage.pool.instances": 2.0,
        "nodepool.pool.kube.main.east.limit.pool.instances": 10.0,
        "nodepool.pool.kube.main.east.usage.provider.cores": 4.0,
        "nodepool.pool.kube.main.east.nodes.ready": 1.0,
        "nodepool.pool.kube.main.east.nodes.in-use": 1.0,
        "nodepool.pool.kube.main.east.requests_queued": 3.0,
    }


def test_launcher_sends_the_published_status(launchers: LauncherFactory,
                                             zuul: ZuulClient) -> None:
    backend = RecordingBackend()
    launcher = launchers(stats=Stats(backend))
    body = zuul.wait(zuul.submit(["small"]))
    assert body is not None and body["state"] == "fulfilled"
    worker = next(iter(launcher.pool_workers.values()))
    wait_for(lambda: worker.published_status is not None, 30, message="a published status")
    key = "nodepool.pool.fake.main.condition.Validated"
    wait_for(lambda: key in backend.keys("gauge"), 30, message="the pool gauges")
    published = worker.published_status
    assert published is not None
    expected = stats.pool_status_gauges(published)
    assert expected and key in expected
    sent = {k: v for kind, k, v in list(backend.sent) if kind == "gauge"}
    # Every key of a published record was sent (later publishes may have newer values).
    assert set(expected) <= set(sent)
    assert sent[key] == 1.0  # the pool's configuration is valid


def test_the_status_is_published_again_after_a_session_expiry(
        launchers: LauncherFactory, zk: ZkConnection, kazoo_client: KazooClient) -> None:
    launcher = launchers()
    worker = next(iter(launcher.pool_workers.values()))
    path = status_path(worker.id)
    wait_for(lambda: kazoo_client.exists(path), 30, message="the pool status record")
    epoch = launcher.zk.epoch
    expire_session(zk, launcher.zk)
    wait_for(lambda: launcher.zk.epoch > epoch and launcher.zk.connected, 60,
             message="a new session")
    # Nothing about the pool changed, yet its record (an ephemeral of the old session) is
    # written again without any request coming.
    wait_for(lambda: kazoo_client.exists(path), 30, message="the pool status again")
    data, stat = kazoo_client.get(path)
    assert stat.ephemeralOwner == launcher.zk.session_id
    assert json.loads(data)["id"] == worker.id
