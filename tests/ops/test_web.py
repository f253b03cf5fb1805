"""The web app served by a real launcher (in process: `LauncherService`, real ZooKeeper).

Aspects: `/ready` answers 503 while the launcher cannot reach ZooKeeper and 200 once it
serves; `/node-list` as JSON and as a table (lock flag, token redacted), `?node_id=`;
`/request-list` and `/label-list` from the caches and the registered pools; `/metrics`
with node gauges and the launch and leak counters; a reload that changes the web port
moves the server; `--no-webapp` serves nothing.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nodepool_k8s.config.loader import load_config
from nodepool_k8s.launcher.service import LauncherService
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS
from tests.ops.conftest import BASE, config_text, free_port

FAILING = (BASE + """          - name: broken
            type: pod
            fail: true
""").replace("  - name: slow\nproviders:", "  - name: slow\n  - name: broken\nproviders:")

LOCAL_WEB = """
webapp:
  port: {port}
  listen_address: 127.0.0.1
"""


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


class Running:
    """A LauncherService running `run()` on a thread."""

    def __init__(self, path: Path, webapp: bool = True) -> None:
        self.path = path
        self.service = LauncherService(str(path), None, load_config(str(path)),
                                       settings=TEST_SETTINGS, webapp=webapp,
                                       poll_interval=0.1)
        self.status: list[int] = []
        self.thread = threading.Thread(target=lambda: self.status.append(self.service.run()))
        self.thread.start()

    @property
    def base(self) -> str:
        webapp = wait_for(lambda: self.service.webapp, 10, message="web app started")
        assert webapp is not None
        return f"http://127.0.0.1:{webapp.port}"

    def stop(self) -> int:
        self.service.request_stop()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.status[0]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[list[Running]]:
    started: list[Running] = []
    try:
        yield started
    finally:
        for item in started:
            if item.thread.is_alive():
                item.stop()


def start(running: list[Running], path: Path, text: str, webapp: bool = True) -> Running:
    path.write_text(text)
    item = Running(path, webapp)
    running.append(item)
    return item


def test_ready_is_503_until_the_launcher_serves(tmp_path: Path, running: list[Running]) -> None:
    # Nothing listens on port 1: the launcher keeps retrying ZooKeeper, the web app answers.
    unreachable = ZkConnection(host="127.0.0.1", port=1, chroot="/nowhere")
    item = start(running, tmp_path / "nodepool.yaml",
                 config_text(unreachable, BASE, LOCAL_WEB.format(port=0)))
    code, _, body = get(item.base + "/ready")
    assert code == 503 and body == "Launcher not ready"
    code, _, body = get(item.base + "/node-list", "application/json")
    assert code == 503 and "Status unavailable" in body
    assert item.stop() == 0


def test_endpoints_of_a_serving_launcher(tmp_path: Path, zk: ZkConnection, zuul: ZuulClient,
                                         running: list[Running]) -> None:
    item = start(running, tmp_path / "nodepool.yaml",
                 config_text(zk, FAILING, LOCAL_WEB.format(port=0)))
    base = item.base
    wait_for(lambda: get(base + "/ready")[0] == 200, 30, message="/ready 200")
    assert get(base + "/ready")[2] == "OK"

    # One node in use by "Zuul" (locked), one request that no pool can serve (failed), one
    # launch that failed (counted).
    in_use = zuul.submit(["small"])
    assert (zuul.wait(in_use) or {}).get("state") == "fulfilled"
    nodeset = zuul.accept(in_use)
    zuul.use(nodeset)
    node_id = nodeset.nodes[0].id
    unknown = zuul.submit(["no-such-label"])
    assert (zuul.wait(unknown) or {}).get("state") == "failed"
    broken = zuul.submit(["broken"])
    assert (zuul.wait(broken) or {}).get("state") == "failed"

    def node_rows() -> list[dict[str, object]]:
        code, ctype, body = get(base + "/node-list", "application/json")
        assert code == 200 and ctype == "application/json"
        return json.loads(body)  # type: ignore[no-any-return]

    rows = wait_for(lambda: [r for r in node_rows() if r["id"] == node_id
                             and r["state"] == "in-use"], 10, message="node in use listed")
    row = rows[0]
    assert row["locked"] == "locked" and row["connection_port"] == "redacted"
    assert row["provider"] == "fake" and row["pool"] == "main" and row["label"] == ["small"]
    assert row["server_id"] == f"main-{node_id}" and row["allocated_to"] == in_use
    assert isinstance(row["user_data"], dict)
    code, ctype, body = get(base + "/node-list")
    assert code == 200 and ctype == "text/plain"
    assert node_id in body and "locked" in body and "fake-token" not in body
    code, _, body = get(base + f"/node-list?node_id={node_id}", "application/json")
    assert [r["id"] for r in json.loads(body)] == [node_id]
    assert "fake-token" not in body

    code, _, body = get(base + "/request-list", "application/json")
    requests = {r["id"]: r for r in json.loads(body)}
    assert requests[unknown]["state"] == "failed"
    assert requests[unknown]["node_types"] == ["no-such-label"]
    assert len(requests[unknown]["declined_by"]) == 1
    code, _, body = get(base + "/request-list")
    assert code == 200 and unknown in body and "Declined By" in body

    code, _, body = get(base + "/label-list", "application/json")
    assert json.loads(body) == [{"label": "broken"}, {"label": "slow"}, {"label": "small"}]

    code, ctype, body = get(base + "/metrics")
    assert code == 200 and ctype.startswith("text/plain; version=0.0.4")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body) for s in family.samples}
    assert samples[("nodepool_nodes", (("state", "in-use"),))] == 1
    assert samples[("nodepool_provider_nodes", (("provider", "fake"), ("state", "in-use")))] == 1
    assert samples[("nodepool_label_nodes", (("label", "small"), ("state", "in-use")))] == 1
    assert samples[("nodepool_requests", (("state", "failed"),))] == 2
    assert samples[("nodepool_launcher_ready", ())] == 1
    assert samples[("nodepool_launch_total", (("provider", "fake"), ("result", "ready")))] == 1
    assert samples[("nodepool_launch_total",
                    (("provider", "fake"), ("result", "error.nodepool")))] == 1
    assert "# TYPE nodepool_launch_total counter" in body

    zuul.release(nodeset)
    assert item.stop() == 0
    assert item.service.webapp is None


def test_reload_moves_the_web_app_to_a_new_port(tmp_path: Path, zk: ZkConnection,
                                                running: list[Running]) -> None:
    path = tmp_path / "nodepool.yaml"
    item = start(running, path, config_text(zk, BASE, LOCAL_WEB.format(port=0)))
    old = item.base
    wait_for(lambda: get(old + "/ready")[0] == 200, 30, message="/ready 200")
    port = free_port()
    path.write_text(config_text(zk, BASE, LOCAL_WEB.format(port=port)))
    item.service.request_reload()
    new = f"http://127.0.0.1:{port}"

    def serving_new() -> bool:
        try:
            return get(new + "/ready")[0] == 200
        except OSError:
            return False
    wait_for(serving_new, 15, message="web app on the new port")
    with pytest.raises(OSError):
        get(old + "/ready")
    assert item.stop() == 0


def test_no_webapp(tmp_path: Path, zk: ZkConnection, running: list[Running]) -> None:
    item = start(running, tmp_path / "nodepool.yaml",
                 config_text(zk, BASE, LOCAL_WEB.format(port=0)), webapp=False)
    wait_for(lambda: item.service.launcher.ready, 30, message="launcher ready")
    assert item.service.webapp is None
    assert item.stop() == 0
