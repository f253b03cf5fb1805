#!/usr/bin/env python3
"""Drive Zuul 14.3.0's own Nodepool client code against our `nodepool-launcher`.

Run with the compat venv (tools/compat/setup.sh builds it):

    .compat-venv/bin/python tools/compat/zuul_client_check.py [--keep] [--mode tls|plain|both]

Nothing of Zuul is copied: the script imports Zuul's classes and calls them the way the
scheduler, the executor and zuul-web do:

- `zuul.zk.ZooKeeperClient` (plain and TLS), `zuul.nodepool.Nodepool(scheduler=True)` with its
  request TreeCache, election and NodesProvisioned result events, and a second, executor-side
  `Nodepool` on its own session;
- the scheduler's calls: `requestNodes` (submitNodeRequest), waiting for the real
  `NodesProvisionedEvent` in the pipeline result queue, `getNodeRequest`, `getNodesetInfo`,
  `deleteNodeRequest` of failed requests, `reviseRequest` (relative priority),
  `cancelRequest`, `Scheduler._cleanupNodeRequests` (leaked requests), `emitStats` /
  `emitStatsTotals` with a recording statsd;
- the executor's: `getNodeRequest`, `acceptNodes` (lockNode with a 30 s timeout and the
  allocated_to checks, then the request deletion), `useNodeSet`, `holdNodeSet`,
  `returnNodeSet`, and `AnsibleJob.prepareKubeConfig` / `AnsibleJob.getHostList` on the
  Kubernetes nodes, whose kubeconfig is then used with kubectl against the simulator;
- zuul-web's: `getRegisteredLaunchers` (labels API) and the `/nodes` loop over the node cache;
- `deleteHoldRequest` (held nodes marked used).

Our launcher runs as a real process with a kubernetes provider (pointed at the simulator,
with RBAC enforced) and a fake provider. A watcher samples the request tree for children
under request znodes and empty request znodes throughout. Exit status 0 when every check
passed. Bounded: a global deadline stops everything (default 170 s).
"""

from __future__ import annotations

import argparse
import base64
import configparser
import json
import logging
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compat_lib import (NODEPOOL_NODE_KEYS, ZUUL_REQUEST_REQUIRED, ErrorLogCapture,  # noqa: E402
                        Report, RequestTreeWatcher, Stack, check_protocol_invariants,
                        pool_components, wait_for)

import yaml  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from zuul import model as zmodel  # noqa: E402
from zuul.lib import tracing  # noqa: E402
from zuul.nodepool import Nodepool  # noqa: E402
from zuul.zk import ZooKeeperClient  # noqa: E402

TENANT = "tenant-1"
PIPELINE = "check"
PROJECT = "example.com/org/project"

LAUNCHER_CONFIG = """
labels:
  - name: k8s-namespace
  - name: k8s-pod
  - name: fake-a
  - name: fake-b
  - name: fake-broken
  - name: fake-slow
  - name: fake-spare
    min-ready: 1
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    launch-retries: 2
    pools:
      - name: main
        node-attributes:
          executor-zone: zone-k8s
        labels:
          - name: k8s-namespace
            type: namespace
            cpu: 1
            memory: 128
          - name: k8s-pod
            type: pod
            image: docker.io/library/python:3.11-slim
            python-path: /usr/local/bin/python3
            cpu: 1
            memory: 256
  - name: fake
    driver: fake
    launch-retries: 1
    pools:
      - name: main
        node-attributes:
          executor-zone: zone-fake
        labels:
          - name: fake-a
            launch-delay: 0.05
          - name: fake-b
            type: pod
            cpu: 2
            memory: 512
            launch-delay: 0.05
          - name: fake-broken
            fail: true
          - name: fake-spare
            launch-delay: 0.05
      - name: slow
        max-servers: 1
        labels:
          - name: fake-slow
            launch-delay: 4
"""


