"""Injected cluster faults, end to end through the launcher, and the outcome of each.

Aspects:
- API errors (one-shot 500/503/429 on creates; a random 30 % of 500/429 on every call) are
  retried by the driver and every build succeeds; attempt 1 survives one-shot errors;
- ErrImagePull and ImagePullBackOff fail the attempt at once with that reason although
  `boot-timeout` is 600 s; after `launch-retries` attempts, each in a fresh namespace, the
  request of the single pool is `failed`;
- a pod Unschedulable longer than the driver's grace fails the same way; one that becomes
  schedulable within the grace (an autoscaler adding a node) is used;
- a quota refusal (403 "exceeded quota") aborts the node, pauses the pool and retries; the
  request stays `pending` and is fulfilled once the quota is there, never declined;
- a namespace deletion that hangs keeps the node `deleting` (retried, not forgotten) until
  the namespace finally goes, then the node is removed;
- a burst of releases has every namespace deleted at once, however few deleter threads;
- after each of these nothing is left in the cluster and no node in ZooKeeper.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import events as zk_events
from tests.e2e.util import (KubeEventLog, NamespaceLog, admin_api, leftovers, our_namespaces,
                            provider_factory, wait_cluster_empty)
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory, make_config

CONFIG = """
labels:
  - name: ns
  - name: pod
  - name: broken-image
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 3
    boot-timeout: 600
    api-retries: 5
    api-backoff: [0.01, 0.02, 0.05]
    api-timeout: 10
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: ns
            type: namespace
          - name: pod
            type: pod
            image: docker.io/fedora:40
          - name: broken-image
            type: pod
            image: registry.invalid/ci/missing:1
"""

BOOT_TIMEOUT = 600.0


def failed_attempts(launcher: Launcher) -> list[tuple[int, str]]:
    """(attempt, reason) of every failed launch attempt, as recorded in the event log."""
    launcher.engine.events.flush()  # failed attempts are batched until the node's outcome
    return [(int(e["attempt"]), str(e["reason"])) for e in zk_events.read_events(launcher.zk)
            if e["kind"] == zk_events.ATTEMPT_FAILED]


def assert_failure_recorded(launcher: Launcher, kube_events: KubeEventLog, kind: str,
                            reasons: set[str], condition: str) -> dict[str, Any]:
    """The failure is everywhere it should be: the node's False condition (copied into
    the event log with the record's conditions), the reason counter, a Kubernetes Event in
    the node's namespace and the event log entry. Returns the event log entry."""
    entries = wait_for(lambda: [e for e in zk_events.read_events(launcher.zk)
                                if e["kind"] == kind], message=f"a {kind} event")
    entry = entries[-1]
    assert entry["reason"] in reasons, entry
    false = [c for c in entry["conditions"] if c["status"] == "False"]
    assert [(c["type"], c["reason"]) for c in false] == [(condition, entry["reason"])], entry
    assert f"nodepool.launch.provider.k8s.reason.{entry['reason']}" in incr_keys(launcher)
    counters = launcher.engine.stats.counters()
    assert counters[("nodepool_launch_errors_total",
                     (("provider", "k8s"), ("reason", entry["reason"])))] >= 1
    failed = wait_for(lambda: [e for e in kube_events.events("LaunchFailed")
                               if entry["reason"] in (e["message"] or "")],
                      message="a LaunchFailed event in the namespace")
    assert failed[0]["component"] == "nodepool-launcher" and failed[0]["type"] == "Warning"
    assert failed[0]["namespace"].startswith("main-")
    return entry


def incr_keys(launcher: Launcher) -> list[str]:
    return launcher.engine.stats.backend.keys("incr")  # type: ignore[attr-defined,no-any-return]


def pool_id(launcher: Launcher) -> str:
    return next(w.id for w in launcher.pool_workers.values())


def assert_clean(k8s_sim: Simulator, kazoo_client: KazooClient) -> None:
    """No node left in ZooKeeper, nothing left in the cluster."""
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="every node removed from ZooKeeper")
    wait_cluster_empty(k8s_sim)


