"""The shared watches keep only what the launcher created, as slim copies, within bounds.

Aspects:
- a job holding a `namespace` node (its token, its Role, RBAC enforced) creates 300 pods in
  its namespace carrying the node's `nodepool*` labels and a 100 KB annotation each, while
  pod nodes keep being launched: the launcher's memory (allocations made under the driver's
  frames, tracemalloc) grows by less than 8 MiB (about 60 MiB when every such pod was kept
  whole by the pod watch and the capacity watch), none of those pods is in the pod watch,
  and capacity does not count them as the launcher's own;
- after a restart (a new provider, same configuration) the namespace watch still holds the
  namespaces of existing nodes and capacity still counts their pods as ours;
- a namespace with our labels but a name not made for its node id is not kept, and its
  deletion is confirmed by a watch on its name (the shared watch will never report it);
- capacity's watch of all pods keeps only pods bound to a node (not pending, not finished);
- relists are read in pages (`limit` + `continue`); a continue token the server has
  compacted away (410 Expired) starts the list again from the beginning;
- a copy larger than the per-object bound is not kept (one WARNING for a flood), and a
  full cache keeps no objects of new names.
"""

from __future__ import annotations

import gc
import logging
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, ManualClock
from nodepool_k8s.config.schema import OBJECT_QUOTA
from nodepool_k8s.driver.kubernetes import manifests, slim
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider
from nodepool_k8s.driver.kubernetes.readiness import PodCheck
from nodepool_k8s.driver.kubernetes.waiter import ObjectWatch
from nodepool_k8s.core.errors import LaunchError
from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal, wait_for
from tests.kubernetes.conftest import FAST, ProviderFactory, watching
from tests.kubernetes.factories import make_label, make_provider, make_spec

# The operator lets this label's jobs have more pods than the default object quota, so a
# job can create the flood at all: what the watches keep must not depend on that quota.
NS = make_label("k8s-namespace", "namespace",
                object_quota={**OBJECT_QUOTA, "pods": 1000})
POD = make_label("pod-fedora", "pod", cpu=1)
FOREIGN_PODS = 300
ANNOTATION = "x" * (100 * 1024)
MiB = 1024 * 1024


def _api(sim: Simulator, tmp_path: Any, name: str, token: str | None = None) -> k8s.CoreV1Api:
    path = sim.write_kubeconfig(tmp_path / name, token=token) if token \
        else sim.write_kubeconfig(tmp_path / name)
    return k8s.CoreV1Api(k8s_config.new_client_from_config(config_file=str(path),
                                                           persist_config=False))


def _launch(provider: KubernetesProvider, label: str, node_id: str) -> Any:
    return provider.launch(make_spec(provider.config, label, node_id=node_id),
                           threading.Event())


@pytest.fixture
def sim_process(tmp_path: Path) -> Iterator[Path]:
    """A simulator (RBAC enforced) in a process of its own: this process is then the
    launcher and the job's client only, so its memory is the launcher's to judge."""
    kubeconfig, ready = tmp_path / "sim-kubeconfig", tmp_path / "sim-ready"
    with open(tmp_path / "sim.log", "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "nodepool_k8s.dev.simulator", "--kubeconfig", str(kubeconfig),
             "--ready-file", str(ready), "--enforce-rbac", "--watch-history", "20000"],
            stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: ready.exists() or process.poll() is not None, 60,
                 message="the simulator process to listen")
        assert process.poll() is None, (tmp_path / "sim.log").read_text()
        yield kubeconfig
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


def _client_for(kubeconfig: Path, token: str | None = None) -> k8s.CoreV1Api:
    """A client of the admin kubeconfig, or with `token` instead of the admin's."""
    config = yaml.safe_load(kubeconfig.read_text())
    if token is not None:
        for user in config["users"]:
            user["user"] = {"token": token}
    return k8s.CoreV1Api(k8s_config.new_client_from_config_dict(config,
                                                                persist_config=False))


