"""Other launchers' pool statuses are read when a view needs them, not at every change.

Aspects: without statsd a launcher's pool-status cache leaves another launcher's status
changes unread (the entry is stale, its last read record kept) and the web app's source
reads them when it builds a view (`LauncherStatus.pool_statuses`), showing the latest
record; its own pool's status stays current; a launcher with statsd (whose pool gauges
combine the other launchers' records at every publish) reads the change as it comes.
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient

from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk.pool_status import status_path
from tests.helpers import Signal
from tests.launchers import LauncherFactory, small_pool
from tests.zk.support import drained, write_counted

OTHER = "other-host-PoolWorker.fake-main-0123"


def other_status(queued: int) -> bytes:
    return json.dumps({"id": OTHER, "hostname": "other-host", "provider": "fake",
                       "pool": "main", "requests_queued": queued, "paused": False,
                       "conditions": []}).encode()


def test_another_launchers_status_is_read_when_a_view_asks(
        launchers: LauncherFactory, kazoo_client: KazooClient) -> None:
    launcher = launchers(small_pool(4), stats=Stats())  # no statsd
    with_statsd = launchers(small_pool(4), stats=Stats(RecordingBackend()))
    cache, watching = launcher.engine.pool_statuses, with_statsd.engine.pool_statuses
    mirror = cache._mirror
    with Signal().listen(cache).listen(watching) as changes:
        kazoo_client.create(status_path(OTHER), other_status(0), ephemeral=True)
        changes.until(lambda: cache.get(OTHER) is not None
                      and watching.get(OTHER) is not None, 10)
        reads = mirror.reads
        write_counted(kazoo_client, mirror, OTHER, status_path(OTHER), other_status(3))
        assert mirror.reads == reads
        record = cache.get(OTHER)
        assert record is not None and record["requests_queued"] == 0
        assert OTHER in cache.stale()
        # Our own pool's status is not left stale.
        ids = launcher.engine.registry.pool_ids()
        own = [key for key, r in cache.items().items() if r.get("id") in ids]
        assert len(own) == 1 and not set(own) & cache.stale()
        # With statsd the change is read as it comes.
        changes.until(lambda: (r := watching.get(OTHER)) is not None
                      and r["requests_queued"] == 3, 10)
        drained(watching._mirror)
        assert not watching.stale()

        shown = LauncherStatus(launcher, Stats()).pool_statuses()
        assert [r["requests_queued"] for r in shown if r["id"] == OTHER] == [3]
        assert mirror.reads == reads + 1 and not cache.stale()