class RecordingStatsd:
    """Stands in for Zuul's statsd client (accepts its format keyword arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def pipeline(self) -> "RecordingStatsd":
        return self

    def send(self) -> None:
        pass

    def _rec(self, kind: str, key: str, value: Any = 1, **kw: Any) -> None:
        if kw:
            key = key.format(**kw)
        self.calls.append((kind, key, value))

    def incr(self, key: str, value: Any = 1, **kw: Any) -> None:
        self._rec("incr", key, value, **kw)

    def timing(self, key: str, value: Any, **kw: Any) -> None:
        self._rec("timing", key, value, **kw)

    def gauge(self, key: str, value: Any, **kw: Any) -> None:
        self._rec("gauge", key, value, **kw)


def make_job(labels: list[str], name: str = "compat-job") -> SimpleNamespace:
    nodeset = zmodel.NodeSet()
    for index, label in enumerate(labels):
        nodeset.addNode(zmodel.Node([f"node{index}"], label))
    return SimpleNamespace(nodeset=nodeset, uuid=uuid.uuid4().hex, name=name)


class ZuulSide:
    """A Zuul scheduler-side and executor-side Nodepool client pair, both Zuul's own code."""

    def __init__(self, hosts: str, tls: tuple[str, str, str] | None,
                 report: Report) -> None:
        kw: dict[str, Any] = {}
        if tls:
            ca, cert, key = tls
            kw = dict(tls_ca=ca, tls_cert=cert, tls_key=key)
        self.report = report
        self.system_id = uuid.uuid4().hex
        self.statsd = RecordingStatsd()
        self.sched_zk = ZooKeeperClient(hosts, timeout=10.0, **kw)
        self.sched_zk.connect()
        self.exec_zk = ZooKeeperClient(hosts, timeout=10.0, **kw)
        self.exec_zk.connect()
        self.sched = Nodepool(self.sched_zk, self.system_id, self.statsd, scheduler=True)
        self.executor = Nodepool(self.exec_zk, self.system_id, None, scheduler=False)
        self.events: dict[str, Any] = {}

    def close(self) -> None:
        for closer in (self.sched.stop, self.executor.stop, self.sched_zk.disconnect,
                       self.exec_zk.disconnect):
            try:
                closer()
            except Exception:
                pass

    # scheduler
    def request(self, job: SimpleNamespace, priority: int = 200, relative_priority: int = 0,
                provider: str | None = None) -> zmodel.NodeRequest:
        return self.sched.requestNodes(uuid.uuid4().hex, job, TENANT, PIPELINE, provider,
                                       priority, relative_priority, event=None)

    def wait_provisioned(self, request_id: str, timeout: float = 30.0) -> Any:
        """The NodesProvisionedEvent Zuul's own request-cache callback put in the queue."""
        queue = self.sched.pipeline_result_events[TENANT][PIPELINE]

        def poll() -> Any:
            for event in queue:
                if isinstance(event, zmodel.NodesProvisionedEvent):
                    self.events[event.request_id] = event
                queue.ack(event)
            return self.events.get(request_id)

        return wait_for(poll, timeout, f"NodesProvisionedEvent for {request_id}", 0.05)

    def provisioned(self, job: SimpleNamespace, request_id: str,
                    timeout: float = 30.0) -> tuple[zmodel.NodeRequest, Any]:
        """What the scheduler does on NodesProvisioned (_doNodesProvisionedEvent)."""
        event = self.wait_provisioned(request_id, timeout)
        request = self.sched.zk_nodepool.getNodeRequest(event.request_id)
        assert request is not None, f"request {request_id} vanished before the scheduler read it"
        info = self.sched.getNodesetInfo(request, job.nodeset)
        if request.state == zmodel.STATE_FAILED:
            self.sched.deleteNodeRequest(request.id, event_id=event.request_id)
        return request, info

    # executor
    def accept(self, job: SimpleNamespace, request_id: str) -> tuple[zmodel.NodeSet, float]:
        request = self.executor.zk_nodepool.getNodeRequest(request_id)
        assert request is not None, f"executor could not read request {request_id}"
        nodeset = job.nodeset.copy()
        started = time.monotonic()
        self.executor.acceptNodes(request, nodeset)
        return nodeset, time.monotonic() - started


def node_json(client: KazooClient, node_id: str) -> dict[str, Any] | None:
    if not client.exists(f"/nodepool/nodes/{node_id}"):
        return None
    data, _ = client.get(f"/nodepool/nodes/{node_id}")
    return json.loads(data.decode("utf8")) if data else None