def _foreign_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels,
                         "annotations": {"job.example/blob": ANNOTATION}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "resources": {"requests": {"cpu": "10m"}}}]}}


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_a_jobs_pods_with_our_labels_cost_no_memory_and_no_capacity(
        sim_process: Path) -> None:
    provider = KubernetesProvider(make_provider(NS, POD, capacity_nodes=True),
                                  kubeconfig=str(sim_process), settings=FAST)
    provider.start()
    try:
        _flood(provider, sim_process)
    finally:
        provider.stop()


def _flood(provider: KubernetesProvider, kubeconfig: Path) -> None:
    changes = watching(provider)
    changes.until(provider.watches_synced, message="the provider's watches to sync")
    capacity, pods = provider._capacity, provider._pods
    assert capacity is not None and pods is not None
    node = _launch(provider, "k8s-namespace", "0000000001")
    namespace = node.external_id
    admin = _client_for(kubeconfig)
    job = _client_for(kubeconfig, node.connection_port["token"])
    # The labels the namespace carries, and the pod label's name for good measure.
    labels = {key: value for key, value in admin.read_namespace(namespace).metadata.labels.items()
              if key.startswith("nodepool")}
    labels[manifests.NODE_LABEL_LABEL] = "pod-fedora"
    launched: list[Any] = []
    failures: list[BaseException] = []
    created = [0]  # the job's pods so far
    progress = threading.Condition()

    def keep_launching() -> None:
        # One pod node per 50 of the job's pods: requests keep being served meanwhile.
        for index in range(FOREIGN_PODS // 50):
            with progress:
                progress.wait_for(lambda: created[0] >= index * 50)
            try:
                launched.append(_launch(provider, "pod-fedora", f"00000000{index + 10}"))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)
                return

    tracemalloc.start()
    try:
        before = _traced()
        launcher = threading.Thread(target=keep_launching)
        launcher.start()
        try:
            for i in range(FOREIGN_PODS):
                # Also, once, the name the launcher gives its pods.
                name = "pod-fedora" if i == 0 else f"fake-{i:03d}"
                job.create_namespaced_pod(namespace, _foreign_pod(name, labels))
                with progress:
                    created[0] += 1
                    progress.notify_all()
        finally:
            with progress:
                created[0] = FOREIGN_PODS
                progress.notify_all()
            launcher.join(120)
        assert not failures, failures
        assert len(launched) == FOREIGN_PODS // 50 and not launcher.is_alive()
        # One more ordinary node after the flood, and the job's pods all bound: once the
        # capacity watch has that pod Running, both pod watches have applied the flood.
        last = _launch(provider, "pod-fedora", "0000000099")
        key = (last.external_id, last.connection_port["pod"])
        wait_for(lambda: all(p.status.phase == "Running" for p in
                             admin.list_namespaced_pod(namespace).items), 60,
                 message="the job's pods running")
        marked = admin.patch_namespaced_pod(key[1], key[0],
                                            {"metadata": {"labels": {"mark": "1"}}})
        version = marked.metadata.resource_version
        changes.until(lambda: all((w.get(*key) or {}).get("metadata", {}).get(
            "resourceVersion") == version for w in (pods, capacity.watches["all-pods"])), 60,
            message="both pod watches to apply the last change")
        grown = _traced() - before
    finally:
        tracemalloc.stop()
        changes.close()
    assert grown < 8 * MiB, f"the launcher grew by {grown / MiB:.1f} MiB"
    ours = {(n.external_id, n.connection_port["pod"]) for n in launched + [last]}
    cached = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods.objects()}
    assert cached <= ours and not any(ns == namespace for ns, _ in cached)
    # Capacity: the job's pods hold node resources (3 cpu) but are not the launcher's own;
    # the launcher's pods (1 cpu each) are. Free = 16 - 3 - ours; the limit adds ours back.
    assert capacity._ours_bound().get("cores") == pytest.approx(len(ours))
    assert provider.cloud_limits(POD)["cores"] == pytest.approx(16 - FOREIGN_PODS * 0.01)
    # Nothing of a job's pod is kept whole, not even by the capacity watch.
    foreign = capacity.watches["all-pods"].get(namespace, "fake-001")
    assert foreign is not None and "annotations" not in foreign["metadata"]


