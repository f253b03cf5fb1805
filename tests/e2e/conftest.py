"""Fixtures for the end-to-end tests of the Kubernetes driver through the launcher.

Every test gets a fresh ZooKeeper chroot (`zk`) and a fresh simulated cluster (`k8s_sim`,
TLS, context "sim"), and `$KUBECONFIG` points at the simulator's admin kubeconfig, which is
where the daemon's providers read their credentials (`KubernetesProvider.start`).
`launchers`, `zuul` and `processes` are the shared fixtures of tests/conftest.py (in-process
`Launcher`s built from YAML through the real config loader; the Zuul-like client; real
launcher processes, which inherit `$KUBECONFIG`), reused here.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from nodepool_k8s.dev.simulator import Simulator
from tests.e2e.util import KubeEventLog, NamespaceLog


@pytest.fixture(autouse=True)
def kube_env(k8s_sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> Simulator:
    """The simulator, with $KUBECONFIG naming its admin kubeconfig (context "sim")."""
    assert k8s_sim.kubeconfig_path is not None
    monkeypatch.setenv("KUBECONFIG", k8s_sim.kubeconfig_path)
    return k8s_sim


@pytest.fixture
def kube_events(k8s_sim: Simulator) -> Iterator[KubeEventLog]:
    """Every Kubernetes Event created in the simulator from now on, in order."""
    recorder = KubeEventLog(k8s_sim).start()
    try:
        yield recorder
    finally:
        recorder.stop()


@pytest.fixture
def namespace_log(k8s_sim: Simulator) -> Iterator[NamespaceLog]:
    """Every namespace created in the simulator from now on, in order."""
    recorder = NamespaceLog(k8s_sim).start()
    try:
        yield recorder
    finally:
        recorder.stop()