def check_node_json(report: Report, what: str, data: dict[str, Any], request_id: str,
                    label: str) -> None:
    missing = sorted(NODEPOOL_NODE_KEYS - set(data))
    report.check(f"{what}: node JSON has every key Nodepool writes", not missing,
                 f"missing {missing}")
    report.check(f"{what}: type is a list with the requested label",
                 data.get("type") == [label], f"type={data.get('type')!r}")
    report.check(f"{what}: allocated_to is the request id", data.get("allocated_to") == request_id,
                 f"allocated_to={data.get('allocated_to')!r}, request {request_id}")
    report.check(f"{what}: tenant_name and requestor copied from the request",
                 data.get("tenant_name") == TENANT and isinstance(data.get("requestor"), str),
                 f"tenant_name={data.get('tenant_name')!r} requestor={data.get('requestor')!r}")
    resources = data.get("resources")
    report.check(f"{what}: resources is a dict of numbers",
                 isinstance(resources, dict) and resources and all(
                     isinstance(v, (int, float)) for v in resources.values()),
                 f"resources={resources!r}")
    attributes = data.get("attributes")
    report.check(f"{what}: attributes is null or a dict", attributes is None
                 or isinstance(attributes, dict), f"attributes={attributes!r}")
    report.check(f"{what}: host_keys is a list (the executor iterates it)",
                 isinstance(data.get("host_keys"), list), f"host_keys={data.get('host_keys')!r}")
    report.check(f"{what}: ssh_port duplicates connection_port",
                 data.get("ssh_port") == data.get("connection_port"))


# -- scenarios -----------------------------------------------------------------------------------

def scenario_registry(report: Report, zuul: ZuulSide, raw: KazooClient) -> set[str]:
    with report.section("zuul-web labels: getRegisteredLaunchers"):
        launchers = wait_for(lambda: len(zuul.sched.zk_nodepool.getRegisteredLaunchers()) >= 3
                             and zuul.sched.zk_nodepool.getRegisteredLaunchers(), 30,
                             "three pool components")
        labels: set[str] = set()
        for launcher in launchers:
            labels |= launcher.supported_labels
        expected = {"k8s-namespace", "k8s-pod", "fake-a", "fake-b", "fake-broken",
                    "fake-slow", "fake-spare"}
        report.check("every pool has an id", all(launcher.id for launcher in launchers))
        report.check("union of supported_labels is every configured label", labels == expected,
                     f"got {sorted(labels)}")
        components = pool_components(raw)
        report.check("pool components carry Nodepool's keys", all(
            {"id", "name", "provider_name", "supported_labels", "priority", "paused", "state",
             "kind", "hostname", "version", "model_api"} <= set(c) for c in components),
            f"{components[:1]}")
        return {launcher.id for launcher in launchers}
    return set()


def scenario_min_ready(report: Report, zuul: ZuulSide, raw: KazooClient) -> None:
    with report.section("min-ready requests read by Zuul's reader"):
        seen_min_ready: set[str] = set()
        errors: list[str] = []

        def spare_ready() -> bool:
            for rid in zuul.sched.zk_nodepool.getNodeRequests():
                try:
                    request = zuul.sched.zk_nodepool.getNodeRequest(rid)
                except Exception as exc:  # what Zuul's cleanup/election would hit
                    errors.append(f"{rid}: {exc!r}")
                    continue
                if request is not None and rid.startswith("900-"):
                    seen_min_ready.add(rid)
                    try:
                        body = json.loads(raw.get(f"/nodepool/requests/{rid}")[0])
                    except Exception:
                        continue
                    absent = [k for k in ZUUL_REQUEST_REQUIRED if k not in body]
                    if absent:
                        errors.append(f"{rid}: lacks {absent}")
            for node_id in raw.get_children("/nodepool/nodes"):
                data = node_json(raw, node_id)
                if data and data.get("type") == ["fake-spare"] and data.get("state") == "ready" \
                        and not data.get("allocated_to"):
                    return True
            return False

        wait_for(spare_ready, 30, "a ready, unallocated min-ready node", 0.02)
        report.check("every request znode (incl. min-ready) parsed by NodeRequest.fromDict",
                     not errors, "; ".join(errors[:3]))
        if seen_min_ready:
            report.check("a min-ready (900-) request was observed and parsed", True)
        else:
            report.note("min-ready request was too short-lived to be observed by polling; "
                        "covered by the request-tree watcher and the cache listener")
        # Zuul's cached iteration (emitStatsTotals, cleanup) over every request it has.
        cached = list(zuul.sched.zk_nodepool.getNodeRequests(cached=True))
        bad = [rid for rid in cached
               if zuul.sched.zk_nodepool.getNodeRequest(rid, cached=True) is None]
        report.check("cached getNodeRequest works for every cached id", not bad, f"{bad}")


