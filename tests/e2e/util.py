"""Helpers for the end-to-end tests: what is left in the simulated cluster, a recorder of
every namespace ever created, Zuul's kubeconfig built from a node's connection data, a
provider factory with short driver timeouts, removing a node's znode behind the launcher's
back, and the shared configurations.

The official `kubernetes` client is used here only as a client of the simulator (as Zuul's
executor and an operator would use it); the launcher reaches the simulator on its own.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Self
from urllib.parse import urlsplit

import kubernetes
from kazoo.client import KazooClient
from kazoo.exceptions import NotEmptyError
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver.base import Provider
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider, KubernetesSettings
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for

# Namespaces a fresh simulator has; everything else was made by someone.
SYSTEM_NAMESPACES = frozenset({"default", "kube-node-lease", "kube-public", "kube-system"})
NAMESPACED_KINDS = ("pods", "serviceaccounts", "secrets", "configmaps", "roles",
                    "rolebindings", "resourcequotas", "limitranges", "networkpolicies",
                    "services", "events")


def leftovers(sim: Simulator) -> dict[str, list[str]]:
    """Every object in the cluster that a fresh simulator does not have (empty = clean)."""
    found: dict[str, list[str]] = {}
    namespaces = sorted(n["metadata"]["name"] for n in sim.list("namespaces")
                        if n["metadata"]["name"] not in SYSTEM_NAMESPACES)
    if namespaces:
        found["namespaces"] = namespaces
    for kind in NAMESPACED_KINDS:
        names = sorted(f"{o['metadata'].get('namespace')}/{o['metadata']['name']}"
                       for o in sim.list(kind))
        if names:
            found[kind] = names
    return found


def wait_cluster_empty(sim: Simulator, timeout: float = 30.0, context: str = "") -> None:
    """Wait until `leftovers(sim)` is empty; the failure names what is still there."""
    try:
        wait_for(lambda: leftovers(sim) == {}, timeout, message="an empty cluster")
    except AssertionError:
        raise AssertionError(f"left in the cluster: {leftovers(sim)}\n{context}") from None


def our_namespaces(sim: Simulator, provider: str = "k8s") -> list[str]:
    return sorted(n["metadata"]["name"] for n in sim.list(
        "namespaces", label_selector=f"nodepool_provider_name={provider}"))


def admin_api(sim: Simulator) -> k8s.CoreV1Api:
    assert sim.kubeconfig_path is not None
    api = kubernetes.config.new_client_from_config(config_file=sim.kubeconfig_path,
                                                   context="sim")
    return k8s.CoreV1Api(api)


class _AddedLog:
    """Watches one kind through the official client (from a list's resourceVersion, resumed
    after every error) and keeps `record(obj)` of every object ever ADDED, in order."""

    name = "watch-log"

    def __init__(self, sim: Simulator) -> None:
        self.core = admin_api(sim)
        self.added: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def _lister(self) -> Any:
        """The client's list method itself: the watch reads the type it returns from its
        docstring, to decode the objects of the events."""
        raise NotImplementedError

    def record(self, obj: Any) -> Any:
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        assert self._listed.wait(15), f"{self.name} watch did not start"
        return self

    def _run(self) -> None:
        lister = self._lister()
        version = lister().metadata.resource_version
        self._listed.set()
        while not self._stop.is_set():
            watcher = k8s_watch.Watch()
            try:
                for event in watcher.stream(lister, timeout_seconds=1,
                                            resource_version=version):
                    obj = event["object"]
                    version = obj.metadata.resource_version
                    if event["type"] == "ADDED":
                        with self._lock:
                            self.added.append(self.record(obj))
                    if self._stop.is_set():
                        break
            except Exception:  # noqa: BLE001 - e.g. an injected fault: resume the watch
                self._stop.wait(0.05)
            finally:
                watcher.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class NamespaceLog(_AddedLog):
    """Every namespace name ever ADDED, in order, so a test can tell which names its
    launches used even after deletion."""

    name = "namespace-log"

    def _lister(self) -> Any:
        return self.core.list_namespace

    def record(self, obj: Any) -> str:
        return str(obj.metadata.name)

    def names(self, prefix: str = "") -> list[str]:
        with self._lock:
            return [n for n in self.added if n.startswith(prefix)]


class KubeEventLog(_AddedLog):
    """Every core/v1 Event ever ADDED in any namespace (a failed attempt's events vanish
    with its namespace; this still saw them)."""

    name = "event-log"

    def _lister(self) -> Any:
        return self.core.list_event_for_all_namespaces

    def record(self, obj: Any) -> dict[str, Any]:
        return {"namespace": obj.metadata.namespace, "reason": obj.reason,
                "message": obj.message, "type": obj.type,
                "component": obj.source.component if obj.source else None,
                "kind": obj.involved_object.kind, "name": obj.involved_object.name}

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.added if reason is None or e["reason"] == reason]


def remove_node(kazoo_client: KazooClient, node_id: str) -> None:
    """Remove a node's znode behind the launchers' back (an operator's zkCli, a bug, a
    restore), lock dir included. Removing the lock of a node Zuul holds invites a
    launcher to lock it at that moment: a removal that meets a new lock contender
    (NotEmptyError) is tried again."""
    def removed() -> bool:
        try:
            kazoo_client.delete(paths.node_path(node_id), recursive=True)
        except NotEmptyError:
            return False
        return True
    wait_for(removed, message=f"node {node_id}'s znode removed")


def ns_config(*provider_keys: str) -> str:
    """A configuration with one provider `k8s` (the simulator's context) whose pool `main`
    has one `namespace` label `ns`; `provider_keys` are more provider settings, each a
    `key: value` line."""
    extra = "".join(f"    {line}\n" for line in provider_keys)
    return f"""
labels:
  - name: ns
providers:
  - name: k8s
    driver: kubernetes
    context: sim
{extra}    pools:
      - name: main
        labels:
          - name: ns
            type: namespace
"""


# The leak sweep's tests (test_leaks.py, test_ownership.py): one namespace label.
SWEEP_INTERVAL = 10.0
LEAK_GRACE = 30
LEAK_CONFIG = ns_config(f"leak-grace: {LEAK_GRACE}", "api-backoff: [0.01]")

# A launcher process with one pod label (test_process.py, test_identity.py), sweeping for
# leaks every second.
PROCESS_CONFIG = """
labels:
  - name: pod
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    leak-grace: 1
    api-backoff: [0.05]
    pools:
      - name: main
        max-servers: 10
        labels:
          - name: pod
            type: pod
            image: docker.io/fedora:40
"""
PROCESS_ENV = {"NODEPOOL_K8S_LEAK_SWEEP_INTERVAL": "1"}


def zuul_kubeconfig(port: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The kubeconfig Zuul's executor writes for a Kubernetes node, from `connection_port`
    alone (nodepool-protocol.md B1.4): the cluster is named after the API server's netloc,
    `certificate-authority-data` is `ca_crt` (base64 PEM), `insecure-skip-tls-verify` only
    when `skiptls`, the user `<namespace>:<user>` carries the token, the context selects the
    namespace. Returns (document, context name)."""
    server = port["host"]  # required
    cluster_name = urlsplit(server).netloc
    cluster: dict[str, Any] = {"server": server}
    if port.get("ca_crt"):
        cluster["certificate-authority-data"] = port["ca_crt"]
    if port["skiptls"]:  # required key
        cluster["insecure-skip-tls-verify"] = True
    user_name = f"{port['namespace']}:{port['user']}"
    context_name = f"{user_name}/{cluster_name}"
    document = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": cluster_name, "cluster": cluster}],
        "users": [{"name": user_name, "user": {"token": port["token"]}}],
        "contexts": [{"name": context_name,
                      "context": {"cluster": cluster_name, "user": user_name,
                                  "namespace": port["namespace"]}}],
        "current-context": context_name,
    }
    return document, context_name


