"""Kubernetes Events (`events.EventRecorder`): a node's launch events of one batch window
are one Event (one API request), later ones are not held for ever, the rate limit drops
and counts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.driver.kubernetes.client import KubeClient, RetryPolicy, load_configuration
from nodepool_k8s.driver.kubernetes.events import EventRecorder
from tests.helpers import Signal, wait_for


def client_of(sim: Simulator, tmp_path: Path, *namespaces: str) -> KubeClient:
    path = str(sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim"))
    configuration, context = load_configuration("sim", path, 4)
    client = KubeClient(configuration, context, RetryPolicy(retries=0), provider="sim")
    for name in namespaces:
        client.call("create namespace", client.api.create_namespace,
                    {"metadata": {"name": name}})
    return client


def events_in(sim: Simulator, namespace: str) -> list[dict[str, Any]]:
    return sorted(sim.list("events", namespace), key=lambda e: e["metadata"]["name"])


def test_a_nodes_launch_events_within_the_window_are_one_event(
        make_sim: Callable[..., Simulator], tmp_path: Path) -> None:
    sim = make_sim()
    client = client_of(sim, tmp_path, "n", "m")
    recorder = EventRecorder(client, window=600.0)  # sent when stopped, not before
    recorder.start()
    sim.reset_counters()
    recorder.emit("n", "Launched", "node 1: namespace n created (attempt 1)", node_id="1")
    recorder.emit("m", "Launched", "node 2: namespace m created (attempt 1)", node_id="2")
    recorder.emit("n", "Registered", "node 1: token in place", node_id="1")
    recorder.emit("n", "Ready", "node 1 is ready for Zuul", node_id="1")
    recorder.emit("n", "LaunchFailed", "node 1 attempt 2: boom", warning=True, node_id="1")
    recorder.stop()
    assert sim.counters.get("create events") == 3
    normal, warning = sorted(events_in(sim, "n"), key=lambda e: e["type"])
    assert (normal["reason"], normal["type"]) == ("Ready", "Normal")
    assert normal["message"] == ("node 1: namespace n created (attempt 1); node 1: token in "
                                 "place; node 1 is ready for Zuul")
    assert normal["involvedObject"] == {"apiVersion": "v1", "kind": "Namespace", "name": "n"}
    assert normal["metadata"]["labels"] == {"nodepool-node-id": "1"}
    assert normal["firstTimestamp"] <= normal["lastTimestamp"]
    assert (warning["reason"], warning["type"]) == ("LaunchFailed", "Warning")
    (other,) = events_in(sim, "m")
    assert other["reason"] == "Launched"
    assert (recorder.sent, recorder.merged, recorder.dropped) == (3, 2, 0)
    client.close()


def test_a_queued_event_goes_out_once_its_window_ends(
        make_sim: Callable[..., Simulator], changes: Signal, tmp_path: Path) -> None:
    sim = make_sim()
    client = client_of(sim, tmp_path, "n")
    recorder = EventRecorder(client, window=0.05)
    recorder.start()
    try:
        recorder.emit("n", "Launched", "node 1: namespace n created", node_id="1")
        changes.until(lambda: events_in(sim, "n"), message="the event to be sent")
        recorder.emit("n", "Ready", "node 1 is ready for Zuul", node_id="1")
        changes.until(lambda: len(events_in(sim, "n")) == 2,
                      message="the later event to be sent on its own")
        assert sorted(e["reason"] for e in events_in(sim, "n")) == ["Launched", "Ready"]
        # Counted once its answer is read, a moment after the simulator has it.
        wait_for(lambda: recorder.sent == 2, 30, message="the second answer to be read")
        assert recorder.merged == 0
    finally:
        recorder.stop()
        client.close()


def test_events_over_the_rate_are_dropped_and_counted(
        make_sim: Callable[..., Simulator], tmp_path: Path) -> None:
    sim = make_sim()
    names = [f"n{i}" for i in range(5)]
    client = client_of(sim, tmp_path, *names)
    recorder = EventRecorder(client, rate=0.0, burst=2, window=600.0)
    recorder.start()
    sim.reset_counters()
    for name in names:  # five objects: five Events wanted, two in the budget
        recorder.emit(name, "Launched", "created")
        recorder.emit(name, "Ready", "ready")
    recorder.stop()
    assert sim.counters.get("create events") == 2
    assert (recorder.sent, recorder.dropped) == (2, 6)
    recorder.emit("n0", "Deleting", "deleting", now=True)  # sent inline: over the rate too
    assert (recorder.sent, recorder.dropped) == (2, 7)
    client.close()