def build(report: Report, zuul: ZuulSide, raw: KazooClient, title: str, labels: list[str],
          *, provider: str, zone: str, k8s_check: Any = None, hold: bool = False,
          hold_expiration: int | None = None, kubeconfig_dir: Path | None = None
          ) -> list[str]:
    """One whole build through Zuul's scheduler and executor code paths."""
    node_ids: list[str] = []
    with report.section(title):
        job = make_job(labels)
        request = zuul.request(job)
        report.check("request id has Zuul's form (4th char '-')",
                     zuul.sched.isNodeRequestID(request.id), request.id)
        request, info = zuul.provisioned(job, request.id, timeout=60)
        report.check("NodesProvisioned fired; state fulfilled", request.state == "fulfilled",
                     f"state={request.state}")
        report.check("request JSON kept Zuul's requestor_data (job_uuid, build_set_uuid)",
                     request.job_uuid == job.uuid and request.build_set_uuid)
        report.check("nodes has one id per requested label", len(request.nodes) == len(labels),
                     f"nodes={request.nodes}")
        for node_id, label in zip(request.nodes, labels):
            data = node_json(raw, node_id)
            if report.check(f"node {node_id} exists", data is not None):
                report.check(f"node {node_id} has the label of its slot ({label})",
                             data.get("type") == [label], f"type={data.get('type')}")
                check_node_json(report, f"node {node_id}", data, request.id, label)
        report.check("getNodesetInfo: provider and executor zone from the nodes",
                     info.provider == provider and info.zone == zone,
                     f"provider={info.provider} zone={info.zone}")
        report.check("getNodesetInfo: node ids in order", info.nodes == request.nodes)
        nodeset, took = zuul.accept(job, request.id)
        node_ids = [n.id for n in nodeset.getNodes()]
        report.check("acceptNodes locked every node without waiting (launcher had unlocked)",
                     took < 5, f"took {took:.1f}s")
        report.check("acceptNodes deleted the request (no children blocked the delete)",
                     raw.exists(f"/nodepool/requests/{request.id}") is None)
        report.check("nodes locked by Zuul", all(n.lock is not None for n in nodeset.getNodes()))
        zuul.executor.useNodeSet(nodeset, TENANT, PROJECT)
        for node in nodeset.getNodes():
            data = node_json(raw, node.id)
            report.check(f"node {node.id} in-use with Zuul's user_data and extra id key",
                         data and data["state"] == "in-use" and data.get("id") == node.id
                         and data.get("user_data", {}).get("zuul_system") == zuul.system_id)
        if k8s_check is not None:
            k8s_check(report, nodeset, kubeconfig_dir)

        # zuul-web /nodes: the loop over the cached nodes (the cache follows within moments).
        def web_nodes() -> list[dict[str, Any]]:
            web = []
            for nid in zuul.sched.zk_nodepool.getNodes(cached=True):
                node = zuul.sched.zk_nodepool.getNode(nid)
                if node is None:
                    continue
                if node.user_data and isinstance(node.user_data, dict) and \
                        node.user_data.get("zuul_system") == zuul.system_id and \
                        node.tenant_name == TENANT:
                    web.append({k: getattr(node, k, None) for k in (
                        "id", "type", "connection_type", "external_id", "provider", "state",
                        "state_time", "comment")})
            return web

        try:
            wait_for(lambda: set(node_ids) <= {w["id"] for w in web_nodes()}, 5, "web view")
            listed = True
        except TimeoutError:
            listed = False
        report.check("zuul-web /nodes lists this build's nodes", listed, f"{web_nodes()}")
        # While Zuul holds the locks the launcher must leave the nodes alone (cleanup runs
        # every 2 s here).
        time.sleep(3)
        for node in nodeset.getNodes():
            data = node_json(raw, node.id)
            report.check(f"node {node.id} untouched by the launcher while locked",
                         data and data["state"] == "in-use")
        buildref = SimpleNamespace(uuid=uuid.uuid4().hex)
        if hold:
            hold_request = zmodel.HoldRequest()
            hold_request.tenant, hold_request.project = TENANT, PROJECT
            hold_request.job, hold_request.ref_filter = "compat-job", ".*"
            hold_request.reason, hold_request.max_count = "compat hold", 1
            hold_request.node_expiration = hold_expiration
            zuul.sched.zk_nodepool.storeHoldRequest(hold_request)
            zuul.executor.holdNodeSet(nodeset, hold_request, buildref, 1.0)
            zuul.executor.returnNodeSet(nodeset, buildref, TENANT, PROJECT, 1.0)
            held_at = time.monotonic()
            time.sleep(1.0 if hold_expiration else 4.0)
            for node_id in node_ids:
                data = node_json(raw, node_id)
                report.check(f"held node {node_id} kept by the launcher after unlock",
                             data and data["state"] == "hold"
                             and data.get("hold_job", "").startswith(TENANT))
            count = zuul.sched.zk_nodepool.heldNodeCount(
                (TENANT, PROJECT, "compat-job", ".*"))
            report.check("heldNodeCount (Zuul's autohold bookkeeping) counts them",
                         count == len(node_ids), f"{count}")
            if hold_expiration:
                wait_for(lambda: all(raw.exists(f"/nodepool/nodes/{n}") is None
                                     for n in node_ids), hold_expiration + 20,
                         "held nodes to expire")
                waited = time.monotonic() - held_at
                report.check(f"held nodes deleted once hold_expiration ({hold_expiration}s) "
                             f"passed (after {waited:.1f}s)", waited >= hold_expiration - 0.5)
            stored = zuul.sched.zk_nodepool.getHoldRequest(hold_request.id)
            zuul.sched.zk_nodepool.deleteHoldRequest(stored, None)
            report.check("deleteHoldRequest marked the held nodes used and removed the request",
                         zuul.sched.zk_nodepool.getHoldRequest(hold_request.id) is None)
        else:
            zuul.executor.returnNodeSet(nodeset, buildref, TENANT, PROJECT, 1.0)
        wait_for(lambda: all(raw.exists(f"/nodepool/nodes/{n}") is None for n in node_ids), 45,
                 "the launcher to delete the returned nodes")
        report.check("launcher deleted the used nodes after Zuul unlocked them", True)
    return node_ids


