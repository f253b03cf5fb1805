"""The published pool status: its statsd gauges, and its record across a session expiry.

Aspects: `stats.pool_status_gauges` turns a pool status record into Nodepool-style keys
(conditions as 1/0, usage and limit per scope and resource, nodes by state, queued
requests) and skips odd entries; a pool worker sends them whenever it publishes its
status, with the values of the published record (stepped: its passes alone, on a manual
clock); a running launcher writes the record again in a new session.
"""

from __future__ import annotations

import json
import textwrap

from kazoo.client import KazooClient

from nodepool_k8s.runtime import stats
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.runtime.stats import RecordingBackend
from nodepool_k8s.zk.client import ZkClient
from nodepool_k8s.zk.pool_status import status_path
from tests.helpers import ZkConnection, wait_for
from tests.launcher.requests.support import WorkerDeps, pool_yaml
from tests.launcher.requests.test_pool_worker import worker_for
from tests.launchers import LauncherFactory, make_config
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


def test_pool_worker_sends_the_published_status(zk: ZkConnection, zkc: ZkClient) -> None:
    deps = WorkerDeps(zkc, make_config(zk, textwrap.dedent(pool_yaml())), ManualClock())
    worker, launches = worker_for(deps)
    request_id = deps.submit(["small"])
    worker.run_once()
    launches.run_all()
    worker.run_once()
    request = deps.requests.get(request_id)
    assert request is not None and request.state == "fulfilled"
    published = worker.published_status
    assert published is not None
    key = "nodepool.pool.fake.main.condition.Validated"
    expected = stats.pool_status_gauges(published)
    assert expected and key in expected
    backend = deps.stats.backend
    assert isinstance(backend, RecordingBackend)
    sent = {k: v for kind, k, v in list(backend.sent) if kind == "gauge"}
    # Every key of the published record was sent, with its value.
    assert {k: sent.get(k) for k in expected} == expected
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
