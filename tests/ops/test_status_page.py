"""The status page at `/`, rendered by a real headless browser (Debian's chromium).

Aspects:
- the page is one self-contained document: no external script, style, image or font;
- in chromium, against a running launcher (fake driver), the page's script fetches the
  JSON endpoints and renders one card per running pool with its conditions (a tripped
  circuit breaker shows `Suspended: LabelSuspended`), usage against limits and node counts;
- against a slow launcher the page has one request in flight at a time;
- with NODEPOOL_K8S_SCREENSHOT=<file.png> the test also saves a phone-sized screenshot
  (how doc/status-page.png is made).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.web.app import Answer, WebApp
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import wait_for
from tests.launchers import LauncherFactory
from tests.unit.test_status_web import Source

CONFIG = """
labels:
  - name: small
  - name: flaky
    min-ready: 1
providers:
  - name: fake
    driver: fake
    launch-retries: 1
    pools:
      - name: main
        max-servers: 4
        priority: 1
        breaker-threshold: 1
        breaker-backoff: 3600
        labels:
          - name: small
            type: namespace
            cpu: 1
          - name: flaky
            type: namespace
            fail: true
      - name: spare
        max-servers: 2
        priority: 2
        labels:
          - name: flaky
            type: namespace
"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is installed by tools/test-setup.sh"
    return found


def browser(url: str, tmp_path: Path, *args: str) -> str:
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={tmp_path / 'chrome'}",
         "--virtual-time-budget=4000", *args, url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_page_is_self_contained(launchers: LauncherFactory) -> None:
    launcher = launchers(CONFIG)
    web = WebApp(LauncherStatus(launcher, Stats(RecordingBackend())), port=0).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web.port}/", timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/html")
            page = response.read().decode("utf8")
    finally:
        web.stop()
    assert '<meta name="viewport"' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "@import" not in page and "url(" not in page
    assert 'getJSON("pool-list")' in page and 'getJSON("request-list")' in page


def test_page_renders_pools_in_chromium(launchers: LauncherFactory, zuul: ZuulClient,
                                        tmp_path: Path) -> None:
    launcher = launchers(CONFIG)
    web = WebApp(LauncherStatus(launcher, Stats(RecordingBackend())), port=0).start()
    url = f"http://127.0.0.1:{web.port}/"
    try:
        zuul.run_build(["small"])
        zuul.run_build(["flaky"])  # fails in main (tripping its breaker), served by spare
        wait_for(lambda: any(
            r.get("pool") == "main" and r.get("suspended")
            for r in launcher.engine.pool_statuses.items().values()), 15,
            message="main's breaker tripped")
        dom = browser(url, tmp_path, "--dump-dom")
        assert 'data-loaded="1"' in dom, dom[-3000:]
        assert dom.count('class="card pool"') == 2
        assert 'data-pool="main"' in dom and 'data-pool="spare"' in dom
        assert "Suspended: LabelSuspended" in dom
        assert "Suspended flaky: FakeFail" in dom
        assert "Validated: Valid" in dom and "Quota: Under" in dom
        assert "pool instances" in dom  # usage against max-servers
        # Recent events, newest first: the failed launch of `flaky` in main is written to
        # the event log at once.
        events = dom[dom.index('id="events"'):]
        assert "launch-failed" in events and "fake/main" in events, events[:3000]
        shot = os.environ.get("NODEPOOL_K8S_SCREENSHOT")
        if shot:
            browser(url, tmp_path, f"--screenshot={shot}", "--window-size=412,1100",
                    "--hide-scrollbars")
            assert Path(shot).stat().st_size > 0
    finally:
        web.stop()


class SlowWebApp(WebApp):
    """A launcher that takes a while to answer its data endpoints; counts requests in flight."""

    in_flight = most = served = 0

    async def _answer(self, request: Any) -> Answer:
        if request.path not in ("/pool-list", "/request-list", "/events"):
            return await super()._answer(request)  # the page itself, a favicon
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.3)  # the slow launcher (server side; the test waits on none)
            return await super()._answer(request)
        finally:
            self.in_flight -= 1
            self.served += 1


def test_page_has_one_request_in_flight(tmp_path: Path) -> None:
    """The page polled its three endpoints at once, every 5 s whether or not the previous
    poll had ended: against a stalled launcher the requests piled up. Now one at a time."""
    web = SlowWebApp(Source(), port=0).start()
    try:
        dom = browser(f"http://127.0.0.1:{web.port}/", tmp_path, "--dump-dom")
        assert 'data-loaded="1"' in dom, dom[-3000:]
        assert web.served >= 3
        assert web.most == 1
    finally:
        web.stop()
