"""The web app against clients that misbehave: it must not be able to hurt the launcher.

Aspects: unknown query parameters are a 400 and the memo stays bounded under a flood of
distinct query strings; idle, half-sent connections hold at most the worker pool and are
closed after the timeout while `/ready` keeps answering; an over-long request line is
refused; client disconnects log no error; CORS only when configured.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.error
import urllib.request
from typing import Iterator

import pytest

from nodepool_k8s.clock import ManualClock
from nodepool_k8s.config.model import WebappConfig
from nodepool_k8s.webapp import MEMO_ENTRIES, WebApp
from tests.helpers import wait_for
from tests.unit.test_status_web import NOW, Source


def get(url: str, accept: str | None = None,
        timeout: float = 10) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def serve(**options: object) -> WebApp:
    config = WebappConfig(port=0, **options)  # type: ignore[arg-type]
    return WebApp(Source(), config, clock=ManualClock(NOW)).start()


@pytest.fixture
def apps() -> Iterator[list[WebApp]]:
    started: list[WebApp] = []
    yield started
    for app in started:
        app.stop()


def test_unknown_parameters_are_400_and_known_ones_work(apps: list[WebApp]) -> None:
    app = serve()
    apps.append(app)
    base = f"http://127.0.0.1:{app.port}"
    code, body, _ = get(base + "/node-list?nocache=1")
    assert code == 400 and "node_id" in body and "nocache" not in body
    assert get(base + "/ready?x=1")[0] == 400
    assert get(base + "/request-list?node_id=1")[0] == 400
    assert get(base + "/node-list?node_id=0000000001&fields=id")[0] == 200
    assert get(base + "/label-list?fields=")[0] == 200


def test_distinct_query_flood_keeps_the_memo_bounded(apps: list[WebApp]) -> None:
    app = serve()
    apps.append(app)
    base = f"http://127.0.0.1:{app.port}"
    for i in range(300):
        assert get(f"{base}/node-list?node_id={i:010d}")[0] == 200
        assert get(f"{base}/node-list?fields=id,{i}", "application/json")[0] == 200
        assert get(f"{base}/node-list?junk{i}=1")[0] == 400
    assert 0 < app.memo_size <= MEMO_ENTRIES
    # Spellings that resolve to the same columns share one entry.
    before = app.memo_size
    for spelling in ("id", "ID", "id,", "%20id", "id,nonsense"):
        assert get(f"{base}/request-list?fields={spelling}")[0] == 200
    assert app.memo_size <= before + 2


def _server_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("CP Server Thread"))


def test_idle_half_sent_connections_are_bounded_and_closed(apps: list[WebApp]) -> None:
    app = serve(threads=2, timeout=0.5)
    apps.append(app)
    base = f"http://127.0.0.1:{app.port}"
    pool = _server_threads()
    total = threading.active_count()
    assert pool == 2
    idle = []
    for _ in range(12):
        sock = socket.create_connection(("127.0.0.1", app.port), timeout=15)
        sock.sendall(b"GET /node-list HTTP/1.1\r\nHost: x\r\n")  # headers never end
        idle.append(sock)
    for _ in range(3):
        idle.append(socket.create_connection(("127.0.0.1", app.port), timeout=15))  # silent
    # /ready answers while the half-sent connections time out one pool-full at a time.
    assert wait_for(lambda: get(base + "/ready", timeout=15)[0] == 200, 30, message="/ready")
    assert _server_threads() == pool and threading.active_count() <= total
    for sock in idle:  # the server hangs up on every one (408 first, or just EOF)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        assert data == b"" or data.startswith(b"HTTP/1.1 408")
        sock.close()
    assert _server_threads() == pool


def test_over_long_request_line_is_refused(apps: list[WebApp]) -> None:
    app = serve(max_header_size=2048)
    apps.append(app)
    base = f"http://127.0.0.1:{app.port}"
    code = get(base + "/node-list?node_id=" + "1" * 4096)[0]
    assert code in (413, 414, 431)
    assert get(base + "/ready")[0] == 200


def test_client_disconnects_log_no_error(apps: list[WebApp],
                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = serve(threads=1)  # one worker: the barrier request below is served after the rest
    apps.append(app)
    base = f"http://127.0.0.1:{app.port}"
    half = socket.create_connection(("127.0.0.1", app.port), timeout=10)
    half.sendall(b"GET /node-list HTTP/1.1\r\nHo")
    half.close()
    reset = socket.create_connection(("127.0.0.1", app.port), timeout=10)
    reset.sendall(b"GET /node-list HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reset.recv(16).startswith(b"HTTP/1.1 200")  # read part of the answer, then go
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    reset.close()  # linger 0: a reset, not a clean close
    assert get(base + "/ready")[0] == 200
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert noisy == []


def test_cors_origin_only_when_configured(apps: list[WebApp]) -> None:
    plain, cors = serve(), serve(cors_origin="https://zuul.example.org")
    apps += [plain, cors]
    assert "Access-Control-Allow-Origin" not in get(f"http://127.0.0.1:{plain.port}/ready")[2]
    headers = get(f"http://127.0.0.1:{cors.port}/node-list")[2]
    assert headers["Access-Control-Allow-Origin"] == "https://zuul.example.org"
