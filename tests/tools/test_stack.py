"""The local stack (`nodepool_k8s.dev.testing.stack`) and the simulator's counters endpoint.

Aspects: the simulator in its own process answers `/debug/counters` to the admin (not
counted itself, no faults) and refuses other methods; `Stack.stop()` stops every child and
removes its work directory, even after a launcher died; the tool scripts are executable
thin wrappers around the Python entry points.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from nodepool_k8s.dev.testing.stack import Stack, StackError
from tests.tools.conftest import REPO


def test_simulator_counters_endpoint(tmp_path: Path) -> None:
    stack = Stack(workdir=str(tmp_path / "stack"))
    (tmp_path / "stack").mkdir()
    try:
        sim = stack.start_simulator()
        before = sim.counters()
        assert sim.namespaces() == ["default", "kube-node-lease", "kube-public",
                                    "kube-system"]
        after = sim.counters()
        assert after.get("list namespaces", 0) == before.get("list namespaces", 0) + 1
        assert after["total"] == before.get("total", 0) + 1  # reading counters is free
        request = urllib.request.Request(sim.url + "/debug/counters", method="POST",
                                         headers={"Authorization": f"Bearer {sim.token}"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10, context=sim._ssl)
        assert err.value.code == 405
        anonymous = urllib.request.Request(sim.url + "/debug/counters")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(anonymous, timeout=10, context=sim._ssl)
        assert err.value.code == 401
    finally:
        stack.stop()
    assert not sim.alive()


def test_stop_after_a_launcher_died(tmp_path: Path) -> None:
    stack = Stack()
    workdir = stack.workdir
    pids = []
    try:
        pids.append(stack.start_zookeeper().pid)
        pids.append(stack.start_simulator().pid)
        bad = stack.write_config("this: is not a nodepool configuration\n")
        launcher = stack.start_launcher(stack.new_chroot(), config=bad)
        with pytest.raises(StackError, match="exited with 1"):
            stack.wait_launchers(launcher.chroot, 1, timeout=30)
    finally:
        problems = stack.stop()
    assert any("exited early" in p for p in problems)
    assert not workdir.exists()
    assert all(pid and not Path(f"/proc/{pid}").exists() for pid in pids)


def test_tool_scripts() -> None:
    for name, module in (("demo.sh", "nodepool_k8s.dev.testing.demo"),
                         ("benchmark", "nodepool_k8s.dev.testing.bench")):
        path = REPO / "tools" / name
        assert os.access(path, os.X_OK), path
        text = path.read_text()
        assert "tools/test-setup.sh" in text and f"-m {module}" in text