def attempt_names(namespace_log: NamespaceLog, attempts: int) -> list[str]:
    """The namespaces of one node's attempts: `main-<id>`, then `main-<id>-<n>`."""
    names = wait_for(lambda: len(namespace_log.names("main-")) >= attempts
                     and namespace_log.names("main-"), message=f"{attempts} namespaces")
    assert len(names) == attempts, names
    node_id = names[0].split("-")[1]
    expected = [f"main-{node_id}"] + [f"main-{node_id}-{n}" for n in range(2, attempts + 1)]
    assert names == expected
    return names


# -- API errors --------------------------------------------------------------------------------

def test_one_shot_api_errors_are_retried(launchers: LauncherFactory, zuul: ZuulClient,
                                         k8s_sim: Simulator,
                                         kazoo_client: KazooClient) -> None:
    launcher = launchers(CONFIG)
    k8s_sim.set_faults(retry_after=0)
    k8s_sim.fail_next("create", "namespaces", count=2, code=500)
    k8s_sim.fail_next("create", "serviceaccounts", code=503)
    k8s_sim.fail_next("create", "serviceaccounts/token", code=429)
    k8s_sim.fail_next("create", "roles", code=500)
    k8s_sim.fail_next("create", "rolebindings", code=500)
    k8s_sim.fail_next("create", "pods", count=2, code=500)
    request_id = zuul.submit(["pod"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "fulfilled", body
    # Retried inside each call: the first attempt made it.
    node_id = body["nodes"][0]
    assert zuul.get_node(node_id)["external_id"] == f"main-{node_id}"  # type: ignore[index]
    assert failed_attempts(launcher) == []
    assert k8s_sim.counters["create namespaces"] == 3  # 2 refused + 1 created
    assert k8s_sim.counters["create pods"] == 3  # retried inside the call
    # A successful launch: every condition True, in order, with ordered times.
    node = zuul.get_node(node_id)
    assert node is not None
    conditions = node["conditions"]
    assert [(c["type"], c["status"]) for c in conditions] == [
        ("Launched", "True"), ("Registered", "True"), ("Initialized", "True"),
        ("Ready", "True")]
    times = [c["last_transition_time"] for c in conditions]
    assert times == sorted(times) and node["host_id"]
    assert node["host_id"] in conditions[2]["message"]
    assert incr_keys(launcher).count("nodepool.launch.provider.k8s.ready") == 1
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    assert_clean(k8s_sim, kazoo_client)


def test_random_api_errors(launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
                           kazoo_client: KazooClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    launcher = launchers(CONFIG)
    k8s_sim.set_faults(error_rate=0.3, error_codes=(500, 429), retry_after=0, seed=11)
    for _ in range(3):
        zuul.run_build(["ns", "pod"], timeout=120)
    # Deletion runs under the same errors.
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 60,
             message="every used node removed despite API errors")
    k8s_sim.clear_faults()
    assert incr_keys(launcher).count("nodepool.launch.provider.k8s.ready") >= 6
    assert any("will retry" in r.getMessage() for r in caplog.records), "no error injected?"
    assert leftovers(k8s_sim) == {}


# -- pod failures ------------------------------------------------------------------------------

def test_image_pull_error_fails_fast(launchers: LauncherFactory, zuul: ZuulClient,
                                     k8s_sim: Simulator, kazoo_client: KazooClient,
                                     namespace_log: NamespaceLog,
                                     kube_events: KubeEventLog) -> None:
    k8s_sim.set_faults(image_pull_fail=("registry.invalid/*",))
    launcher = launchers(CONFIG)
    request_id = zuul.submit(["broken-image"])
    # Failing fast: all three attempts end well inside one boot timeout.
    body = zuul.wait(request_id, BOOT_TIMEOUT / 20)
    assert body is not None and body["state"] == "failed", body
    assert body["nodes"] == [] and body["declined_by"] == [pool_id(launcher)]
    attempts = failed_attempts(launcher)
    assert [a for a, _ in attempts] == [1, 2, 3]
    assert {r for _, r in attempts} <= {"ErrImagePull", "ImagePullBackOff"}, attempts
    attempt_names(namespace_log, 3)  # a fresh namespace per attempt
    assert incr_keys(launcher).count("nodepool.launch.provider.k8s.error.nodepool") == 1
    entry = assert_failure_recorded(launcher, kube_events, zk_events.LAUNCH_FAILED,
                                    {"ErrImagePull", "ImagePullBackOff"}, "Initialized")
    assert "registry.invalid/ci/missing:1" in entry["message"]  # the image's name
    reasons = body["declined_reasons"]
    assert reasons[pool_id(launcher)]["reason"] == entry["reason"]
    zuul.cancel(request_id)  # as Zuul's scheduler does with a failed request
    assert_clean(k8s_sim, kazoo_client)


def test_image_pull_backoff_fails_fast(launchers: LauncherFactory, zuul: ZuulClient,
                                       k8s_sim: Simulator, kazoo_client: KazooClient,
                                       namespace_log: NamespaceLog) -> None:
    """A pod whose container waits in ImagePullBackOff (the kubelet's state after a few
    failed pulls) ends the attempt as soon as it is seen."""
    k8s_sim.config.start_delay = 3600.0  # pods are scheduled but never start by themselves
    launcher = launchers(CONFIG)
    request_id = zuul.submit(["pod"])
    for attempt in range(3):
        namespace = wait_for(lambda: (namespace_log.names("main-")[attempt:] or [None])[0],
                             message=f"attempt {attempt + 1}'s namespace")
        # Patch only once the scheduler has bound it (binding writes containerStatuses).
        wait_for(lambda: ((k8s_sim.get("pods", "pod", namespace) or {}).get("status") or {})
                 .get("containerStatuses"), message="the scheduled pod")
        k8s_sim.patch("pods", "pod", {"status": {"containerStatuses": [{
            "name": "pod", "image": "docker.io/fedora:40", "imageID": "", "ready": False,
            "restartCount": 0, "started": False,
            "state": {"waiting": {"reason": "ImagePullBackOff",
                                  "message": 'Back-off pulling image "docker.io/fedora:40"'}},
        }]}}, namespace=namespace)
    # Fast failure is each attempt failing with the container's reason, not BootTimeout
    # (the pods never start: waiting them out would be three attempts of 600 s, which
    # the wait's deadline also keeps from hanging the run).
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert failed_attempts(launcher) == [(1, "ImagePullBackOff"), (2, "ImagePullBackOff"),
                                         (3, "ImagePullBackOff")]
    attempt_names(namespace_log, 3)
    zuul.cancel(request_id)
    assert_clean(k8s_sim, kazoo_client)
    assert incr_keys(launcher).count("nodepool.launch.provider.k8s.error.nodepool") == 1


def test_unschedulable_past_grace_fails(launchers: LauncherFactory, zuul: ZuulClient,
                                        k8s_sim: Simulator, kazoo_client: KazooClient,
                                        namespace_log: NamespaceLog,
                                        kube_events: KubeEventLog) -> None:
    """A short grace through the driver's settings (the `unschedulable-grace` provider key
    sets the same value from the configuration)."""
    k8s_sim.set_faults(unschedulable=True)
    launcher = launchers(CONFIG, provider_factory=provider_factory(unschedulable_grace=0.5))
    request_id = zuul.submit(["pod"])
    body = zuul.wait(request_id, BOOT_TIMEOUT / 20)
    assert body is not None and body["state"] == "failed", body
    assert body["declined_by"] == [pool_id(launcher)]
    assert failed_attempts(launcher) == [(1, "Unschedulable"), (2, "Unschedulable"),
                                         (3, "Unschedulable")]
    entry = assert_failure_recorded(launcher, kube_events, zk_events.LAUNCH_FAILED,
                                    {"Unschedulable"}, "Initialized")
    assert "Insufficient" in entry["message"] or "node" in entry["message"], entry
    # The attempt gave up on the configured grace (that it waits the grace out before
    # giving up is checked on a clock the test moves, in tests/kubernetes/test_failures.py).
    assert "unschedulable for 0.5s" in entry["message"], entry
    assert body["declined_reasons"][pool_id(launcher)]["reason"] == "Unschedulable"
    attempt_names(namespace_log, 3)
    zuul.cancel(request_id)
    assert_clean(k8s_sim, kazoo_client)


def test_unschedulable_within_grace_is_used(launchers: LauncherFactory, zuul: ZuulClient,
                                            k8s_sim: Simulator,
                                            kazoo_client: KazooClient) -> None:
    """The daemon's default grace (30 s) lets a pod wait for capacity (an autoscaler)."""
    k8s_sim.set_faults(unschedulable=True)
    launcher = launchers(CONFIG)  # the production provider factory and driver settings
    request_id = zuul.submit(["pod"])

    def unschedulable_pod() -> bool:
        pods = k8s_sim.list("pods")
        return bool(pods) and any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (pods[0].get("status") or {}).get("conditions") or [])

    wait_for(unschedulable_pod, message="an unschedulable pod")
    k8s_sim.set_faults(unschedulable=False)  # capacity arrives
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    node = zuul.get_node(body["nodes"][0])
    assert node is not None and node["external_id"] == f"main-{body['nodes'][0]}"
    assert failed_attempts(launcher) == []
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    assert_clean(k8s_sim, kazoo_client)


# -- quota ---------------------------------------------------------------------------------------

def pool_component(kazoo_client: KazooClient) -> dict[str, Any]:
    import json

    [child] = kazoo_client.get_children(paths.POOL_COMPONENTS)
    data, _ = kazoo_client.get(f"{paths.POOL_COMPONENTS}/{child}")
    return json.loads(data)  # type: ignore[no-any-return]


def test_quota_refusal_pauses_until_capacity(launchers: LauncherFactory, zuul: ZuulClient,
                                             k8s_sim: Simulator, kazoo_client: KazooClient,
                                             namespace_log: NamespaceLog,
                                             kube_events: KubeEventLog) -> None:
    """Documented engine behaviour (doc/launcher.md): the cloud refusing for quota marks the
    node `aborted` and the request waits, paused, retrying every `quota_retry`; it is not a
    failed launch and the request is never declined."""
    k8s_sim.set_faults(quota_exceeded=True)
    launcher = launchers(CONFIG, settings=TEST_SETTINGS.replace(quota_retry=1.0))
    request_id = zuul.submit(["pod"])
    aborted: set[str] = set()

    def refusals() -> int:
        for node_id in kazoo_client.get_children(paths.NODES):
            node = zuul.get_node(node_id)
            if node and node["state"] == "aborted":
                aborted.add(node_id)
        return incr_keys(launcher).count("nodepool.launch.provider.k8s.error.quota")

    wait_for(lambda: refusals() >= 2, 30, message="two quota refusals")
    assert_failure_recorded(launcher, kube_events, zk_events.LAUNCH_ABORTED,
                            {"QuotaExceeded"}, "Registered")
    wait_for(lambda: pool_component(kazoo_client)["paused"], 10, message="a paused pool")
    request = zuul.get_request(request_id)
    assert request is not None and request["state"] == "pending"
    assert request["declined_by"] == []
    names = wait_for(lambda: len(namespace_log.names("main-")) >= 2
                     and namespace_log.names("main-"), message="the refused namespaces")
    assert len(set(names)) == len(names)  # each refused launch had its own namespace

    k8s_sim.set_faults(quota_exceeded=False)  # capacity is back
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    assert body["declined_by"] == []
    wait_for(lambda: not pool_component(kazoo_client)["paused"], 10, message="unpaused")
    keys = incr_keys(launcher)
    assert "nodepool.launch.provider.k8s.error.nodepool" not in keys
    assert keys.count("nodepool.launch.provider.k8s.ready") == 1
    # Refused attempts left nothing: only the fulfilled node's namespace exists.
    node_id = body["nodes"][0]
    assert node_id not in aborted
    wait_for(lambda: our_namespaces(k8s_sim) == [f"main-{node_id}"], 30,
             message="the refused attempts' namespaces gone")
    wait_for(lambda: kazoo_client.get_children(paths.NODES) == [node_id], 30,
             message="aborted nodes removed")
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    assert_clean(k8s_sim, kazoo_client)


# -- deletion ------------------------------------------------------------------------------------

def test_hanging_namespace_deletion(launchers: LauncherFactory, zuul: ZuulClient,
                                    k8s_sim: Simulator, kazoo_client: KazooClient) -> None:
    """The deleter gives the namespace `delete-timeout` (1 s here) to go, then counts a
    failed try; the engine keeps the node `deleting` (Deleting False, DeleteFailed, with
    the count of tries on the record) and retries."""
    launchers(CONFIG.replace("boot-timeout: 600", "boot-timeout: 600\n    delete-timeout: 1"),
              provider_factory=provider_factory(delete_timeout=1.0),
              settings=TEST_SETTINGS.replace(delete_retry=0.2, delete_retry_max=1.0))
    request_id = zuul.submit(["pod"])
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled"
    node_id = body["nodes"][0]
    namespace = f"main-{node_id}"
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    k8s_sim.set_faults(namespace_delete_hang=True)
    zuul.release(nodeset)

    def failed_deletions() -> int:
        node = zuul.get_node(node_id) or {}
        return int(node.get("delete_failures") or 0)

    wait_for(lambda: failed_deletions() >= 2, 30, message="two timed-out deletions")
    node = zuul.get_node(node_id)
    assert node is not None and node["state"] == "deleting", node
    deleting = [c for c in node["conditions"] if c["type"] == "Deleting"]
    assert [(c["status"], c["reason"]) for c in deleting] == [("False", "DeleteFailed")]
    ns = k8s_sim.get("namespaces", namespace)
    assert ns is not None and ns["status"]["phase"] == "Terminating"
    assert ns["metadata"]["labels"][manifests.NODE_ID_LABEL] == node_id

    k8s_sim.set_faults(namespace_delete_hang=False)
    assert_clean(k8s_sim, kazoo_client)


def test_a_release_burst_is_not_bound_by_deleter_threads(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    """A gate reset releases many nodes at once while the cluster takes its time to finalize
    namespaces: every namespace is asked to go at once however few deleter threads there
    are (no thread waits for a Terminating namespace; each node keeps its lock), and each
    node goes as soon as its namespace is gone. Before, each deletion held a deleter thread
    until its namespace was gone: two threads, two namespaces at a time."""
    launcher = launchers(CONFIG, settings=TEST_SETTINGS.replace(delete_workers=2))
    nodesets = []
    for request_id in [zuul.submit(["ns"]) for _ in range(6)]:
        body = zuul.wait(request_id, 30)
        assert body is not None and body["state"] == "fulfilled", body
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        nodesets.append(nodeset)
    node_ids = [node.id for nodeset in nodesets for node in nodeset.nodes]
    k8s_sim.set_faults(namespace_delete_hang=True)
    for nodeset in nodesets:
        zuul.release(nodeset)

    def terminating() -> list[str]:
        return [name for name in our_namespaces(k8s_sim)
                if (k8s_sim.get("namespaces", name) or {}).get(
                    "status", {}).get("phase") == "Terminating"]

    wait_for(lambda: len(terminating()) == 6, 20, message="all six namespaces asked to go")
    wait_for(lambda: launcher.deleter.parked() == 6, 10, message="six deletions parked")
    for node_id in node_ids:
        node = zuul.get_node(node_id)
        assert node is not None and node["state"] == "deleting", node
        assert kazoo_client.get_children(paths.node_lock_path(node_id)), \
            "a parked node stays locked"
    k8s_sim.set_faults(namespace_delete_hang=False)
    assert_clean(k8s_sim, kazoo_client)
    wait_for(lambda: launcher.deleter.deleted == 6, message="the deleter's count")
    assert launcher.deleter.parked() == 0
    assert not [k for k in incr_keys(launcher) if "error" in k or "leaked" in k]


def test_parked_deletions_survive_a_provider_replaced_by_a_reload(
        zk: ZkConnection, launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    """A configuration reload that changes the provider replaces it, and the old one's
    namespace watch stops: the deletions it had parked are handed to the new provider at
    once (not after `delete-timeout`, 300 s), and finish when their namespaces go."""
    launcher = launchers(CONFIG)
    nodesets = []
    for request_id in [zuul.submit(["ns"]) for _ in range(2)]:
        assert (zuul.wait(request_id, 30) or {}).get("state") == "fulfilled"
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        nodesets.append(nodeset)
    k8s_sim.set_faults(namespace_delete_hang=True)
    for nodeset in nodesets:
        zuul.release(nodeset)
    wait_for(lambda: launcher.deleter.parked() == 2, 20, message="two deletions parked")
    old = launcher.engine.providers["k8s"]
    launcher.reload(make_config(zk, CONFIG.replace("launch-retries: 3", "launch-retries: 4")))
    assert launcher.engine.providers["k8s"] is not old
    wait_for(lambda: launcher.deleter.parked() == 2 and all(
        launcher.deleter.busy(node.id) for nodeset in nodesets for node in nodeset.nodes),
        20, message="the deletions parked again with the new provider")
    k8s_sim.set_faults(namespace_delete_hang=False)
    assert_clean(k8s_sim, kazoo_client)
    assert not [k for k in incr_keys(launcher) if "error" in k or "leaked" in k]


def test_a_stuck_deletion_keeps_one_notice_per_namespace(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient) -> None:
    """A namespace that stays Terminating past `delete-timeout` (a stuck finalizer) makes
    the deleter ask again and again, each time with a fresh `wake`: the namespace watch
    holds one notice for it, not one more per round (they piled up for as long as the
    namespace stayed, then all fired at once)."""
    launcher = launchers(CONFIG.replace("boot-timeout: 600",
                                        "boot-timeout: 600\n    delete-timeout: 0.5"))
    request_id = zuul.submit(["ns"])
    assert (zuul.wait(request_id, 30) or {}).get("state") == "fulfilled"
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    [node] = nodeset.nodes
    k8s_sim.set_faults(namespace_delete_hang=True)
    zuul.release(nodeset)
    wait_for(lambda: int((zuul.get_node(node.id) or {}).get("delete_failures", 0)) >= 3, 30,
             message="three rounds of a deletion past its timeout")
    watch = launcher.engine.providers["k8s"]._namespaces  # type: ignore[attr-defined]
    with watch._lock:
        notices = {key: len(waiting) for key, waiting in watch._waiters.items()}
    external_id = (zuul.get_node(node.id) or {}).get("external_id")
    assert notices == {("", external_id): 1}
    k8s_sim.set_faults(namespace_delete_hang=False)
    assert_clean(k8s_sim, kazoo_client)
    with watch._lock:
        assert not watch._waiters


def test_retry_gets_a_fresh_namespace_while_the_old_one_terminates(
        launchers: LauncherFactory, zuul: ZuulClient, k8s_sim: Simulator,
        kazoo_client: KazooClient, namespace_log: NamespaceLog) -> None:
    """Attempt 1's pod fails and its namespace hangs in Terminating; attempt 2 must not
    reuse that name (Nodepool did, and got 409 until the old one was gone)."""
    k8s_sim.config.start_delay = 3600.0
    k8s_sim.set_faults(namespace_delete_hang=True)
    launcher = launchers(CONFIG, provider_factory=provider_factory(cleanup_timeout=0.5))
    request_id = zuul.submit(["pod"])
    first = wait_for(lambda: (namespace_log.names("main-") or [None])[0],
                     message="attempt 1's namespace")
    wait_for(lambda: k8s_sim.get("pods", "pod", first), message="attempt 1's pod")
    k8s_sim.config.start_delay = 0.0
    k8s_sim.patch("pods", "pod", {"status": {"phase": "Failed", "reason": "Evicted"}},
                  namespace=first)
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled", body
    node_id = body["nodes"][0]
    assert first == f"main-{node_id}"
    node = zuul.get_node(node_id)
    assert node is not None and node["external_id"] == f"main-{node_id}-2"
    assert node["connection_port"]["namespace"] == f"main-{node_id}-2"
    assert failed_attempts(launcher) == [(1, "PodFailed")]
    assert k8s_sim.get("namespaces", first)["status"]["phase"] == "Terminating"  # type: ignore
    wait_for(lambda: namespace_log.names("main-") == [first, f"main-{node_id}-2"],
             message="exactly two namespaces")

    k8s_sim.set_faults(namespace_delete_hang=False)
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    assert_clean(k8s_sim, kazoo_client)


# -- failure reasons: boot timeout, API errors past retries ------------------------------------

SHORT = CONFIG.replace("launch-retries: 3", "launch-retries: 1").replace(
    "boot-timeout: 600", "boot-timeout: 1").replace("api-retries: 5", "api-retries: 1")


def test_boot_timeout_is_recorded(launchers: LauncherFactory, zuul: ZuulClient,
                                  k8s_sim: Simulator, kazoo_client: KazooClient,
                                  kube_events: KubeEventLog) -> None:
    k8s_sim.config.start_delay = 3600.0  # scheduled, never running
    launcher = launchers(SHORT)
    request_id = zuul.submit(["pod"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert failed_attempts(launcher) == [(1, "BootTimeout")]
    assert_failure_recorded(launcher, kube_events, zk_events.LAUNCH_FAILED, {"BootTimeout"},
                            "Initialized")
    assert body["declined_reasons"][pool_id(launcher)]["reason"] == "BootTimeout"
    zuul.cancel(request_id)
    assert_clean(k8s_sim, kazoo_client)


def test_api_errors_past_retries_are_recorded(launchers: LauncherFactory, zuul: ZuulClient,
                                              k8s_sim: Simulator, kazoo_client: KazooClient,
                                              kube_events: KubeEventLog) -> None:
    k8s_sim.set_faults(retry_after=0)
    k8s_sim.fail_next("create", "serviceaccounts", count=2, code=500)  # api-retries 1
    launcher = launchers(SHORT)
    request_id = zuul.submit(["ns"])
    body = zuul.wait(request_id, 60)
    assert body is not None and body["state"] == "failed", body
    assert failed_attempts(launcher) == [(1, "ApiError")]
    assert_failure_recorded(launcher, kube_events, zk_events.LAUNCH_FAILED, {"ApiError"},
                            "Registered")
    assert body["declined_reasons"][pool_id(launcher)]["reason"] == "ApiError"
    zuul.cancel(request_id)
    assert_clean(k8s_sim, kazoo_client)


def test_success_events_in_the_namespace(launchers: LauncherFactory, zuul: ZuulClient,
                                         k8s_sim: Simulator, kazoo_client: KazooClient) -> None:
    """`kubectl describe ns` / `kubectl get events -n NS` tells the job author what the
    launcher did: Launched, Registered and Ready from component nodepool-launcher."""
    launchers(CONFIG)
    request_id = zuul.submit(["pod"])
    body = zuul.wait(request_id, 30)
    assert body is not None and body["state"] == "fulfilled"
    namespace = f"main-{body['nodes'][0]}"
    core = admin_api(k8s_sim)

    def reasons() -> list[str]:
        items = core.list_namespaced_event(namespace).items
        return sorted(e.reason for e in items if e.source.component == "nodepool-launcher")

    wait_for(lambda: reasons() == ["Launched", "Ready", "Registered"], 10,
             message="the launcher's events in the namespace")
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    assert_clean(k8s_sim, kazoo_client)