def test_after_a_restart_existing_nodes_are_still_recognised(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    config = make_provider(NS, POD, capacity_nodes=True)
    first = make_k8s_provider(sim, config=config)
    ns_node = _launch(first, "k8s-namespace", "0000000001")
    pod_node = _launch(first, "pod-fedora", "0000000002")
    first.stop()
    second = make_k8s_provider(sim, config=config)
    watch = second._namespace_watch()
    assert {ns_node.external_id, pod_node.external_id} <= {
        manifests.label_value(o["metadata"]["name"]) for o in watch.objects()}
    assert second._capacity is not None
    changes.until(lambda: second._capacity._ours_bound().get("cores") == 1, 15,  # type: ignore
                  message="capacity to count the pod node's pod as ours")
    assert second.cloud_limits(POD)["cores"] == pytest.approx(16)


def test_a_namespace_not_named_for_its_node_is_not_kept(
        sim: Simulator, provider: KubernetesProvider, tmp_path: Any, changes: Signal) -> None:
    admin = _api(sim, tmp_path, "admin")
    labels = {manifests.PROVIDER_LABEL: provider.name,
              manifests.INSTALLATION_LABEL: provider.installation_id,
              manifests.NODE_ID_LABEL: "0000000005"}
    admin.create_namespace({"metadata": {"name": "main-0000000006", "labels": labels}})
    admin.create_namespace({"metadata": {"name": "scratch", "labels": labels}})
    node = _launch(provider, "k8s-namespace", "0000000007")
    watch = provider._namespace_watch()
    changes.until(lambda: watch.get("", node.external_id), message="our namespace in the watch")
    assert watch.get("", "main-0000000006") is None and watch.get("", "scratch") is None
    assert watch.dropped >= 2


def test_deleting_a_labelled_namespace_the_watch_does_not_keep_is_confirmed(
        make_sim: Any, make_k8s_provider: ProviderFactory, tmp_path: Any) -> None:
    sim = make_sim(namespace_delete_delay=1.5)
    provider = make_k8s_provider(sim, NS)
    labels = {manifests.PROVIDER_LABEL: provider.name,
              manifests.INSTALLATION_LABEL: provider.installation_id,
              manifests.NODE_ID_LABEL: "0000000005"}
    _api(sim, tmp_path, "admin").create_namespace(
        {"metadata": {"name": "scratch", "labels": labels}})
    # Ours by its labels, so it may be deleted; not kept by the watch (not a node's name),
    # so its end is confirmed by a watch on that name, not waited for on the shared one.
    provider.delete_and_confirm("scratch", node_id="0000000005")
    assert sim.get("namespaces", "scratch") is None


def test_capacity_keeps_only_pods_that_hold_a_node(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Any, changes: Signal) -> None:
    provider = make_k8s_provider(sim, POD, capacity_nodes=True)
    assert provider._capacity is not None
    pods = provider._capacity.watches["all-pods"]
    admin = _api(sim, tmp_path, "admin")
    admin.create_namespace({"metadata": {"name": "others"}})
    container = {"name": "c", "image": "busybox"}
    # Never schedulable: holds nothing, however many of them anyone creates.
    admin.create_namespaced_pod("others", {"metadata": {"name": "pending"}, "spec": {
        "nodeSelector": {"no-such": "node"}, "containers": [container]}})
    admin.create_namespaced_pod("others", {"metadata": {"name": "bound"},
                                           "spec": {"containers": [container]}})
    changes.until(lambda: (pods.get("others", "bound") or {}).get("status", {}).get("phase")
                  == "Running", message="the bound pod running in the capacity watch")
    assert pods.get("others", "pending") is None and pods.dropped >= 1
    sim.patch("pods", "bound", {"status": {"phase": "Succeeded"}}, "others")
    changes.until(lambda: pods.get("others", "bound") is None,
                  message="the finished pod to leave the capacity watch")


# -- ObjectWatch mechanics, against the simulator ------------------------------------------------

def _pod_watch(provider: KubernetesProvider, **kw: Any) -> ObjectWatch:
    client = provider._connected()[0]
    return ObjectWatch("pods", client, client.core.list_pod_for_all_namespaces, "app=x",
                       SYSTEM_CLOCK, watch_timeout=5, slim=slim.pod, **kw)


def _make_pods(sim: Simulator, tmp_path: Any, count: int, containers: int = 1) -> None:
    admin = _api(sim, tmp_path, "admin")
    admin.create_namespace({"metadata": {"name": "paged"}})
    for i in range(count):
        admin.create_namespaced_pod("paged", {
            "metadata": {"name": f"p{i:02d}", "labels": {"app": "x"}},
            "spec": {"containers": [
                {"name": f"c{j}", "image": "busybox",
                 "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}
                for j in range(containers)]}})


def test_relists_are_paged(sim: Simulator, provider: KubernetesProvider,
                           tmp_path: Any, changes: Signal) -> None:
    _make_pods(sim, tmp_path, 7)
    sim.reset_counters()
    watch = _pod_watch(provider, page_size=3)
    changes.listen(watch)
    watch.start()
    try:
        changes.until(lambda: watch.synced, message="the paged list")
        assert len(watch.objects()) == 7
        assert sim.counters.get("list pods") == 3  # 3 + 3 + 1
    finally:
        watch.stop()


def test_an_expired_continue_lists_again_from_the_start(
        sim: Simulator, provider: KubernetesProvider, tmp_path: Any, changes: Signal) -> None:
    _make_pods(sim, tmp_path, 5)
    compacted = threading.Event()

    def compact_after_first_page(body: dict[str, Any]) -> dict[str, Any]:
        # Between the first and the second page a change, then its history is compacted
        # away: the first page's snapshot is gone.
        sim.patch("namespaces", "paged", {"metadata": {"labels": {"touched": "yes"}}})
        sim.compact()
        compacted.set()
        return body

    sim.rewrite_next("list", "pods", compact_after_first_page)
    sim.reset_counters()
    watch = _pod_watch(provider, page_size=2)
    changes.listen(watch)
    watch.start()
    try:
        changes.until(lambda: watch.synced, message="the list after 410 Expired")
        assert compacted.is_set()
        names = sorted(o["metadata"]["name"] for o in watch.objects())
        assert names == ["p00", "p01", "p02", "p03", "p04"]
        # The first list: one page, then 410 Expired; then all three pages again.
        assert sim.counters.get("list pods") == 5, sim.counters
        assert watch.lists == 1
    finally:
        watch.stop()


def test_an_oversized_copy_is_not_kept_and_logged_once(
        sim: Simulator, provider: KubernetesProvider, tmp_path: Any,
        caplog: pytest.LogCaptureFixture, changes: Signal) -> None:
    # 400 containers' requests survive slimming: about 20 KB a pod.
    _make_pods(sim, tmp_path, 3, containers=400)
    caplog.set_level(logging.DEBUG, "nodepool_k8s.driver.kubernetes.waiter")
    watch = _pod_watch(provider, max_object_bytes=16 * 1024)
    changes.listen(watch)
    watch.start()
    try:
        changes.until(lambda: watch.synced, message="the list")
        assert watch.objects() == [] and watch.refused >= 3
    finally:
        watch.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "even slimmed" in warnings[0].getMessage()


def test_a_full_cache_keeps_no_new_names(sim: Simulator, provider: KubernetesProvider,
                                         tmp_path: Any, changes: Signal) -> None:
    _make_pods(sim, tmp_path, 5)
    watch = _pod_watch(provider, max_objects=3)
    changes.listen(watch)
    watch.start()
    try:
        changes.until(lambda: watch.synced, message="the list")
        assert len(watch.objects()) == 3 and watch.refused == 2
    finally:
        watch.stop()


# -- the predicates, the slim copies and dropping on arrival (no cluster) ------------------------

def _obj(name: str, namespace: str = "", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {
        manifests.PROVIDER_LABEL: "p", manifests.INSTALLATION_LABEL: "i", **labels}}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def test_created_namespace_needs_our_labels_and_a_name_made_for_its_node() -> None:
    def problem(obj: dict[str, Any]) -> str | None:
        return manifests.created_namespace_problem(obj, "p", "i")

    node = {manifests.NODE_ID_LABEL: "0000000042"}
    for name in ("main-0000000042", "main-0000000042-3", "main-0000000042-2-rab12cd"):
        assert problem(_obj(name, **node)) is None, name
    assert problem(_obj("main-0000000043", **node)) is not None  # another node's name
    assert problem(_obj("kube-system", **node)) is not None
    assert problem(_obj("main-0000000042")) is not None  # no node-id label
    assert manifests.created_namespace_problem(_obj("main-0000000042", **node), "p",
                                               "other") is not None


def test_created_pod_is_the_named_pod_of_a_pod_node() -> None:
    labels = {manifests.NODE_ID_LABEL: "0000000042"}

    def problem(obj: dict[str, Any], expected: str | None = "pod-fedora") -> str | None:
        return manifests.created_pod_problem(obj, "p", "i", expected)

    assert problem(_obj("pod-fedora", "main-0000000042", **labels)) is None
    # A namespace the launcher made no pod in (a namespace node's): nothing is ours there.
    assert problem(_obj("pod-fedora", "main-0000000042", **labels), None) is not None
    assert problem(_obj("other", "main-0000000042", **labels)) is not None
    assert problem(_obj("pod-fedora", "main-0000000043", **labels)) is not None
    assert problem(_obj("pod-fedora", "main-0000000042")) is not None


def test_slim_pod_keeps_what_readiness_and_capacity_read() -> None:
    big = "m" * 5000
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "7",
                        "deletionTimestamp": "2026-01-01T00:00:00Z",
                        "labels": {manifests.NODE_ID_LABEL: "0000000001", "team": "x"},
                        "annotations": {"a": ANNOTATION}, "managedFields": [{"x": 1}]},
           "spec": {"nodeName": "n1", "volumes": [{"name": "v"}],
                    "containers": [{"name": "c", "image": "i", "env": [{"name": "E"}],
                                    "resources": {"requests": {"cpu": "1", "memory": 5}}}]},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": big}],
               "containerStatuses": [{"name": "c", "image": "i", "state": {
                   "waiting": {"reason": "ErrImagePull", "message": big}}}]}}
    copy = slim.pod(pod)
    assert copy["metadata"] == {"name": "p", "namespace": "n", "uid": "u",
                                "resourceVersion": "7",
                                "deletionTimestamp": "2026-01-01T00:00:00Z",
                                "labels": {manifests.NODE_ID_LABEL: "0000000001"}}
    assert copy["spec"] == {"nodeName": "n1", "containers": [
        {"resources": {"requests": {"cpu": "1", "memory": 5}}}]}
    assert len(copy["status"]["conditions"][0]["message"]) == slim.TEXT_CHARS
    assert slim.encoded_size(copy) < 4096
    with pytest.raises(LaunchError) as info:
        PodCheck("n/p", SYSTEM_CLOCK)(copy)
    assert info.value.reason == "ErrImagePull"


def test_an_object_that_stops_being_kept_leaves_the_cache() -> None:
    watch = ObjectWatch("pods", None, lambda **kw: None, "x=y",  # type: ignore[arg-type]
                        ManualClock(), slim=slim.pod, tombstones=4,
                        keep=lambda o: o["metadata"].get("labels", {}).get(
                            manifests.NODE_ID_LABEL) == "0000000001")
    mine = _obj("a", "ns", **{manifests.NODE_ID_LABEL: "0000000001"})
    other = _obj("b", "ns", **{manifests.NODE_ID_LABEL: "0000000002"})
    watch._apply({"type": "ADDED", "object": mine}, "1")
    watch._apply({"type": "ADDED", "object": other}, "2")
    assert watch.get("ns", "a") is not None and watch.get("ns", "b") is None
    # A deletion of what was never kept leaves no trace (no tombstone to crowd out ours).
    watch._apply({"type": "DELETED", "object": other}, "3")
    assert watch.tombstone("ns", "b") is None and watch.dropped == 1
    watch._apply({"type": "MODIFIED", "object": _obj("a", "ns")}, "4")
    assert watch.get("ns", "a") is None and watch.tombstone("ns", "a") == ("", False)