def k8s_checks(sim: Any) -> Any:
    from zuul.executor.server import AnsibleJob

    def check(report: Report, nodeset: zmodel.NodeSet, workdir: Path) -> None:
        kubeconfig = workdir / f"kubeconfig-{uuid.uuid4().hex[:6]}"
        jobdir = SimpleNamespace(kubeconfig=str(kubeconfig))
        inventory = []
        for node in nodeset.getNodes():
            report.check(f"node {node.id} connection_type is namespace/kubectl",
                         node.connection_type in ("namespace", "kubectl"),
                         f"{node.connection_type}")
            data = node.connection_port or node.kubernetes_connection
            report.check(f"node {node.id} connection_port is a dict", isinstance(data, dict),
                         f"{type(data).__name__}")
            if not isinstance(data, dict):
                continue
            required = {"host", "skiptls", "token", "user", "namespace"}
            if node.connection_type == "kubectl":
                required.add("pod")
            report.check(f"node {node.id} connection_port has {sorted(required)}",
                         required <= set(data), f"keys {sorted(data)}")
            parts = urlsplit(data.get("host", ""))
            report.check(f"node {node.id} host is an https://host:port URL",
                         parts.scheme == "https" and parts.port, data.get("host"))
            if not data.get("skiptls"):
                try:
                    pem = base64.b64decode(data.get("ca_crt") or "").decode()
                except Exception:
                    pem = ""
                report.check(f"node {node.id} ca_crt is base64 of a PEM",
                             "BEGIN CERTIFICATE" in pem)
            report.check(f"node {node.id} external_id is the namespace",
                         getattr(node, "external_id", None) == data.get("namespace"))
            # The executor's own kubeconfig builder (a method that only uses jobdir).
            AnsibleJob.prepareKubeConfig(None, jobdir, data)
            node.connection_port = None
            node.kubectl_namespace = data["namespace"]
            node.kubectl_context = data["context_name"]
            ctx = data["context_name"]
            ns = data["namespace"]
            probe = ["get", "pods", "-n", ns, "-o", "name"]
            if node.connection_type == "kubectl":
                inventory.append(node)
                report.check(f"node {node.id} interface_ip is the pod name",
                             node.interface_ip == data["pod"], f"{node.interface_ip}")
                probe = ["get", "pod", data["pod"], "-n", ns, "-o", "name"]
            result = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "--context", ctx,
                                     "--request-timeout", "10s", *probe],
                                    capture_output=True, text=True, timeout=30)
            report.check(f"node {node.id}: kubectl with the executor's kubeconfig works "
                         f"({' '.join(probe[:2])})", result.returncode == 0,
                         (result.stderr or result.stdout).strip()[:300])
        cfg = yaml.safe_load(kubeconfig.read_text())
        report.check("executor kubeconfig has one context per k8s node",
                     len(cfg["contexts"]) == len(nodeset.getNodes()))
        stub = SimpleNamespace(job=SimpleNamespace(host_variables={}, group_variables={}),
                               executor_server=SimpleNamespace(default_username="zuul"),
                               normal_vars={}, nodeset=nodeset, winrm_pem_file=None,
                               winrm_key_file=None, winrm_operation_timeout=None,
                               winrm_read_timeout=None)
        try:
            hosts = AnsibleJob.getHostList(stub, {}, inventory)
        except Exception as exc:
            report.fail("executor getHostList on the kubectl node", repr(exc))
            return
        report.check("executor getHostList on the kubectl node", len(hosts) == len(inventory))
        for node, host in zip(inventory, hosts):
            hv = host["host_vars"]
            python = node.python_path or "auto"
            report.check("inventory: ansible_connection kubectl, ansible_host = pod, python "
                         "from the label",
                         hv.get("ansible_connection") == "kubectl"
                         and hv.get("ansible_host") == node.interface_ip
                         and hv.get("ansible_kubectl_context")
                         and hv.get("ansible_python_interpreter") == python, f"{hv}")

    return check


