#!/usr/bin/env python3
"""Run the real Nodepool 11 launcher side by side with ours on one ZooKeeper and one cluster.

Run with the compat venv (tools/compat/setup.sh builds it, Nodepool in its own env):

    .compat-venv/bin/python tools/compat/nodepool_side_by_side.py [--keep]

Both launchers use the Kubernetes driver against the same simulated cluster
(nodepool_k8s.dev.simulator, RBAC enforced) over TLS ZooKeeper (mandatory for Nodepool). Nodepool
serves `np-only`, `np-pod`, `np-spare` (min-ready 1) and `shared`; we serve `ours-only`,
`ours-pod`, `ours-spare` (min-ready 1) and `shared`. Requests are made with Zuul 14.3.0's own
scheduler/executor code (see zuul_client_check.py). Checks:

- each side's component registry reads the other's components (Nodepool's own
  ComponentRegistry, run in the Nodepool env; our ComponentCache);
- labels served by one side are fulfilled by it and never failed prematurely; a label served by
  both is fulfilled by either; Zuul's `provider` preference is honoured both ways; requests no
  single pool can serve fail once both declined, with `nodes: []`;
- min-ready of both sides coexists (one spare each, no over-provisioning);
- the node JSON both write for a namespace and a pod node: ours has every key theirs has;
  differences are reported;
- `nodepool list` / `request-list` of Nodepool's CLI on a tree with our nodes, and ours on
  theirs;
- neither side touches the other's nodes: with one side stopped, Zuul returns that side's node
  (`used`, unlocked) and the other side leaves it and its namespace alone (cleanup, deleter,
  leak sweep), until its owner comes back and deletes it.

Exit status 0 when every check passed. Bounded by a global deadline (default 170 s).
"""

from __future__ import annotations

import argparse
import configparser
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compat_lib import (NODEPOOL_ENV, ErrorLogCapture, NodeSampler, Process,  # noqa: E402
                        Report, RequestTreeWatcher, Stack, check_protocol_invariants,
                        our_command, pool_components, wait_for)
from zuul_client_check import (PROJECT, TENANT, ZuulSide, check_node_json, k8s_checks,  # noqa
                               make_job, node_json)

from zuul.lib import tracing  # noqa: E402

NP_PYTHON = NODEPOOL_ENV / "bin" / "python"
NP_LAUNCHER = NODEPOOL_ENV / "bin" / "nodepool-launcher"
NP_CLI = NODEPOOL_ENV / "bin" / "nodepool"

NODEPOOL_CONFIG = """
labels:
  - name: np-only
  - name: np-pod
  - name: np-spare
    min-ready: 1
  - name: shared
providers:
  - name: np-k8s
    driver: kubernetes
    context: sim
    pools:
      - name: npmain
        labels:
          - name: np-only
            type: namespace
            cpu: 1
            memory: 128
          - name: np-pod
            type: pod
            image: docker.io/library/python:3.11-slim
            cpu: 1
            memory: 256
          - name: np-spare
            type: namespace
          - name: shared
            type: namespace
"""

OUR_CONFIG = """
labels:
  - name: ours-only
  - name: ours-pod
  - name: ours-spare
    min-ready: 1
  - name: shared
providers:
  - name: ours-k8s
    driver: kubernetes
    context: sim
    leak-grace: 2
    pools:
      - name: oursmain
        labels:
          - name: ours-only
            type: namespace
            cpu: 1
            memory: 128
          - name: ours-pod
            type: pod
            image: docker.io/library/python:3.11-slim
            cpu: 1
            memory: 256
          - name: ours-spare
            type: namespace
          - name: shared
            type: namespace
"""

# Run inside the Nodepool env: Nodepool's own ComponentRegistry reads every component.
NP_REGISTRY_SNIPPET = r"""
import json, sys, time
from nodepool.zk import ZooKeeperClient
from nodepool.zk.components import COMPONENT_REGISTRY
hosts, ca, cert, key = sys.argv[1:5]
client = ZooKeeperClient(hosts, tls_ca=ca, tls_cert=cert, tls_key=key)
client.connect()
registry = COMPONENT_REGISTRY.create(client)
time.sleep(1.0)
out = {"model_api": registry.getMinimumModelApi(), "components": []}
for kind, components in registry.all():
    for c in components:
        out["components"].append({k: getattr(c, k, None) for k in (
            "kind", "hostname", "state", "version", "model_api", "id", "name",
            "provider_name", "supported_labels", "priority", "paused")})
print(json.dumps(out))
client.disconnect()
"""