def node_api(port: dict[str, Any]) -> k8s.CoreV1Api:
    """A CoreV1Api authenticated exactly as a Zuul job would be for this node."""
    document, context = zuul_kubeconfig(port)
    api = kubernetes.config.new_client_from_config_dict(document, context=context)
    return k8s.CoreV1Api(api)


def assert_subset(expected: Any, actual: Any, where: str = "") -> None:
    """Every key/item of `expected` is in `actual` with the same value (the server may add
    defaults, never change or drop what we sent)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: {actual!r} is not a mapping"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing in {actual!r}"
            assert_subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), \
            f"{where}: {actual!r} != {expected!r}"
        for index, (want, got) in enumerate(zip(expected, actual)):
            assert_subset(want, got, f"{where}[{index}]")
    else:
        assert expected == actual, f"{where}: {actual!r} != {expected!r}"


def provider_factory(**settings: Any) -> Callable[[ProviderConfig, Clock], Provider]:
    """A `Launcher(provider_factory=...)` that builds the real KubernetesProvider with driver
    tunables that are not configuration keys (`KubernetesSettings`, e.g. a short
    unschedulable grace). Credentials still come from $KUBECONFIG at start(), as in the
    daemon."""
    tunables = KubernetesSettings(**settings)

    def factory(config: ProviderConfig, clock: Clock) -> Provider:
        return KubernetesProvider(config, clock=clock, kubeconfig=None, settings=tunables)

    return factory


def finish(zuul: ZuulClient, request_id: str, k8s_sim: Simulator,
           kazoo_client: KazooClient) -> None:
    """Zuul uses and releases the fulfilled request's nodes; every node record and every
    object of ours in the cluster is gone afterwards."""
    nodeset = zuul.accept(request_id)
    zuul.use(nodeset)
    zuul.release(nodeset)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 30,
             message="every node removed from ZooKeeper")
    wait_cluster_empty(k8s_sim)