def scenario_failures(report: Report, zuul: ZuulSide, raw: KazooClient,
                      pool_ids: set[str]) -> None:
    for title, labels in (("unserved label fails", ["no-such-label"]),
                          ("label nobody serves together with a served one",
                           ["fake-a", "no-such-label"]),
                          ("launch failure declines, then fails", ["fake-broken"])):
        with report.section(f"failed request: {title}"):
            job = make_job(labels)
            submitted = zuul.request(job)
            request, info = zuul.provisioned(job, submitted.id, timeout=60)
            report.check("NodesProvisioned fired with state failed", request.state == "failed",
                         f"state={request.state}")
            report.check("failed request has nodes: []", request.nodes == [],
                         f"nodes={request.nodes}")
            declined = set(request._zk_data.get("declined_by") or [])
            report.check("failed only after every registered pool declined",
                         pool_ids <= declined, f"declined_by={sorted(declined)}")
            report.check("getNodesetInfo on the failed request (no provider, no zone)",
                         info.provider is None and info.zone is None,
                         f"provider={info.provider} zone={info.zone}")
            report.check("the scheduler's delete of the failed request worked",
                         raw.exists(f"/nodepool/requests/{submitted.id}") is None)


def scenario_priority_cancel_cleanup(report: Report, zuul: ZuulSide, raw: KazooClient) -> None:
    with report.section("relative priority revision, cancellation, leaked-request cleanup"):
        job_a, job_b, job_c = (make_job(["fake-slow"]) for _ in range(3))
        a = zuul.request(job_a)
        wait_for(lambda: (zuul.sched.zk_nodepool.getNodeRequest(a.id) or a).state == "pending",
                 20, "request A pending")
        b = zuul.request(job_b)
        wait_for(lambda: (zuul.sched.zk_nodepool.getNodeRequest(b.id) or b).state == "pending",
                 20, "request B pending (paused at the pool's max-servers)")
        c = zuul.request(job_c, relative_priority=3)

        # Pools that lack fake-slow leave C to the pool that has it (no decline while a
        # candidate exists); that pool is paused: nobody writes C now.
        time.sleep(1.0)
        fresh_c = zuul.sched.zk_nodepool.getNodeRequest(c.id)
        report.check("C stays requested while the only pool that serves it is paused",
                     fresh_c.state == "requested", f"state={fresh_c.state}")
        report.check("pools lacking the label did not decline C while a candidate exists",
                     not fresh_c._zk_data.get("declined_by"),
                     f"declined_by={fresh_c._zk_data.get('declined_by')}")
        fresh_b = zuul.sched.zk_nodepool.getNodeRequest(b.id)
        report.check("reviseRequest skips B, which the launcher holds locked",
                     zuul.sched.reviseRequest(fresh_b, relative_priority=9) is False)
        zuul.sched.reviseRequest(fresh_c, relative_priority=7)
        after = zuul.sched.zk_nodepool.getNodeRequest(c.id)
        report.check("reviseRequest rewrote C's relative_priority (versioned set succeeded)",
                     after.relative_priority == 7, f"{after.relative_priority}")
        report.check("revision kept Zuul's requestor_data",
                     after.job_uuid == job_c.uuid and after.span_info == c.span_info)
        # Cancel A while its node is building (Zuul: dequeue / reconfiguration).
        cancelled = zuul.sched.zk_nodepool.getNodeRequest(a.id)
        zuul.sched.cancelRequest(cancelled)
        report.check("cancelRequest deleted the pending request (no children under it)",
                     raw.exists(f"/nodepool/requests/{a.id}") is None)
        request_b, _ = zuul.provisioned(job_b, b.id, timeout=30)
        report.check("B fulfilled once capacity was free", request_b.state == "fulfilled")
        a_nodes = [n for n in raw.get_children("/nodepool/nodes")
                   if (node_json(raw, n) or {}).get("allocated_to") == a.id]
        report.check("no node stays allocated to the cancelled request", not a_nodes,
                     f"{a_nodes}")
        if request_b.state == "fulfilled":
            nodeset, _ = zuul.accept(job_b, b.id)
            zuul.executor.returnNodeSet(nodeset, SimpleNamespace(uuid="x"), TENANT, PROJECT, 0)
        # C is now being served; the scheduler's leaked-request cleanup deletes it.
        from zuul.scheduler import Scheduler
        stub = SimpleNamespace(nodepool=zuul.sched, system=SimpleNamespace(
            system_id=zuul.system_id), launcher=SimpleNamespace(getRequestIds=lambda: []),
            abide=SimpleNamespace(tenants={}), log=logging.getLogger("zuul.Scheduler"))
        Scheduler._cleanupNodeRequests(stub)
        report.check("Zuul's leaked-request cleanup deleted C",
                     raw.exists(f"/nodepool/requests/{c.id}") is None)

        def settled() -> bool:
            for node_id in raw.get_children("/nodepool/nodes"):
                data = node_json(raw, node_id) or {}
                if data.get("allocated_to") in (a.id, b.id, c.id):
                    return False
                locks = raw.get_children(f"/nodepool/nodes/{node_id}/lock") \
                    if raw.exists(f"/nodepool/nodes/{node_id}/lock") else []
                if data.get("type") == ["fake-slow"] and locks:
                    return False
            return True

        wait_for(settled, 30, "nodes of cancelled requests to be released")
        report.check("nodes of cancelled / cleaned-up requests released (unlocked, unallocated)",
                     True)