NP_BENIGN_ERRORS = (
    # Nodepool logs the ZooKeeper session going away when we stop it on purpose.
    "Connection dropped",
)


class Launchers:
    """Start/stop both launchers (each may be restarted)."""

    def __init__(self, stack: Stack, chroot: str) -> None:
        self.stack = stack
        self.chroot = chroot
        self.np_config = stack.workdir / "nodepool.yaml"
        self.np_config.write_text(stack.zk_yaml(chroot, True) + "zookeeper-timeout: 10\n"
                                  + NODEPOOL_CONFIG)
        self.ours_config = stack.workdir / "ours.yaml"
        self.np: Process | None = None
        self.ours: Process | None = None
        self.np_runs = 0
        self.our_runs = 0

    def start_nodepool(self) -> Process:
        self.np_runs += 1
        env = dict(os.environ, KUBECONFIG=str(self.stack.kubeconfig))
        self.np = self.stack.process(
            f"nodepool-{self.np_runs}",
            [str(NP_LAUNCHER), "-d", "-c", str(self.np_config), "--no-webapp"], env=env,
            cwd=str(self.stack.workdir))
        return self.np

    def start_ours(self) -> Process:
        self.our_runs += 1
        self.ours = self.stack.start_our_launcher(
            f"ours-{self.our_runs}", self.chroot, True, OUR_CONFIG,
            extra_env={"NODEPOOL_K8S_LEAK_SWEEP_INTERVAL": "2"})
        self.ours_config = self.stack.workdir / f"ours-{self.our_runs}.yaml"
        return self.ours

    def logs(self, prefix: str) -> str:
        return "\n".join(p.log_text() for p in self.stack.processes if p.name.startswith(prefix))


def pools_by_provider(raw: Any) -> dict[str, dict[str, Any]]:
    return {c.get("provider_name"): c for c in pool_components(raw)}


def run_build(report: Report, zuul: ZuulSide, raw: Any, labels: list[str],
              provider: str | None = None, release: bool = True
              ) -> tuple[Any, list[dict[str, Any]], Any]:
    """Submit with Zuul's scheduler code, accept with the executor's; returns
    (request, node JSONs as written by the launcher, nodeset)."""
    job = make_job(labels)
    submitted = zuul.request(job, provider=provider)
    request, info = zuul.provisioned(job, submitted.id, timeout=60)
    datas = [node_json(raw, n) or {} for n in request.nodes]
    nodeset = None
    if request.state == "fulfilled":
        nodeset, _ = zuul.accept(job, request.id)
        zuul.executor.useNodeSet(nodeset, TENANT, PROJECT)
        if release:
            zuul.executor.returnNodeSet(nodeset, SimpleNamespace(uuid=uuid.uuid4().hex),
                                        TENANT, PROJECT, 1.0)
    return request, datas, (job, nodeset, info)


def compare_keys(report: Report, what: str, theirs: dict[str, Any],
                 ours: dict[str, Any]) -> None:
    only_theirs = sorted(set(theirs) - set(ours))
    only_ours = sorted(set(ours) - set(theirs))
    report.check(f"{what}: our node JSON has every key Nodepool 11 writes", not only_theirs,
                 f"missing {only_theirs}")
    if only_ours:
        report.note(f"{what}: keys only we write: {only_ours}")
    cp_t, cp_o = theirs.get("connection_port"), ours.get("connection_port")
    if isinstance(cp_t, dict) and isinstance(cp_o, dict):
        report.check(f"{what}: connection_port has every key Nodepool writes",
                     set(cp_t) <= set(cp_o), f"theirs {sorted(cp_t)} ours {sorted(cp_o)}")
    differing = []
    for key in sorted(set(theirs) & set(ours)):
        a, b = theirs[key], ours[key]
        if key in ("state_time", "created_time", "launcher", "provider", "pool", "type",
                   "external_id", "allocated_to", "requestor", "connection_port", "ssh_port",
                   "id", "user_data", "state"):
            continue
        if type(a) is not type(b) or (not isinstance(a, (int, float)) and a != b):
            differing.append(f"{key}: theirs={a!r} ours={b!r}")
    if differing:
        report.note(f"{what}: values that differ: " + "; ".join(differing))


