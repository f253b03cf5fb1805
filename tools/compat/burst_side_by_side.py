#!/usr/bin/env python3
"""Burst latency of the real Nodepool 11 launcher and of ours, side by side (issue 15).

Run with the compat venv (tools/compat/setup.sh builds it, Nodepool in its own env):

    .compat-venv/bin/python tools/compat/burst_side_by_side.py [--sizes 30,200]
        [--order ours,floor,nodepool,ours] [--json FILE] [--keep] [--deadline 300]

One ZooKeeper (TLS, which Nodepool requires) and one Kubernetes API simulator with every
delay 0, in its own process, serve every side. The sides run one after the other, in the
order given (default: ours, the protocol floor, Nodepool, ours again), each in a fresh
ZooKeeper chroot with only that side's launcher running: Nodepool 11 serving the namespace
label `np-burst`, ours serving `ours-burst`, the protocol floor
(`nodepool_k8s.dev.testing.floor`: only the Nodepool protocol's ZooKeeper work per request,
no Kubernetes call; the bound any launcher's figures are compared with) serving
`floor-burst`, from configurations of the same shape (one kubernetes provider, one
pool, `max-servers: 1000`, unlimited launch concurrency, 3 launch attempts, no min-ready).

Per side: start the launcher, wait for its pool component, warm it up with one build, then
for each burst size N submit N one-node requests at once with Zuul 14.3.0's own scheduler
code (`Nodepool.requestNodes`, from a few threads released together) and time each request
from just before its submission until a data watch on its znode (armed asynchronously right
after the create) delivers `fulfilled` (or `failed`). Then do what Zuul does with every
result: the scheduler's NodesProvisionedEvent (Zuul's request cache puts it in the pipeline
result queue), `getNodeRequest` and `getNodesetInfo`; the executor's `acceptNodes`,
`useNodeSet` and `returnNodeSet` (a failed request is deleted by the scheduler); and wait
until every node znode is gone before the next size.

Reported per side and size: p50, p95 and max of request -> fulfilled, nodes/s (N over last
fulfilment - first submission), when the fulfilments happened relative to the first
submission, how far fulfilment order strayed from arrival order (`bench.order_figures`),
Kubernetes API calls per node (the simulator's counters), ours over the floor, and the ratio of
Nodepool's p50 to ours with issue 15's targets (burst 30: ours <= 1/10 of Nodepool's;
burst 200: <= 1/6). When our launcher runs more than once, the run with the higher p50
(the one less favourable to us) is compared; every run is listed.

Exit status 0 when every request of every run was fulfilled (missed targets are reported,
not failures), 1 otherwise, 3 when the global deadline passed (everything is stopped).
This script imports nodepool_k8s from its own checkout and runs our launcher and the
simulator from it too (PYTHONPATH), whatever the venv has installed.
"""

from __future__ import annotations

import argparse
import configparser
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))  # this checkout's nodepool_k8s, not the venv's editable one

from compat_lib import (NODEPOOL_ENV, ErrorLogCapture, Process, Report,  # noqa: E402
                        Stack, our_command, pool_components, wait_for)
from zuul_client_check import PIPELINE, PROJECT, TENANT, ZuulSide, make_job  # noqa: E402

from kazoo.client import KazooClient  # noqa: E402
from kazoo.exceptions import NoNodeError  # noqa: E402
from kazoo.protocol.states import EventType, WatchedEvent  # noqa: E402

from zuul import model as zmodel  # noqa: E402
from zuul.lib import tracing  # noqa: E402
from zuul.zk.vendor.client import ZuulKazooClient  # noqa: E402

import nodepool_k8s  # noqa: E402
from nodepool_k8s.dev.testing.bench import order_figures, percentile  # noqa: E402
from nodepool_k8s.dev.testing.loadtools import NodeWatcher  # noqa: E402
from nodepool_k8s.dev.testing.stack import ZERO_DELAYS, SimulatorProcess  # noqa: E402

NP_PYTHON = NODEPOOL_ENV / "bin" / "python"
NP_LAUNCHER = NODEPOOL_ENV / "bin" / "nodepool-launcher"
REQUESTS = "/nodepool/requests"
FINAL = ("fulfilled", "failed")
# issue 15: our p50 must be at most 1/target of Nodepool's.
TARGETS = {30: 10.0, 200: 6.0}
MAX_SERVERS = 1000

