"""Fixtures for the simulator's own tests: the official client pointed at `k8s_sim`.

Every test talks to the simulator over real HTTPS through `kubernetes` 36.0.3, exactly like
the driver does; nothing is mocked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import pytest
from kubernetes import client, config

from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from tests.helpers import Signal


@dataclass
class Kube:
    api: client.ApiClient
    core: client.CoreV1Api
    rbac: client.RbacAuthorizationV1Api

    def close(self) -> None:
        self.api.close()


def connect(kubeconfig: str, context: str = "sim") -> Kube:
    api = config.new_client_from_config(config_file=kubeconfig, context=context)
    return Kube(api, client.CoreV1Api(api), client.RbacAuthorizationV1Api(api))


@pytest.fixture
def kube(k8s_sim: Simulator) -> Iterator[Kube]:
    assert k8s_sim.kubeconfig_path
    k = connect(k8s_sim.kubeconfig_path)
    try:
        yield k
    finally:
        k.close()


@pytest.fixture
def changes(request: pytest.FixtureRequest) -> Iterator[Signal]:
    """Told of every change of the test's simulators (`k8s_sim`, if the test has it, and
    each one `make_sim` starts): objects stored, changed or deleted, watches opened or
    ended; not of API calls, as the checks read through the API."""
    signal = Signal()
    if "k8s_sim" in request.fixturenames:
        signal.listen(request.getfixturevalue("k8s_sim"))
    yield signal
    signal.close()


@pytest.fixture
def make_sim(tmp_path: Any,
             changes: Signal) -> Iterator[Callable[..., tuple[Simulator, Kube]]]:
    """Start a simulator with custom settings; returns (sim, connected client)."""
    started: list[tuple[Simulator, Kube]] = []

    def factory(**settings: Any) -> tuple[Simulator, Kube]:
        sim = Simulator(SimulatorConfig(**settings)).start()
        changes.listen(sim)
        path = sim.write_kubeconfig(tmp_path / f"kubeconfig-{len(started)}")
        pair = (sim, connect(path))
        started.append(pair)
        return pair

    yield factory
    for sim, k in started:
        k.close()
        sim.stop()


def existing(sim: Simulator, kind: str, name: str,
             namespace: str | None = None) -> dict[str, Any]:
    """The simulator's copy of an object that must exist."""
    obj = sim.get(kind, name, namespace)
    assert obj is not None, f"{kind} {namespace}/{name} does not exist"
    return obj


def pod_body(name: str, image: str = "busybox:1.36", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": name}},
            "spec": {"containers": [{"name": "main", "image": image}], **spec}}


def token_secret_body(name: str, sa: str) -> dict[str, Any]:
    return {"metadata": {"name": name,
                         "annotations": {"kubernetes.io/service-account.name": sa}},
            "type": "kubernetes.io/service-account-token"}