def run_cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--deadline", type=float, default=170.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    tracing.Tracing(configparser.ConfigParser())
    report = Report("Nodepool 11 side by side with nodepool_k8s")
    if not NP_LAUNCHER.exists():
        print(f"{NP_LAUNCHER} missing: run tools/compat/setup.sh first")
        return 2
    stack = Stack(keep=args.keep)
    stack.install_guards(args.deadline)
    zuul: ZuulSide | None = None
    zuul_logs = ErrorLogCapture()
    logging.getLogger("zuul").addHandler(zuul_logs)
    try:
        with report.section("start ZooKeeper (TLS), the simulator and both launchers"):
            stack.start_zookeeper()
            sim = stack.start_simulator(enforce_rbac=True)
            chroot = stack.chroot()
            raw = stack.kazoo(chroot)
            both = Launchers(stack, chroot)
            both.start_nodepool()
            both.start_ours()
            wait_for(lambda: {"np-k8s", "ours-k8s"} <= set(pools_by_provider(raw)), 60,
                     "both launchers' pool components")
            report.check("both launchers registered their pools", True)
        watcher = RequestTreeWatcher(raw)
        watcher.start()
        sampler = NodeSampler(raw)
        sampler.start()
        zuul = ZuulSide(stack.hosts(chroot, True), stack.tls_files(), report)
        wait_for(lambda: zuul.sched.election_won, 20, "Zuul's nodepool event election")
        pools = pools_by_provider(raw)
        np_pool, our_pool = pools["np-k8s"], pools["ours-k8s"]

        with report.section("component registries read each other"):
            ca, cert, key = stack.tls_files()
            result = run_cli([str(NP_PYTHON), "-c", NP_REGISTRY_SNIPPET,
                              stack.hosts(chroot, True), ca, cert, key])
            if report.check("Nodepool's ComponentRegistry ran", result.returncode == 0,
                            result.stderr[-800:]):
                seen = json.loads(result.stdout.strip().splitlines()[-1])
                ours = [c for c in seen["components"] if c.get("id") == our_pool["id"]]
                report.check("Nodepool parses our pool component (id, labels, provider)",
                             ours and sorted(ours[0]["supported_labels"]) == sorted(
                                 ["ours-only", "ours-pod", "ours-spare", "shared"])
                             and ours[0]["provider_name"] == "ours-k8s"
                             and ours[0]["priority"] == 100 and ours[0]["paused"] is False,
                             f"{ours}")
                report.check("Nodepool sees our launcher component",
                             any(c["kind"] == "launcher" and c["version"] and
                                 c["version"] != "11.0.0" for c in seen["components"]),
                             f"{seen['components']}")
                report.check("system minimum model API stays 0 (Nodepool does not exit)",
                             seen["model_api"] == 0, f"{seen['model_api']}")
            from nodepool_k8s.zk.cache import ComponentCache
            from nodepool_k8s.zk.client import ZkClient, ZkSettings
            from nodepool_k8s.config.model import ZkTls
            ours_zk = ZkClient(ZkSettings(hosts=stack.hosts(chroot, True),
                                          tls=ZkTls(ca=ca, cert=cert, key=key)))
            ours_zk.start()
            try:
                cache = ComponentCache(ours_zk)
                cache.start()
                cache.wait_synced(10)
                theirs = [c for c in cache.pools() if c.id == np_pool["id"]]
                report.check("our ComponentCache parses Nodepool's pool component",
                             theirs and theirs[0].supported_labels == frozenset(
                                 ["np-only", "np-pod", "np-spare", "shared"])
                             and theirs[0].provider_name == "np-k8s"
                             and theirs[0].priority == 100, f"{theirs}")
                report.check("our ComponentCache sees Nodepool's launcher component",
                             any(c.data.get("version") == "11.0.0"
                                 for c in cache.launchers()))
                cache.stop()
            finally:
                ours_zk.stop()

        samples: dict[str, dict[str, Any]] = {}
        request_samples: dict[str, dict[str, Any]] = {}
        with report.section("labels served by one side, by both, and by nobody"):
            for label, owner in (("np-only", "np-k8s"), ("ours-only", "ours-k8s"),
                                 ("np-pod", "np-k8s"), ("ours-pod", "ours-k8s")):
                request, datas, (job, nodeset, info) = run_build(
                    report, zuul, raw, [label], release=False)
                if not report.check(f"{label}: fulfilled", request.state == "fulfilled",
                                    f"state={request.state} "
                                    f"declined_by={request._zk_data.get('declined_by')}"):
                    continue
                report.check(f"{label}: served by {owner}", datas[0].get("provider") == owner,
                             f"provider={datas[0].get('provider')}")
                declined = request._zk_data.get("declined_by") or []
                report.check(f"{label}: the other side did not make it fail", declined in (
                    [], [our_pool["id"]], [np_pool["id"]]), f"{declined}")
                check_node_json(report, f"{label} node", datas[0], request.id, label)
                samples[label] = datas[0]
                request_samples[f"fulfilled by {owner}"] = dict(request._zk_data)
                k8s_checks(sim)(report, nodeset, stack.workdir)
                zuul.executor.returnNodeSet(nodeset, SimpleNamespace(uuid="b"), TENANT,
                                            PROJECT, 1.0)
            served_by: dict[str, int] = {}
            for _ in range(4):
                request, datas, _ = run_build(report, zuul, raw, ["shared"])
                report.check("shared: fulfilled", request.state == "fulfilled",
                             f"state={request.state}")
                if datas:
                    served_by[datas[0].get("provider")] = served_by.get(
                        datas[0].get("provider"), 0) + 1
            report.note(f"'shared' requests were served by: {served_by}")
            for preferred in ("np-k8s", "ours-k8s"):
                request, datas, _ = run_build(report, zuul, raw, ["shared"],
                                              provider=preferred)
                report.check(f"shared with Zuul's provider={preferred}: served by it",
                             request.state == "fulfilled" and datas
                             and datas[0].get("provider") == preferred,
                             f"state={request.state} "
                             f"provider={datas[0].get('provider') if datas else None}")
            for labels in (["np-only", "ours-only"], ["nobody-serves-this"]):
                request, datas, _ = run_build(report, zuul, raw, labels)
                declined = set(request._zk_data.get("declined_by") or [])
                report.check(f"{labels}: failed with nodes [] after both pools declined",
                             request.state == "failed" and request.nodes == []
                             and {np_pool["id"], our_pool["id"]} <= declined,
                             f"state={request.state} nodes={request.nodes} "
                             f"declined_by={sorted(declined)}")

        with report.section("request JSON written back by Nodepool 11 and by us"):
            theirs = request_samples.get("fulfilled by np-k8s")
            ours_r = request_samples.get("fulfilled by ours-k8s")
            if theirs and ours_r:
                report.check("fulfilled request: our JSON has every key Nodepool's has",
                             set(theirs) <= set(ours_r),
                             f"missing {sorted(set(theirs) - set(ours_r))}")
                report.check("fulfilled request: reuse/declined_by/nodes types match",
                             all(type(theirs.get(k)) is type(ours_r.get(k))
                                 for k in ("reuse", "declined_by", "nodes", "state_time")))

        with report.section("node JSON written by Nodepool 11 and by us"):
            if "np-only" in samples and "ours-only" in samples:
                compare_keys(report, "namespace node", samples["np-only"],
                             samples["ours-only"])
            if "np-pod" in samples and "ours-pod" in samples:
                compare_keys(report, "pod node", samples["np-pod"], samples["ours-pod"])

        with report.section("min-ready of both launchers coexists"):
            def spares(label: str) -> list[str]:
                out = []
                for node_id in raw.get_children("/nodepool/nodes"):
                    data = node_json(raw, node_id) or {}
                    if data.get("type") == [label] and data.get("state") in (
                            "ready", "building", "init"):
                        out.append(node_id)
                return out

            wait_for(lambda: len(spares("np-spare")) >= 1 and len(spares("ours-spare")) >= 1,
                     60, "one spare of each")
            time.sleep(3)
            report.check("exactly one ours-spare node (our min-ready, no duplicates)",
                         len(spares("ours-spare")) == 1, f"{spares('ours-spare')}")
            report.check("Nodepool's min-ready made its np-spare node",
                         len(spares("np-spare")) >= 1, f"{spares('np-spare')}")
            if len(spares("np-spare")) > 1:
                report.note(f"Nodepool over-provisioned np-spare ({len(spares('np-spare'))} "
                            "nodes): its own min-ready race (it counts ready nodes from a "
                            "cache that lags its de-allocation), not caused by us")

        # Hold one node of each side in use (Zuul has them locked) for the CLI and the
        # ownership phases.
        np_req, np_datas, (np_job, np_set, _) = run_build(report, zuul, raw, ["np-only"],
                                                          release=False)
        our_req, our_datas, (our_job, our_set, _) = run_build(report, zuul, raw, ["ours-only"],
                                                              release=False)
        np_node, our_node = np_req.nodes[0], our_req.nodes[0]
        np_ns, our_ns = np_datas[0].get("external_id"), our_datas[0].get("external_id")

        with report.section("each side's CLI on a tree with the other's nodes"):
            for sub in (["list"], ["list", "--detail"], ["request-list"]):
                result = run_cli([str(NP_CLI), "-c", str(both.np_config), *sub])
                report.check(f"Nodepool's `nodepool {' '.join(sub)}` exits 0",
                             result.returncode == 0, (result.stderr or result.stdout)[-600:])
                if sub[0] == "list":
                    report.check(f"Nodepool's `nodepool {' '.join(sub)}` shows our node",
                                 our_node in result.stdout, result.stdout[-600:])
                ours = run_cli(our_command("nodepool", "nodepool_k8s.cmd.nodepoolcmd")
                               + ["-c", str(both.ours_config), *sub])
                report.check(f"our `nodepool {' '.join(sub)}` exits 0", ours.returncode == 0,
                             (ours.stderr or ours.stdout)[-600:])
                if sub[0] == "list":
                    report.check(f"our `nodepool {' '.join(sub)}` shows Nodepool's node",
                                 np_node in ours.stdout, ours.stdout[-600:])

        with report.section("Nodepool leaves our nodes alone (our launcher stopped)"):
            assert both.ours is not None
            code = both.ours.stop(signal.SIGTERM)
            report.check("our launcher stopped (exit 0)", code == 0, f"exit {code}")
            our_spare = next(iter(spares("ours-spare")), None)
            spare_before = node_json(raw, our_spare) if our_spare else None
            zuul.executor.returnNodeSet(our_set, SimpleNamespace(uuid="c"), TENANT, PROJECT, 1)
            time.sleep(7)  # Nodepool's DeletedNodeWorker runs every 5 s
            data = node_json(raw, our_node) or {}
            report.check("our used, unlocked node is not deleted by Nodepool",
                         data.get("state") == "used", f"{data.get('state')}")
            report.check("its namespace still exists", sim.get("namespaces", our_ns) is not None)
            if our_spare:
                report.check("our ready spare node untouched by Nodepool",
                             node_json(raw, our_spare) == spare_before)
            failed_np, _, _ = run_build(report, zuul, raw, ["nobody-serves-this"])
            request_samples["failed by Nodepool alone"] = dict(failed_np._zk_data)
            both.start_ours()
            wait_for(lambda: raw.exists(f"/nodepool/nodes/{our_node}") is None, 40,
                     "our restarted launcher to delete its used node")
            report.check("our restarted launcher deleted its own used node", True)

        with report.section("we leave Nodepool's nodes alone (Nodepool stopped)"):
            assert both.np is not None
            code = both.np.stop(signal.SIGINT, timeout=30)
            report.check("Nodepool stopped on SIGINT", code is not None, f"exit {code}")
            np_spare = next(iter(spares("np-spare")), None)
            spare_before = node_json(raw, np_spare) if np_spare else None
            zuul.executor.returnNodeSet(np_set, SimpleNamespace(uuid="d"), TENANT, PROJECT, 1)
            time.sleep(7)  # our cleanup pass (2 s), deleter and leak sweep (2 s, grace 2 s)
            data = node_json(raw, np_node) or {}
            report.check("Nodepool's used, unlocked node is not deleted by us",
                         data.get("state") == "used", f"{data.get('state')}")
            report.check("its namespace survived our leak sweep",
                         sim.get("namespaces", np_ns) is not None)
            if np_spare:
                report.check("Nodepool's ready spare node untouched by us",
                             node_json(raw, np_spare) == spare_before)
            request, _, _ = run_build(report, zuul, raw, ["np-only"])
            report.check("with Nodepool gone, np-only fails (every registered pool declined)",
                         request.state == "failed" and request.nodes == [],
                         f"state={request.state}")
            theirs = request_samples.get("failed by Nodepool alone")
            ours_r = dict(request._zk_data)
            if theirs:
                report.check("failed request: our JSON has every key Nodepool's has",
                             set(theirs) <= set(ours_r),
                             f"missing {sorted(set(theirs) - set(ours_r))}")
                report.check("failed request: both write nodes [] and declined_by",
                             theirs.get("nodes") == [] == ours_r.get("nodes")
                             and theirs.get("declined_by") and ours_r.get("declined_by"))
            both.start_nodepool()
            wait_for(lambda: raw.exists(f"/nodepool/nodes/{np_node}") is None, 60,
                     "restarted Nodepool to delete its used node")
            report.check("restarted Nodepool deleted its own used node", True)

        with report.section("invariants over the whole run"):
            check_protocol_invariants(report, watcher, zuul_logs, raw)
            our_log = both.logs("ours-")
            bad = [ln for ln in our_log.splitlines() if " ERROR " in ln or "Traceback" in ln]
            report.check("our launcher logged no ERROR / traceback", not bad, "\n".join(bad[:5]))
            np_log = both.logs("nodepool-")
            np_bad = [ln for ln in np_log.splitlines()
                      if (" ERROR " in ln or "Traceback" in ln)
                      and not any(b in ln for b in NP_BENIGN_ERRORS)]
            report.check("Nodepool logged no ERROR / traceback", not np_bad,
                         "\n".join(np_bad[:8]))
            sampler.stop()
            np_ids, our_ids = sampler.ids_of("np-k8s"), sampler.ids_of("ours-k8s")
            in_our_log = set(re.findall(r"\[node: (\d{10})\]", our_log))
            report.check("our launcher never acted on a node of Nodepool's (log context)",
                         not (in_our_log & np_ids), f"{sorted(in_our_log & np_ids)}")
            in_np_log = set(re.findall(r"\[node: (\d{10})\]", np_log))
            report.check("Nodepool never acted on a node of ours (log context)",
                         not (in_np_log & our_ids), f"{sorted(in_np_log & our_ids)}")
            report.note(f"nodes seen: {len(np_ids)} of Nodepool's, {len(our_ids)} of ours")
            failed_min_ready = [ln for ln in np_log.splitlines()
                                if "min-ready node request failed" in ln
                                and our_pool["id"] in ln and np_pool["id"] not in ln]
            report.check("no min-ready request Nodepool created at start-up (before its "
                         "pools registered) was failed by our decline", not failed_min_ready,
                         "\n".join(failed_min_ready[:2])[:600])
    finally:
        logging.getLogger("zuul").removeHandler(zuul_logs)
        if zuul is not None:
            zuul.close()
        if args.keep:
            print(f"work dir kept: {stack.workdir}")
        stack.close()
    report.note("Nodepool 11 needs kubernetes<37 (37.x rejects its RoleBinding body); "
                "setup.sh pins it in the Nodepool env")
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
