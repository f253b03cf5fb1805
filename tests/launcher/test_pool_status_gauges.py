"""statsd gauges of the published pool status (issue 13).

Aspects: `stats.pool_status_gauges` turns a pool status record into Nodepool-style keys
(conditions as 1/0, usage and limit per scope and resource, nodes by state, queued
requests) and skips odd entries; a running launcher sends them whenever its pool worker
publishes its status, with the values of the published record.
"""

from __future__ import annotations

from nodepool_k8s.runtime import stats
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import wait_for
from tests.launchers import LauncherFactory


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