def scenario_executor_dies(report: Report, stack: Stack, chroot: str, tls: bool,
                           zuul: ZuulSide, raw: KazooClient) -> None:
    with report.section("an executor's session dies while it holds nodes"):
        kw: dict[str, Any] = {}
        if tls:
            ca, cert, key = stack.tls_files()
            kw = dict(tls_ca=ca, tls_cert=cert, tls_key=key)
        doomed_zk = ZooKeeperClient(stack.hosts(chroot, tls), timeout=10.0, **kw)
        doomed_zk.connect()
        doomed = Nodepool(doomed_zk, zuul.system_id, None, scheduler=False)
        job = make_job(["fake-a", "fake-b"])
        # Zuul's paused-parent priority: one below 200, written as "199".
        submitted = zuul.request(job, priority=199)
        report.check("request id carries the 3-character prefix 199",
                     submitted.id.startswith("199-"), submitted.id)
        request, _ = zuul.provisioned(job, submitted.id, timeout=30)
        report.check("fulfilled", request.state == "fulfilled", f"{request.state}")
        fresh = doomed.zk_nodepool.getNodeRequest(request.id)
        nodeset = job.nodeset.copy()
        doomed.acceptNodes(fresh, nodeset)
        doomed.useNodeSet(nodeset, TENANT, PROJECT)
        ids = [n.id for n in nodeset.getNodes()]
        doomed.stop()
        doomed_zk.disconnect()  # its ephemeral node locks vanish with the session
        wait_for(lambda: all(raw.exists(f"/nodepool/nodes/{n}") is None for n in ids), 30,
                 "the launcher to delete the in-use nodes whose lock vanished")
        report.check("in-use nodes whose holder vanished were deleted (lock = liveness)", True)


def scenario_stats(report: Report, zuul: ZuulSide) -> None:
    with report.section("Zuul statistics over our nodes and requests"):
        tenant = SimpleNamespace(name=TENANT, all_projects=[SimpleNamespace(
            canonical_name=PROJECT)])
        zuul.sched.emitStatsTotals(SimpleNamespace(tenants={TENANT: tenant}))
        keys = {key for _, key, _ in zuul.statsd.calls}
        report.check("emitStats / emitStatsTotals ran (requests and resources gauges)",
                     "zuul.nodepool.current_requests" in keys
                     and any(k.startswith("zuul.nodepool.requests.fulfilled") for k in keys),
                     f"{sorted(keys)[:8]}")


