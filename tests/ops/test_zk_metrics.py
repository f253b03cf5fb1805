"""The ZooKeeper connection's metrics, on `/metrics` and over statsd, across a real expiry.

Aspects: a launcher service running in this process (fake driver, web app, statsd client
aimed at a real UDP listener) reports its connection as `connected` with both counters at 0
from the start; ZooKeeper expiring its session (a twin client closing it) is counted once as
a session loss and as a reconnect (or two), the state gauge passes through `lost` and ends
`connected` again, and statsd carries the same facts under
`nodepool.launcher.<host>.zk.*` (host name with `.` as `_`).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nodepool_k8s.runtime import stats
from tests.helpers import ZkConnection, wait_for
from tests.ops.conftest import StatsdListener, config_text, running_service
from tests.sessions import CuttingProxy, expire_session

pytestmark = pytest.mark.slow

WEBAPP = "webapp:\n  port: 0\n  listen_address: 127.0.0.1\n"


def test_session_expiry_is_counted_on_metrics_and_statsd(
        tmp_path: Path, zk: ZkConnection, statsd: StatsdListener) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk, webapp=WEBAPP))
    host = socket.gethostname().replace(".", "_").replace(":", "_")
    key = f"nodepool.launcher.{host}.zk"
    with running_service(path, stats.from_env(statsd.env)) as running:
        metrics = running.scrape()
        assert metrics["nodepool_zk_connection_state[('state', 'connected')]"] == 1
        assert metrics["nodepool_zk_connection_state[('state', 'lost')]"] == 0
        assert metrics["nodepool_zk_session_losses_total[]"] == 0
        assert metrics["nodepool_zk_reconnects_total[]"] == 0
        wait_for(lambda: statsd.gauges().get(f"{key}.state.connected") == 1, 10,
                 message="the connected gauge over statsd")

        expire_session(zk, running.service.launcher.zk)

        def counted() -> bool:
            now = running.scrape()
            return (now.get("nodepool_zk_session_losses_total[]") == 1
                    and now.get("nodepool_zk_reconnects_total[]", 0) >= 1
                    and now.get("nodepool_zk_connection_state[('state', 'connected')]") == 1
                    and now.get("nodepool_zk_connection_state[('state', 'lost')]") == 0)
        wait_for(counted, 30, message="the loss and the reconnect on /metrics")
        # The twin may also cut the connection before it ends the session: the client
        # then reconnects once within it first.
        reconnects = running.scrape()["nodepool_zk_reconnects_total[]"]

        def sent() -> bool:
            counters, gauges = statsd.counters(), statsd.gauges()
            return (counters.get(f"{key}.session_lost") == 1
                    and counters.get(f"{key}.reconnects") == reconnects
                    and gauges.get(f"{key}.state.connected") == 1)
        wait_for(sent, 10, message="the loss and the reconnect over statsd")
        assert 1.0 in statsd.gauge_history(f"{key}.state.lost")
        assert statsd.gauges()[f"{key}.state.lost"] == 0
        assert 0.0 in statsd.gauge_history(f"{key}.state.connected")


def test_metrics_show_the_connection_down_while_it_is_down(
        tmp_path: Path, zk: ZkConnection) -> None:
    """The status snapshot is read from ZooKeeper, so while the connection is down it
    still holds the state from before: the connection state is rendered live."""
    proxy = CuttingProxy(zk.port)
    via = ZkConnection(host=zk.host, port=proxy.port, chroot=zk.chroot)
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(via, webapp=WEBAPP))
    try:
        with running_service(path, stats.Stats(stats.RecordingBackend())) as running:
            assert running.scrape()["nodepool_zk_connection_state[('state', 'connected')]"] == 1
            proxy.stop()  # no way back until the relay is replaced

            def down() -> bool:
                now = running.scrape()
                return (now.get("nodepool_zk_connection_state[('state', 'connected')]") == 0
                        and now.get("nodepool_zk_connection_state[('state', 'suspended')]",
                                    0) + now.get("nodepool_zk_connection_state"
                                                 "[('state', 'lost')]", 0) == 1)
            wait_for(down, 30, message="/metrics says the connection is down")
    finally:
        proxy.stop()
