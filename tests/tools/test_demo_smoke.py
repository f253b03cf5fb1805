"""The demo (`bash tools/demo.sh` runs `python -m nodepool_k8s.dev.testing.demo`).

Aspects: it runs to the end on the local stack (real ZooKeeper, simulator, launcher
process), exits 0 and reports the fulfilled requests and the namespaces created and
removed; nothing is left behind (processes, temporary directories); Ctrl-C in the middle
stops everything too and exits 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.tools.conftest import REPO, leftovers, processes_mentioning, run_module

pytestmark = pytest.mark.slow


def test_demo_runs_and_cleans_up(tmp_path: Path) -> None:
    done = run_module("nodepool_k8s.dev.testing.demo", "--timeout", "90", tmp=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "3 requests fulfilled, 5 namespaces created and removed" in done.stdout
    assert "nodepool-launcher stopped cleanly" in done.stdout
    assert leftovers(tmp_path) == []
    assert processes_mentioning(str(tmp_path)) == []


def test_demo_interrupted(tmp_path: Path) -> None:
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "nodepool_k8s.dev.testing.demo"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # pragma: no branch
        seen.append(line)
        if "Submitting node requests" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    # Stopping waits up to 30 s for each process before it kills it (the launcher's graceful
    # stop, the simulator, ZooKeeper): on a machine this busy a clean stop may need more than
    # a minute, and what is asserted is that it happens and leaves nothing behind.
    rest, _ = proc.communicate(timeout=180)
    assert proc.returncode == 130, "".join(seen) + rest
    assert "interrupted" in rest
    wait_for(lambda: not processes_mentioning(str(tmp_path)), 10,
             message="every child process to be gone")
    assert leftovers(tmp_path) == []