# Same shape for both; only names and each launcher's spelling of "unlimited" differ.
CONFIG = """
labels:
  - name: {label}
providers:
  - name: {provider}
    driver: kubernetes
    context: sim
    launch-retries: 3
    max-concurrency: {unlimited}
    pools:
      - name: {pool}
        max-servers: {max_servers}
        labels:
          - name: {label}
            type: namespace
"""

# What differs between the two runs, besides the code (printed and written to the JSON).
DIFFERENCES = [
    "max-concurrency: Nodepool -1, ours 0; each launcher's default, both mean unlimited. "
    "Nodepool starts one thread per node launch; ours runs launches on its launch pool "
    "(32 threads when unlimited, engine setting launch_workers)",
    "logging: both at INFO to a file (Nodepool -f, ours without -d)",
    "engine timings: each launcher's built-in defaults (no NODEPOOL_K8S_* overrides for "
    "ours); Nodepool's are fixed in its code (1 s pool loop, deleter every 5 s)",
    "ZooKeeper client: Nodepool 11 pins kazoo 2.9.0 (its own env), ours uses the compat "
    "venv's kazoo",
]


@dataclass(frozen=True)
class Side:
    key: str  # "nodepool" or "ours"
    title: str
    provider: str
    pool: str
    label: str
    unlimited: int

    def config(self) -> str:
        return CONFIG.format(label=self.label, provider=self.provider, pool=self.pool,
                             unlimited=self.unlimited, max_servers=MAX_SERVERS)


SIDES = {
    "nodepool": Side("nodepool", "Nodepool 11.0.0", "np-k8s", "npburst", "np-burst", -1),
    "ours": Side("ours", "nodepool_k8s", "ours-k8s", "oursburst", "ours-burst", 0),
    # The protocol floor (nodepool_k8s.dev.testing.floor): only the Nodepool protocol's
    # ZooKeeper work, no Kubernetes call; what any launcher's figures are bounded by.
    "floor": Side("floor", "protocol floor", "floor-k8s", "floorburst", "floor-burst", 0),
}


# -- measuring ----------------------------------------------------------------------------------