def run_mode(report: Report, stack: Stack, tls: bool, full: bool) -> None:
    mode = "TLS" if tls else "plain"
    chroot = stack.chroot()
    raw = stack.kazoo(chroot)
    print(f"\n######## mode: {mode} ZooKeeper (chroot {chroot})", flush=True)
    launcher = stack.start_our_launcher(f"launcher-{mode.lower()}", chroot, tls,
                                        LAUNCHER_CONFIG)
    zuul_logs = ErrorLogCapture()
    logging.getLogger("zuul").addHandler(zuul_logs)
    watcher = RequestTreeWatcher(raw)
    watcher.start()
    zuul = ZuulSide(stack.hosts(chroot, tls), stack.tls_files() if tls else None, report)
    saved_section = report.section_name
    try:
        with report.section(f"[{mode}] Zuul connects and sees our launcher"):
            report.check("Zuul ZooKeeperClient connected", zuul.sched_zk.connected
                         and zuul.exec_zk.connected)
            wait_for(lambda: zuul.sched.election_won, 20, "Zuul's nodepool event election")
            report.check("scheduler-side Nodepool won its event election", True)
        pool_ids = scenario_registry(report, zuul, raw)
        scenario_min_ready(report, zuul, raw)
        build(report, zuul, raw, f"[{mode}] fake build, three nodes in nodeset order",
              ["fake-b", "fake-a", "fake-b"], provider="fake", zone="zone-fake")
        build(report, zuul, raw, f"[{mode}] kubernetes build (namespace + kubectl pod)",
              ["k8s-namespace", "k8s-pod"], provider="k8s", zone="zone-k8s",
              k8s_check=k8s_checks(stack.sim), kubeconfig_dir=stack.workdir)
        scenario_failures(report, zuul, raw, pool_ids)
        if full:
            build(report, zuul, raw, f"[{mode}] autohold: holdNodeSet, deleteHoldRequest",
                  ["fake-a"], provider="fake", zone="zone-fake", hold=True)
            build(report, zuul, raw, f"[{mode}] autohold with node_expiration",
                  ["fake-a"], provider="fake", zone="zone-fake", hold=True, hold_expiration=3)
            scenario_priority_cancel_cleanup(report, zuul, raw)
            scenario_executor_dies(report, stack, chroot, tls, zuul, raw)
            scenario_stats(report, zuul)
        with report.section(f"[{mode}] invariants over the whole run"):
            check_protocol_invariants(report, watcher, zuul_logs, raw)
            report.check("launcher still running", launcher.running, launcher.log_tail())
            log = launcher.log_text()
            bad = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
            report.check("launcher logged no ERROR / traceback", not bad, "\n".join(bad[:5]))
            if stack.sim is not None:
                remaining = [ns["metadata"]["name"] for ns in stack.sim.list("namespaces")
                             if ns["metadata"].get("labels", {}).get("nodepool_provider_name")
                             and ns["metadata"].get("deletionTimestamp") is None]
                report.check("no namespace left in the cluster", not remaining, f"{remaining}")
    finally:
        report.section_name = saved_section
        watcher.stop()
        logging.getLogger("zuul").removeHandler(zuul_logs)
        zuul.close()
        code = launcher.stop()
        with report.section(f"[{mode}] launcher stop"):
            report.check("SIGTERM: launcher exited 0", code == 0, f"exit {code}")
            report.check("components unregistered", not pool_components(raw))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=("tls", "plain", "both"), default="both")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--deadline", type=float, default=170.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    # What every Zuul service does at start (tracing disabled): installs the SDK tracer
    # provider, so span_info carries real 64/128-bit trace and span ids.
    tracing.Tracing(configparser.ConfigParser())
    report = Report("Zuul 14.3.0 client code against nodepool_k8s")
    stack = Stack(keep=args.keep)
    stack.install_guards(args.deadline)
    try:
        with report.section("start ZooKeeper (plain + TLS) and the Kubernetes simulator"):
            stack.start_zookeeper()
            stack.start_simulator(enforce_rbac=True)
            report.check("ZooKeeper and simulator up", True)
        if args.mode in ("tls", "both"):
            run_mode(report, stack, tls=True, full=True)
        if args.mode in ("plain", "both"):
            run_mode(report, stack, tls=False, full=args.mode == "plain")
        report.note("Zuul's zuul.conf loader (ZooKeeperClient.fromConfig) requires TLS; a plain "
                    "connection exists only in code/tests, so TLS is the realistic mode")
    finally:
        if args.keep:
            print(f"work dir kept: {stack.workdir}")
        stack.close()
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
