"""Tracing off costs nothing: a launcher process that served a whole build (accept, launch,
fulfil, use, return) without a `tracing` section never imported any opentelemetry module.
It runs in a process of its own, so modules other tests imported do not count."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import ZkConnection
from tests.launchers import small_pool

SCRIPT = """
import json, sys
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.settings import EngineSettings

launcher = Launcher(load_config_text(sys.argv[1]), settings=EngineSettings(stop_timeout=10.0))
assert launcher.start()
try:
    with ZuulClient(sys.argv[2]) as zuul:
        request_id, nodes = zuul.run_build(["small"], timeout=120.0)
finally:
    launcher.stop()
print(json.dumps({"nodes": nodes, "loaded": sorted(
    name for name in sys.modules if name.split(".")[0] == "opentelemetry")}))
"""


def test_a_build_without_tracing_imports_no_opentelemetry(zk: ZkConnection) -> None:
    config = zk.config_yaml() + textwrap.dedent(small_pool(2))
    done = subprocess.run([sys.executable, "-c", SCRIPT, config, zk.hosts],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["nodes"]) == 1
    assert result["loaded"] == []