class RequestClock:
    """Submission and final-state times of requests, from one async data watch per request.

    `track` arms the watch with an asynchronous get right after the create, so submitting
    threads never wait for it; every change re-arms it until the state is final. The time
    taken is when the watch (or the first read) delivered the final state to this process,
    i.e. when a watching client such as Zuul's could learn of it."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self._lock = threading.Condition()
        self.submitted: dict[str, float] = {}
        self.final: dict[str, tuple[str, float]] = {}
        self.errors: list[str] = []
        self._retries: dict[str, int] = {}

    def track(self, request_id: str, submitted_at: float) -> None:
        with self._lock:
            self.submitted[request_id] = submitted_at
        self._read(request_id)

    def _read(self, request_id: str) -> None:
        result = self.client.get_async(f"{REQUESTS}/{request_id}", watch=self._on_watch)
        result.rawlink(partial(self._on_data, request_id))

    def _on_data(self, request_id: str, result: Any) -> None:
        now = time.monotonic()
        try:
            data, _ = result.get_nowait()
        except NoNodeError:
            self._finish(request_id, "deleted", now)
            return
        except Exception as exc:  # a hiccup: read again, a few times
            with self._lock:
                self.errors.append(f"{request_id}: {exc!r}")
                retries = self._retries[request_id] = self._retries.get(request_id, 0) + 1
            if request_id not in self.final and retries <= 3 and self.client.connected:
                self._read(request_id)
            return
        state = json.loads(data.decode("utf8")).get("state") if data else None
        if state in FINAL:
            self._finish(request_id, state, now)

    def _on_watch(self, event: WatchedEvent) -> None:
        now = time.monotonic()
        request_id = event.path.rsplit("/", 1)[-1]
        with self._lock:
            if request_id in self.final or request_id not in self.submitted:
                return
        if event.type == EventType.DELETED:
            self._finish(request_id, "deleted", now)
        else:
            self._read(request_id)

    def _finish(self, request_id: str, state: str, at: float) -> None:
        with self._lock:
            self.final.setdefault(request_id, (state, at))
            self._lock.notify_all()

    def wait(self, ids: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not ids <= set(self.final):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 1.0))
        return True


@dataclass
class Burst:
    side: str
    run: int  # position in --order, from 1
    size: int
    latencies: list[float] = field(default_factory=list)  # seconds, fulfilled requests
    completion_offsets: list[float] = field(default_factory=list)  # since first submission
    submit_span: float = 0.0
    window: float = 0.0  # last fulfilment - first submission
    fulfilled: int = 0
    failed: int = 0
    timed_out: int = 0
    zuul_events: int = 0
    api_calls: int | None = None
    api_by_kind: dict[str, int] = field(default_factory=dict)  # "verb resource" -> calls
    after_last_submit: int = 0  # fulfilments seen after the last submission
    order: dict[str, Any] = field(default_factory=dict)  # bench.order_figures

    def summary(self) -> dict[str, Any]:
        ms = [v * 1000 for v in self.latencies]
        offsets = [v * 1000 for v in self.completion_offsets]

        def r(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "p50_ms": r(percentile(ms, 50)), "p95_ms": r(percentile(ms, 95)),
            "max_ms": r(max(ms) if ms else None),
            "nodes_per_s": r(self.fulfilled / self.window if self.window > 0 else None, 2),
            "fulfilled": self.fulfilled, "failed": self.failed,
            "requests": self.size, "timed_out": self.timed_out, "run": self.run,
            "submit_span_ms": r(self.submit_span * 1000),
            "window_ms": r(self.window * 1000),
            "order": self.order,
            "fulfilled_at_ms": {"first": r(min(offsets) if offsets else None),
                                "p10": r(percentile(offsets, 10)),
                                "p50": r(percentile(offsets, 50)),
                                "p90": r(percentile(offsets, 90)),
                                "last": r(max(offsets) if offsets else None)},
            "fulfilled_after_last_submission": self.after_last_submit,
            "zuul_provisioned_events": self.zuul_events,
            "api_calls_per_node": r(self.api_calls / self.fulfilled
                                    if self.api_calls is not None and self.fulfilled
                                    else None),
            "api_calls_by_kind": dict(sorted(self.api_by_kind.items())),
        }


# -- one side -----------------------------------------------------------------------------------

class Phase:
    """One launcher run: its own chroot, launcher process, Zuul client pair and watches."""

    def __init__(self, stack: Stack, sim: SimulatorProcess, report: Report, side: Side,
                 run: int, submitters: int) -> None:
        self.stack = stack
        self.sim = sim
        self.report = report
        self.side = side
        self.run = run
        self.submitters = submitters
        self.chroot = stack.chroot()
        # Importing Zuul swaps kazoo's connection handler for its own, which expects its
        # client class on every connection that receives watch events.
        self.raw = ZuulKazooClient(hosts=stack.hosts(self.chroot, tls=False))
        self.raw.start(timeout=15)
        stack.kazoo_clients.append(self.raw)
        self.proc: Process | None = None
        self.zuul: ZuulSide | None = None
        self.clock = RequestClock(self.raw)
        self.nodes = NodeWatcher(self.raw)

    def start(self) -> None:
        name = f"{self.side.key}-{self.run}"
        config = self.stack.workdir / f"{name}.yaml"
        config.write_text(self.stack.zk_yaml(self.chroot, True) + "zookeeper-timeout: 10\n"
                          + self.side.config())
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("NODEPOOL_K8S_") and not k.startswith("STATSD_")}
        env["KUBECONFIG"] = str(self.stack.kubeconfig)
        env["STATE_DIRECTORY"] = self.stack.state_dir(self.chroot)
        if self.side.key == "nodepool":
            argv = [str(NP_LAUNCHER), "-f", "-c", str(config), "--no-webapp"]
        elif self.side.key == "floor":
            env["PYTHONPATH"] = str(REPO)
            argv = [sys.executable, "-m", "nodepool_k8s.dev.testing.floor", "-c", str(config)]
        else:
            env["PYTHONPATH"] = str(REPO)
            argv = our_command("nodepool-launcher", "nodepool_k8s.cmd.launcher") + [
                "-c", str(config), "--no-webapp"]
        self.proc = self.stack.process(name, argv, env=env, cwd=str(self.stack.workdir))
        proc = self.proc

        def registered() -> bool:
            if not proc.running:
                raise RuntimeError(f"{name} exited: {proc.log_tail()}")
            return any(c.get("provider_name") == self.side.provider
                       for c in pool_components(self.raw))

        wait_for(registered, 60, f"{self.side.title}'s pool component")
        self.zuul = ZuulSide(self.stack.hosts(self.chroot, True), self.stack.tls_files(),
                             self.report)
        zuul = self.zuul
        wait_for(lambda: zuul.sched.election_won, 20, "Zuul's nodepool event election")

    def burst(self, size: int, timeout: float) -> Burst:
        assert self.zuul is not None
        zuul = self.zuul
        result = Burst(self.side.key, self.run, size)
        counters_before = self.sim.counters()
        jobs = [make_job([self.side.label], name=f"burst-{i}") for i in range(size)]
        job_of: dict[str, SimpleNamespace] = {}
        go = threading.Barrier(self.submitters)
        lock = threading.Lock()
        failures: list[str] = []

        def submit(part: list[SimpleNamespace]) -> None:
            try:
                go.wait(30)
                for job in part:
                    at = time.monotonic()
                    request = zuul.request(job)
                    with lock:
                        job_of[request.id] = job
                    self.clock.track(request.id, at)
            except Exception as exc:
                with lock:
                    failures.append(repr(exc))

        threads = [threading.Thread(target=submit, args=(jobs[i::self.submitters],),
                                    name=f"submit-{i}") for i in range(self.submitters)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if failures:
            raise RuntimeError(f"submission failed: {failures[:3]}")
        ids = set(job_of)
        self.clock.wait(ids, timeout)
        starts = [self.clock.submitted[i] for i in ids]
        first, last_submit = min(starts), max(starts)
        result.submit_span = last_submit - first
        ends: list[float] = []
        for request_id in ids:
            state, at = self.clock.final.get(request_id, ("timed out", 0.0))
            if state == "fulfilled":
                result.fulfilled += 1
                result.latencies.append(at - self.clock.submitted[request_id])
                result.completion_offsets.append(at - first)
                ends.append(at)
                result.after_last_submit += at > last_submit
            elif state == "timed out":
                result.timed_out += 1
            else:
                result.failed += 1
        result.window = (max(ends) - first) if ends else 0.0
        result.order = order_figures([(i, self.clock.final[i][1]) for i in ids
                                      if self.clock.final.get(i, ("",))[0] == "fulfilled"])
        result.zuul_events = self._zuul_provisioned(
            {i for i in ids if self.clock.final.get(i, ("",))[0] in FINAL}, 30)
        self._finish_all(job_of)
        if not self.nodes.wait_empty(90):
            raise RuntimeError(f"nodes not deleted after 90 s: {self.nodes.count()} left")
        counters_after = self.sim.counters()
        # (The simulator does not count reads of its counters.)
        result.api_by_kind = {k: v - counters_before.get(k, 0)
                              for k, v in counters_after.items()
                              if k != "total" and v != counters_before.get(k, 0)}
        if "total" in counters_before and "total" in counters_after:
            result.api_calls = counters_after["total"] - counters_before["total"]
        return result

    def _zuul_provisioned(self, ids: set[str], timeout: float) -> int:
        """Ack the NodesProvisionedEvents Zuul's request cache queued (the scheduler's
        pipeline result queue); returns how many of `ids` had one."""
        assert self.zuul is not None
        queue = self.zuul.sched.pipeline_result_events[TENANT][PIPELINE]
        seen: set[str] = set()

        def drained() -> bool:
            for event in queue:
                if isinstance(event, zmodel.NodesProvisionedEvent):
                    seen.add(event.request_id)
                queue.ack(event)
            return ids <= seen

        try:
            wait_for(drained, timeout, "Zuul's NodesProvisionedEvents", 0.1)
        except TimeoutError:
            pass
        return len(ids & seen)

    def _finish_all(self, job_of: dict[str, SimpleNamespace]) -> None:
        """The scheduler's and the executor's handling of every request of the burst."""
        assert self.zuul is not None
        zuul = self.zuul

        def finish(item: tuple[str, SimpleNamespace]) -> None:
            request_id, job = item
            request = zuul.sched.zk_nodepool.getNodeRequest(request_id)
            if request is None:
                return
            if request.state not in FINAL:  # timed out: what Zuul does on a dequeue
                zuul.sched.cancelRequest(request)
                return
            zuul.sched.getNodesetInfo(request, job.nodeset)
            if request.state == zmodel.STATE_FAILED:
                zuul.sched.deleteNodeRequest(request.id, event_id=request.id)
                return
            nodeset, _ = zuul.accept(job, request_id)
            zuul.executor.useNodeSet(nodeset, TENANT, PROJECT)
            zuul.executor.returnNodeSet(nodeset, SimpleNamespace(uuid=uuid.uuid4().hex),
                                        TENANT, PROJECT, 1.0)

        with ThreadPoolExecutor(max_workers=4, thread_name_prefix="zuul-exec") as pool:
            list(pool.map(finish, list(job_of.items())))

    def stop(self) -> int | None:
        self.nodes.stop()
        if self.zuul is not None:
            self.zuul.close()
        if self.proc is None:
            return None
        # Nodepool stops on SIGINT (its exit handler), ours on SIGTERM.
        sig = signal.SIGINT if self.side.key == "nodepool" else signal.SIGTERM
        return self.proc.stop(sig, timeout=30)

    def log_problems(self) -> list[str]:
        text = self.proc.log_text() if self.proc else ""
        return [ln for ln in text.splitlines()
                if (" ERROR " in ln or "Traceback" in ln) and "Connection dropped" not in ln]


# -- reporting ----------------------------------------------------------------------------------

def machine_info(order: list[str]) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    np_version = subprocess.run([str(NP_PYTHON), "-c", "import importlib.metadata as m; "
                                 "print(m.version('nodepool'))"],
                                capture_output=True, text=True).stdout.strip()
    from importlib.metadata import version
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_at_start": list(os.getloadavg()),
            "nodepool_k8s": f"{nodepool_k8s.__version__} ({commit})",
            "nodepool_k8s_path": str(Path(nodepool_k8s.__file__).parent),
            "zuul": version("zuul"), "nodepool": np_version, "order": order,
            "simulator": "nodepool-k8s-sim in its own process, every delay 0",
            "zookeeper": "one server, TLS port for Zuul and both launchers"}


def pick(bursts: list[Burst]) -> Burst | None:
    """The run to compare: the one with the higher p50 (for ours: less favourable to us)."""
    done = [b for b in bursts if b.latencies]
    if not done:
        return bursts[0] if bursts else None
    return max(done, key=lambda b: percentile(b.latencies, 50) or 0.0)


def fmt(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def build_report(results: list[Burst], sizes: list[int]) -> dict[str, Any]:
    bursts: dict[str, Any] = {}
    for size in sizes:
        entry: dict[str, Any] = {}
        runs: dict[str, list[dict[str, Any]]] = {}
        for key in ("nodepool", "ours", "floor"):
            mine = [b for b in results if b.side == key and b.size == size]
            runs[key] = [b.summary() for b in mine]
            chosen = pick(mine)
            entry[key] = chosen.summary() if chosen else None
        np_p50 = (entry["nodepool"] or {}).get("p50_ms")
        our_p50 = (entry["ours"] or {}).get("p50_ms")
        entry["ratio_p50"] = round(np_p50 / our_p50, 2) if np_p50 and our_p50 else None
        target = TARGETS.get(size)
        entry["target_ratio"] = target
        entry["target_met"] = (entry["ratio_p50"] >= target
                               if target and entry["ratio_p50"] is not None else None)
        floor = entry.get("floor") or {}
        ours = entry["ours"] or {}
        entry["ours_over_floor"] = {
            key: (round(ours[key] / floor[key], 2) if ours.get(key) and floor.get(key)
                  else None)
            for key in ("p50_ms", "p95_ms", "window_ms")}
        entry["runs"] = runs
        bursts[str(size)] = entry
    return bursts


def print_table(results: list[Burst], bursts: dict[str, Any]) -> None:
    print("\n==== request -> fulfilled, per run (ms; 'fulfilled at' is since the first "
          "submission)")
    head = (f"{'size':>5} {'run':<16} {'p50':>8} {'p95':>8} {'max':>8} {'nodes/s':>8} "
            f"{'ok':>4} {'fail':>4} {'submit':>7} {'fulfilled at p10/p50/p90/last':>31} "
            f"{'API/n':>6}")
    print(head)
    for b in sorted(results, key=lambda b: (b.size, b.run)):
        s = b.summary()
        at = s["fulfilled_at_ms"]
        spread = "/".join(fmt(at[k], ".0f") for k in ("p10", "p50", "p90", "last"))
        name = f"{b.run}. {SIDES[b.side].title}"
        print(f"{b.size:>5} {name:<16} {fmt(s['p50_ms']):>8} {fmt(s['p95_ms']):>8} "
              f"{fmt(s['max_ms']):>8} {fmt(s['nodes_per_s']):>8} {s['fulfilled']:>4} "
              f"{s['failed'] + s['timed_out']:>4} {fmt(s['submit_span_ms'], '.0f'):>7} "
              f"{spread:>31} {fmt(s['api_calls_per_node']):>6}")
    biggest = max(b.size for b in results) if results else 0
    print(f"\n==== Kubernetes API calls per node by kind (burst {biggest}; includes deletion)")
    for b in sorted(results, key=lambda b: b.run):
        if b.size == biggest and b.fulfilled:
            kinds = ", ".join(f"{k} {v / b.fulfilled:.2f}"
                              for k, v in sorted(b.api_by_kind.items()))
            print(f"  {b.run}. {SIDES[b.side].title}: {kinds}")
    print("\n==== arrival order: requests that arrived later but were fulfilled first "
          "(p50/p95/max), rank shift spread")
    for b in sorted(results, key=lambda b: (b.size, b.run)):
        ov = b.order.get("overtaken") or {}
        print(f"{b.size:>5} {b.run}. {SIDES[b.side].title:<16} "
              f"{fmt(ov.get('p50'), '.0f')}/{fmt(ov.get('p95'), '.0f')}/"
              f"{fmt(ov.get('max'), '.0f')}, spread {fmt(b.order.get('shift_spread'), 'd')}")
    print("\n==== ours / the protocol floor (ours: the run with the higher p50)")
    for size, entry in bursts.items():
        r = entry["ours_over_floor"]
        print(f"  burst {size:>4}: p50 x{fmt(r['p50_ms'], '.2f')}, p95 "
              f"x{fmt(r['p95_ms'], '.2f')}, first submission -> last fulfilment "
              f"x{fmt(r['window_ms'], '.2f')}")
    print("\n==== Nodepool p50 / our p50 (ours: the run with the higher p50)")
    for size, entry in bursts.items():
        target = entry["target_ratio"]
        verdict = ("no target" if target is None else
                   "met" if entry["target_met"] else "MISSED")
        print(f"  burst {size:>4}: ratio {fmt(entry['ratio_p50'], '.2f')}"
              + (f" (target >= {target:g}): {verdict}" if target else f" ({verdict})"))


# -- main ---------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="30,200", help="burst sizes (default 30,200)")
    parser.add_argument("--order", default="ours,floor,nodepool,ours",
                        help="launcher runs, in order (default ours,floor,nodepool,ours; "
                             "floor: the protocol-only launcher, optional)")
    parser.add_argument("--submitters", type=int, default=4,
                        help="threads submitting each burst (default 4)")
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    parser.add_argument("--deadline", type=float, default=300.0,
                        help="global time limit in seconds (default 300)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    order = [s.strip() for s in args.order.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or any(s not in SIDES for s in order) \
            or not {"ours", "nodepool"} <= set(order) <= set(SIDES) or args.submitters < 1:
        parser.error("--sizes: positive integers; --order: both of 'ours' and 'nodepool', "
                     "and optionally 'floor'")
    if not NP_LAUNCHER.exists():
        print(f"{NP_LAUNCHER} missing: run tools/compat/setup.sh first")
        return 2
    logging.basicConfig(level=logging.CRITICAL)
    tracing.Tracing(configparser.ConfigParser())
    report = Report("burst latency: Nodepool 11 and nodepool_k8s side by side")
    started = time.monotonic()
    deadline_at = started + args.deadline
    stack = Stack(keep=args.keep)
    stack.install_guards(args.deadline)
    zuul_logs = ErrorLogCapture()
    logging.getLogger("zuul").addHandler(zuul_logs)
    machine = machine_info(order)
    print(f"nodepool_k8s {machine['nodepool_k8s']} from {machine['nodepool_k8s_path']}; "
          f"Nodepool {machine['nodepool']}; Zuul {machine['zuul']}; "
          f"{machine['cpus']} CPUs, load {machine['loadavg_at_start']}")
    print("settings that differ between the sides:")
    for text in DIFFERENCES:
        print(f"  - {text}")
    results: list[Burst] = []
    try:
        with report.section("start ZooKeeper (TLS) and the simulator (zero delays)"):
            stack.start_zookeeper()
            sim = stack.start_simulator_process(
                ZERO_DELAYS, env=dict(os.environ, PYTHONPATH=str(REPO)))
            report.check("ZooKeeper and simulator up", True)
        for run, key in enumerate(order, start=1):
            side = SIDES[key]
            phase = Phase(stack, sim, report, side, run, args.submitters)
            with report.section(f"run {run}: {side.title} alone, label {side.label}"):
                try:
                    phase.start()
                    report.check("launcher registered its pool; Zuul won its election", True)
                    warm = phase.burst(1, 60)
                    report.check(f"warm-up build fulfilled ({fmt(warm.summary()['p50_ms'])} "
                                 "ms)", warm.fulfilled == 1)
                    for size in sizes:
                        left = deadline_at - time.monotonic() - 20
                        if left <= 5:
                            report.fail(f"burst {size}", "no time left before the deadline")
                            continue
                        burst = phase.burst(size, min(left, 180.0))
                        results.append(burst)
                        s = burst.summary()
                        report.check(
                            f"burst {size}: every request fulfilled (p50 "
                            f"{fmt(s['p50_ms'])} ms, p95 {fmt(s['p95_ms'])} ms, "
                            f"{fmt(s['nodes_per_s'])} nodes/s)", burst.fulfilled == size,
                            f"fulfilled {burst.fulfilled}, failed {burst.failed}, "
                            f"timed out {burst.timed_out}")
                        report.check(f"burst {size}: Zuul's scheduler got a "
                                     "NodesProvisionedEvent for every request",
                                     burst.zuul_events == burst.fulfilled + burst.failed,
                                     f"{burst.zuul_events}")
                finally:
                    code = phase.stop()
                report.check("launcher stopped (exit 0)", code == 0, f"exit {code}")
                problems = phase.log_problems()
                if problems:
                    report.note(f"{side.title} logged {len(problems)} ERROR/traceback "
                                f"line(s), first: {problems[0][:200]}")
                if phase.clock.errors:
                    report.note(f"{len(phase.clock.errors)} watch read(s) retried: "
                                f"{phase.clock.errors[0]}")
        errors = zuul_logs.take()
        report.check("Zuul's code logged no errors", not errors, "; ".join(errors[:3]))
    finally:
        logging.getLogger("zuul").removeHandler(zuul_logs)
        if args.keep:
            print(f"work dir kept: {stack.workdir}")
        stack.close()
    bursts = build_report(results, sizes)
    print_table(results, bursts)
    machine["loadavg_at_end"] = list(os.getloadavg())
    machine["seconds"] = round(time.monotonic() - started, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": machine, "differences": DIFFERENCES, "bursts": bursts},
            indent=2) + "\n")
        print(f"JSON written to {args.json}")
    report.summary()
    expected = {(key, run, size) for run, key in enumerate(order, start=1) for size in sizes}
    complete = {(b.side, b.run, b.size) for b in results if b.fulfilled == b.size}
    return 0 if complete == expected else 1


if __name__ == "__main__":
    sys.exit(main())
