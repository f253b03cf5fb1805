"""Tolerations and node requirements against the simulator's scheduler and tainted nodes.

A cluster of three nodes: two GPU nodes tainted gpu=true:NoSchedule (one a100, one t4) and
one plain node; every node carries a numeric `cores` label. Launches go through the real
provider and client; the pod's node (`host_id`) shows where the scheduler put it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.core.errors import LaunchError
from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.kubernetes.conftest import ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

GPU_TAINT = [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
NODES = {"gpu-a100": {"gpu": "a100", "cores": "64"},
         "gpu-t4": {"gpu": "t4", "cores": "16"},
         "plain": {"cores": "8"}}
TOLERATE_GPU = ({"key": "gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"},)


@pytest.fixture
def cluster(make_sim: Any) -> Simulator:
    sim: Simulator = make_sim(node_labels=NODES,
                              node_taints={"gpu-a100": GPU_TAINT, "gpu-t4": GPU_TAINT})
    return sim


def _launch(provider: Any, label: str, node_id: str) -> Any:
    return provider.launch(make_spec(provider.config, label, node_id=node_id),
                           threading.Event())


def test_gpu_label_lands_only_on_matching_nodes(cluster: Simulator,
                                                make_k8s_provider: ProviderFactory) -> None:
    gpu = make_label("gpu-pod", tolerations=TOLERATE_GPU, node_requirements=(
        {"key": "gpu", "operator": "In", "values": ["a100"]},))
    plain = make_label("plain-pod")
    provider = make_k8s_provider(cluster, gpu, plain)
    hosts = {_launch(provider, "gpu-pod", f"000000000{i}").host_id for i in range(3)}
    assert hosts == {"gpu-a100"}
    # Without a toleration only the untainted node is possible.
    hosts = {_launch(provider, "plain-pod", f"000000001{i}").host_id for i in range(3)}
    assert hosts == {"plain"}


def test_gt_and_lt_compare_numeric_node_labels(cluster: Simulator,
                                               make_k8s_provider: ProviderFactory) -> None:
    big = make_label("big", tolerations=({"key": "gpu", "operator": "Exists"},),
                     node_requirements=({"key": "cores", "operator": "Gt", "values": ["9"]},
                                        {"key": "cores", "operator": "Lt", "values": ["32"]}))
    provider = make_k8s_provider(cluster, big)
    assert {_launch(provider, "big", f"000000002{i}").host_id for i in range(2)} == {"gpu-t4"}


def test_not_in_and_does_not_exist_keep_pods_off_matching_nodes(
        cluster: Simulator, make_k8s_provider: ProviderFactory) -> None:
    """Every node is tolerated: only the requirement decides where the pod lands."""
    not_a100 = make_label("not-a100", tolerations=({"operator": "Exists"},),
                          node_requirements=(
                              {"key": "gpu", "operator": "NotIn", "values": ["a100"]},))
    no_gpu = make_label("no-gpu", tolerations=({"operator": "Exists"},),
                        node_requirements=({"key": "gpu", "operator": "DoesNotExist"},))
    provider = make_k8s_provider(cluster, not_a100, no_gpu)
    # NotIn admits a node without the key at all (plain) and one with another value (t4).
    hosts = {_launch(provider, "not-a100", f"000000005{i}").host_id for i in range(6)}
    assert "gpu-a100" not in hosts and hosts <= {"gpu-t4", "plain"}
    assert {_launch(provider, "no-gpu", f"000000006{i}").host_id for i in range(3)} \
        == {"plain"}
    # The pods carry the operators to the API as configured.
    pod = cluster.get("pods", "no-gpu", "main-0000000060")
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"] == [{"key": "gpu", "operator": "DoesNotExist"}]


def test_preferred_requirements_pick_the_preferred_node(
        cluster: Simulator, make_k8s_provider: ProviderFactory) -> None:
    label = make_label("pref", tolerations=({"operator": "Exists"},),
                       preferred_node_requirements=(
                           {"key": "gpu", "operator": "In", "values": ["t4"], "weight": 50},))
    provider = make_k8s_provider(cluster, label)
    assert {_launch(provider, "pref", f"000000003{i}").host_id for i in range(3)} == {"gpu-t4"}


def test_requirement_matching_no_node_is_unschedulable_then_fails(
        cluster: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    clock = ManualClock()
    label = make_label("h100", boot_timeout=60, node_requirements=(
        {"key": "gpu", "operator": "In", "values": ["h100"]},))
    provider = make_k8s_provider(cluster, label, clock=clock)  # grace 30 s
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _launch(provider, "h100", "0000000040")
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()

    def condition() -> Any:
        pod = cluster.get("pods", "h100", "main-0000000040")
        found = [c for c in ((pod or {}).get("status") or {}).get("conditions") or []
                 if c.get("reason") == "Unschedulable"]
        return found[0] if found else None
    found = changes.until(condition, message="the pod to be unschedulable")
    assert found["type"] == "PodScheduled" and found["status"] == "False"
    # Without the toleration the GPU nodes fail on their taint first, as in kube-scheduler.
    assert found["message"].startswith(
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector,"
        " 2 node(s) had untolerated taint {gpu: true}.")
    clock.advance(20)
    thread.join(0.3)
    assert thread.is_alive()
    clock.advance(31)
    thread.join(10)
    assert not thread.is_alive()
    error = outcome["error"]
    assert isinstance(error, LaunchError) and error.reason == "Unschedulable"
    assert "didn't match Pod's node affinity/selector" in str(error)
