"""The system benchmark (`tools/benchmark`, or `python -m nodepool_k8s.dev.testing.bench`).

Owns: measuring nodepool-launcher as a whole system on the local stack (`stack.py`): a real
ZooKeeper, the Kubernetes API simulator in its own process, one or more real launcher
processes, and a load generator in this process that writes requests and handles nodes
exactly as Zuul does (`ZuulClient`: submit, watch, accept = lock + delete the request, use,
release), from several threads. What is measured and how is described in
doc/benchmark.md; in short:

- request -> fulfilled latency (submit until the request watch reports `fulfilled`) and
  throughput (nodes fulfilled per second), per label, with the simulator's delays zero and
  realistic; release -> node gone (the launcher removes the node after the namespace is
  gone);
- bursts (zero delays): N namespace requests submitted at once, latency and throughput as
  above plus how the fulfilments spread over the burst;
- cost per node: Kubernetes API calls (the simulator's `/debug/counters`), ZooKeeper write
  transactions (server zxid delta minus the load generator's own writes), ZooKeeper
  requests of the launcher sessions (`cons`: last client xid), launcher CPU and peak RSS
  (/proc);
- scale: 10,000 extra nodes, `nodepool list` wall time, launcher RSS, a new request's
  latency, a launcher's start-up time;
- several launchers on one provider quota: throughput, and the most nodes ever seen.

Exit status: 0 when every request was fulfilled and no quota was exceeded (missed
performance targets are reported, not failures); 1 otherwise; 130 on Ctrl-C. Everything
started is stopped, also on errors, Ctrl-C, SIGTERM and the `--timeout` watchdog.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import queue
import random
import re
import resource
import shlex
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from nodepool_k8s.dev.testing.stack import (REALISTIC_DELAYS, REPO, ZERO_DELAYS, LauncherProcess,
                                            SimDelays, SimulatorProcess, Stack, proc_stats,
                                            run_guarded)
from nodepool_k8s.views.listing import NODE_DETAIL_COLUMNS
from nodepool_k8s.dev.testing.zookeeper import free_port

BENCH_CONFIG = REPO / "etc" / "demo" / "benchmark.yaml"
PROVIDER = "k8s-bench"
OTHER_PROVIDER = "k8s-elsewhere"  # the provider of the scale phase's filler nodes
LABELS = ("namespace", "pod")

# Targets (zero simulator delay), see doc/benchmark.md.
TARGET_P50_MS = 50.0
TARGET_NODES_PER_S = 100.0
TARGET_LIST_S = 1.0
TARGET_LIST_NO_REGRESSION_S = 0.7  # issue 30: what the listing took when it was last met
TARGET_RSS_MIB = 150.0
TARGET_API_CALLS = 6.0
TARGET_ZK_WRITES = 8.0
TARGET_CPU_MS = 7.0             # launcher CPU ms per namespace node
TARGET_BURST = 200              # the burst the burst targets are about
TARGET_BURST_SPREAD = 0.75      # "p50 well below p95": p50 <= this x p95
TARGET_FLOOR_RATIO = 2.5        # burst duration <= this x the protocol floor's
# Burst size -> Nodepool 11's p50 divided by this is the target for ours (measured side by
# side by tools/compat/burst_side_by_side.py, read with --nodepool-burst).
NODEPOOL_BURST_DIVISORS = {30: 10, 200: 6}
# Soak: after SOAK_WARMUP_NODES, less than SOAK_TARGET_MIB of RSS over the next
# SOAK_TARGET_NODES nodes, and no new threads.
SOAK_WARMUP_NODES = 2000
SOAK_TARGET_NODES = 10000
SOAK_TARGET_MIB = 2.0
SOAK_LOCK_DIR_AGE = 30.0
PROFILE_HOOKS = REPO / "tools" / "profile"
SIDE_BY_SIDE = "tools/compat/burst_side_by_side.py"


class BenchFailed(Exception):
    pass


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# -- parameters -------------------------------------------------------------------------------

@dataclass
class Params:
    requests: int = 200             # per label, zero delays, at `concurrency`
    realistic_requests: int = 40    # per label, realistic delays
    serial: int = 20                # per label, zero delays, one at a time
    concurrency: int = 8            # builds in flight (load threads)
    sessions: int = 2               # ZooKeeper sessions the load threads share
    labels: list[str] = field(default_factory=lambda: list(LABELS))
    mix: list[tuple[list[str], int]] = field(default_factory=list)
    priorities: list[str] = field(default_factory=lambda: ["200"])
    profiles: list[str] = field(default_factory=lambda: ["zero", "realistic"])
    realistic: SimDelays = REALISTIC_DELAYS
    error_rate: float = 0.0
    max_concurrency: int = 10       # the provider's max-concurrency
    max_servers: int = 200          # the provider's quota in the latency runs
    burst: list[int] = field(default_factory=lambda: [30, 200])  # zero delays, namespace
    floor: bool = True              # the same bursts against the protocol-only launcher
    nodepool_burst: str | None = None  # the side-by-side tool's JSON (Nodepool targets)
    scale_nodes: int = 10000
    scale_requests: int = 10
    scale_loop_requests: int = 200  # closed loop among the scale nodes (0 skips it)
    launchers: list[int] = field(default_factory=lambda: [1, 2, 4])
    launcher_requests: int = 200
    launcher_concurrency: int = 16
    quota: int = 10                 # max-servers in the several-launchers runs
    timeout: float = 240.0
    quick: bool = False
    profile_dir: str | None = None  # py-spy profiles of the launchers, per run
    profile_idle: bool = False      # ... including waiting threads (wall time)
    soak_rounds: int = 0            # > 0: only the soak run (RSS and threads per round)
    soak_requests: int = 60         # namespace requests per soak round
    soak_warmup: int = SOAK_WARMUP_NODES  # nodes before the slope is measured
    soak_tracemalloc: int = 0       # > 0: the launcher's tracemalloc report every N rounds
    soak_memstats: int = 0          # > 0: its collector and pymalloc report every N rounds
    soak_memstats_collect: bool = False  # ... each with a forced full collection
    # The launcher's lock_dir_max_age in the soak (0: its default, 8 h): request-lock dirs
    # and the launcher's record of them live that long, so a soak shorter than the age
    # measures them filling up, not the steady state of a launcher that has run for days.
    soak_lock_dir_age: float = SOAK_LOCK_DIR_AGE
    webflood_nodes: int = 2000      # extra nodes for the web flood runs (0 skips them)
    webflood_requests: int = 100    # namespace builds per web flood run (idle, flooded)
    webflood_clients: int = 4       # threads flooding the status port

    @classmethod
    def quick_params(cls) -> "Params":
        return cls(requests=20, realistic_requests=6, serial=5, concurrency=4,
                   realistic=SimDelays(schedule=0.05, start=0.2, token=0.05,
                                       namespace_delete=0.1),
                   burst=[10, 30], scale_nodes=1000, scale_requests=3, scale_loop_requests=20,
                   launchers=[1, 2],
                   launcher_requests=20, launcher_concurrency=6, quota=4, timeout=120.0,
                   webflood_nodes=300, webflood_requests=15, quick=True)


def parse_mix(text: str) -> list[tuple[list[str], int]]:
    """`namespace=3,pod=1,namespace+pod=1`: node types of a request (joined by +) and a
    relative weight."""
    out: list[tuple[list[str], int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        types, _, weight = part.partition("=")
        out.append(([t for t in types.split("+") if t], int(weight or 1)))
    return out


def parse_delays(text: str, base: SimDelays) -> SimDelays:
    """`schedule=0.2,start=1,token=0.1,ns-delete=0.5,pod-delete=0,latency=0.005`."""
    names = {"schedule": "schedule", "start": "start", "token": "token",
             "ns-delete": "namespace_delete", "pod-delete": "pod_delete",
             "latency": "latency"}
    values = asdict(base)
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key not in names:
            raise argparse.ArgumentTypeError(f"unknown delay {key!r}: use {', '.join(names)}")
        values[names[key]] = float(value)
    return SimDelays(**values)


# -- measurements -----------------------------------------------------------------------------

def percentile(values: Sequence[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * pct / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(values_s: Sequence[float]) -> dict[str, float | None]:
    ms = [v * 1000.0 for v in values_s]
    return {"p50": _round(percentile(ms, 50)), "p95": _round(percentile(ms, 95)),
            "p99": _round(percentile(ms, 99)), "max": _round(max(ms) if ms else None),
            "count": len(ms)}


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


_CONS = re.compile(r"sid=0x([0-9a-f]+).*?lcxid=0x([0-9a-f]+)")
_ZXID = re.compile(r"Zxid: 0x([0-9a-f]+)")


@dataclass
class Snapshot:
    at: float
    zxid: int
    cxids: dict[int, int]
    api: dict[str, int]
    launcher_cpu: float
    launcher_peak_rss_kib: int
    sim_cpu: float
    zk_cpu: float
    own_cpu: float


class Meter:
    """Snapshots of everything the cost columns are computed from."""

    def __init__(self, stack: Stack, sim: SimulatorProcess, launchers: list[LauncherProcess],
                 sessions: list[int]) -> None:
        self.stack = stack
        self.sim = sim
        self.launchers = launchers
        self.sessions = set(sessions)

    def snapshot(self) -> Snapshot:
        srvr = self.stack.zk_four_letter("srvr")
        match = _ZXID.search(srvr)
        cxids: dict[int, int] = {}
        for sid, cxid in _CONS.findall(self.stack.zk_four_letter("cons")):
            if int(sid, 16) in self.sessions and cxid != "ffffffffffffffff":
                cxids[int(sid, 16)] = int(cxid, 16)
        cpu, peak = 0.0, 0
        for proc in self.launchers:
            stats = proc.stats()
            if stats is not None:
                cpu += stats.cpu_seconds
                peak = max(peak, stats.peak_rss_kib)
        sim = self.sim.stats()
        zk_pid = self.stack.zk.pid if self.stack.zk is not None else None
        zk = proc_stats(zk_pid) if zk_pid else None
        return Snapshot(at=time.monotonic(), zxid=int(match.group(1), 16) if match else 0,
                        cxids=cxids, api=self.sim.counters(), launcher_cpu=cpu,
                        launcher_peak_rss_kib=peak,
                        sim_cpu=sim.cpu_seconds if sim else 0.0,
                        zk_cpu=zk.cpu_seconds if zk else 0.0, own_cpu=time.process_time())


def costs(before: Snapshot, after: Snapshot, nodes: int, zuul_writes: int) -> dict[str, Any]:
    per = max(nodes, 1)
    api = {k: after.api.get(k, 0) - before.api.get(k, 0) for k in after.api}
    api = {k: v for k, v in api.items() if v}
    writes = after.zxid - before.zxid - zuul_writes
    requests = sum(after.cxids.get(s, 0) - before.cxids.get(s, 0) for s in after.cxids)
    return {
        "api_calls_per_node": _round(api.get("total", 0) / per, 2),
        "api_calls": api,
        "zk_writes_per_node": _round(writes / per, 2),
        "zk_reads_per_node": _round((requests - writes) / per, 2),
        "zk_launcher_requests": requests,
        "zk_launcher_writes": writes,
        "zk_loadgen_writes": zuul_writes,
        "launcher_cpu_ms_per_node": _round((after.launcher_cpu - before.launcher_cpu)
                                           * 1000.0 / per, 2),
        "launcher_cpu_s": _round(after.launcher_cpu - before.launcher_cpu, 2),
        "launcher_peak_rss_mib": _round(after.launcher_peak_rss_kib / 1024.0),
        "simulator_cpu_s": _round(after.sim_cpu - before.sim_cpu, 2),
        "zookeeper_cpu_s": _round(after.zk_cpu - before.zk_cpu, 2),
        "loadgen_cpu_s": _round(after.own_cpu - before.own_cpu, 2),
    }


# -- the load generator -----------------------------------------------------------------------

@dataclass
class Sample:
    types: list[str]
    priority: str
    request_id: str = ""
    submitted: float = 0.0
    created: float | None = None    # bursts: when ZooKeeper's answer to the create arrived
    seen_lag: float | None = None   # bursts: fulfilled write (mtime) -> seen by the watch
    fulfilled: float | None = None
    state: str | None = None
    nodes: list[str] = field(default_factory=list)
    released: float | None = None
    error: str | None = None


class Load:
    """Zuul-like builds from `concurrency` threads over a few shared ZooKeeper sessions."""

    def __init__(self, clients: list[Any], deadline: Callable[[], float]) -> None:
        self.clients = clients
        self.deadline = deadline
        self.zuul_writes = 0
        self._lock = threading.Lock()

    def _count(self, writes: int) -> None:
        with self._lock:
            self.zuul_writes += writes

    def build(self, zuul: Any, sample: Sample) -> None:
        from nodepool_k8s.dev.testing.loadtools import timed_wait
        sample.submitted = time.monotonic()
        sample.request_id = zuul.submit(sample.types, priority=sample.priority)
        self._count(1)
        body, at = timed_wait(zuul.client, sample.request_id, self.deadline())
        sample.state = body.get("state") if body else "deleted"
        if body is None or sample.state != "fulfilled":
            zuul.cancel(sample.request_id)  # Zuul deletes a failed request
            self._count(1)
            return
        sample.fulfilled = at
        self.finish(zuul, sample)

    def finish(self, zuul: Any, sample: Sample) -> None:
        """What Zuul does once a fulfilled request is seen: accept (lock the nodes, delete
        the request), use, release."""
        nodeset = zuul.accept(sample.request_id)
        self._count(1 + len(nodeset.nodes))  # request deletion, one lock per node
        sample.nodes = [h.id for h in nodeset.nodes]
        zuul.use(nodeset)
        sample.released = time.monotonic()
        zuul.release(nodeset)
        self._count(3 * len(nodeset.nodes))  # in-use, used, unlock

    def run(self, plan: list[Sample], concurrency: int) -> float:
        """Run every build of `plan`; returns the wall time."""
        work: queue.Queue[Sample] = queue.Queue()
        for sample in plan:
            work.put(sample)

        def worker(index: int) -> None:
            zuul = self.clients[index % len(self.clients)]
            while True:
                try:
                    sample = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    self.build(zuul, sample)
                except Exception as exc:
                    sample.error = f"{type(exc).__name__}: {exc}"

        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,), daemon=True,
                                    name=f"load-{i}") for i in range(max(1, concurrency))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, self.deadline()))
        if any(t.is_alive() for t in threads):
            raise BenchFailed("load threads did not finish before the deadline")
        return time.monotonic() - started

    def burst(self, plan: list[Sample], workers: int) -> float:
        """An open burst: every request of `plan` is created at once (pipelined creates from
        this thread, round robin over the sessions, bodies built beforehand), each one's
        final state seen by its own watch (`watch_final`, no thread per request); `workers`
        threads then accept, use and release each fulfilled request as Zuul does (or delete
        a failed one). Returns the wall time, first submission to the last release."""
        from nodepool_k8s.dev.testing.loadtools import watch_final
        finals: queue.Queue[Sample] = queue.Queue()
        claimed = handled = 0
        claim_lock = threading.Lock()

        def left() -> float:
            try:
                return max(0.0, self.deadline())
            except BenchFailed:
                return 0.0

        def on_final(sample: Sample, body: dict[str, Any] | None, at: float,
                     error: BaseException | None, lag: float | None) -> None:
            sample.state = body.get("state") if body else ("error" if error else "deleted")
            if sample.state == "fulfilled":
                sample.fulfilled = at
                sample.seen_lag = lag
            if error is not None:
                sample.error = f"{type(error).__name__}: {error}"
            finals.put(sample)

        def watch(sample: Sample, zuul: Any) -> None:
            try:
                watch_final(zuul.client, sample.request_id,
                            lambda body, at, error, lag: on_final(sample, body, at, error,
                                                                  lag))
            except Exception as exc:
                sample.error = f"{type(exc).__name__}: {exc}"
                finals.put(sample)

        # The watches of requests created while the loop below still submits are set
        # right after it, so that they do not compete with the submission.
        submitting = True
        deferred: list[tuple[Sample, Any]] = []
        defer_lock = threading.Lock()

        def on_created(sample: Sample, zuul: Any) -> Callable[[Any], None]:
            def created(result: Any) -> None:
                sample.created = time.monotonic()
                try:
                    sample.request_id = str(result.get()).rsplit("/", 1)[-1]
                except Exception as exc:
                    sample.error = f"{type(exc).__name__}: {exc}"
                    finals.put(sample)
                    return
                with defer_lock:
                    if submitting:
                        deferred.append((sample, zuul))
                        return
                watch(sample, zuul)
            return created

        def worker(index: int) -> None:
            nonlocal claimed, handled
            zuul = self.clients[index % len(self.clients)]
            while True:
                with claim_lock:
                    if claimed >= len(plan):
                        return
                    claimed += 1
                try:
                    sample = finals.get(timeout=left())
                except queue.Empty:
                    return
                with claim_lock:
                    handled += 1
                try:
                    if sample.state == "fulfilled":
                        self.finish(zuul, sample)
                    elif sample.request_id and sample.state != "deleted":
                        zuul.cancel(sample.request_id)  # Zuul deletes a failed request
                        self._count(1)
                except Exception as exc:
                    sample.error = f"{type(exc).__name__}: {exc}"

        threads = [threading.Thread(target=worker, args=(i,), daemon=True,
                                    name=f"burst-{i}") for i in range(max(1, workers))]
        for thread in threads:
            thread.start()
        clients = [self.clients[i % len(self.clients)] for i in range(len(plan))]
        bodies = [zuul.request_body(s.types) for zuul, s in zip(clients, plan)]
        started = time.monotonic()
        for zuul, sample, body in zip(clients, plan, bodies):
            sample.submitted = time.monotonic()
            zuul.submit_async(body, priority=sample.priority).rawlink(
                on_created(sample, zuul))
        with defer_lock:
            submitting = False
        for sample, zuul in deferred:
            watch(sample, zuul)
        self._count(len(plan))
        for thread in threads:
            thread.join(left())
        if any(t.is_alive() for t in threads) or handled < len(plan):
            raise BenchFailed("burst: not every request was final and handled before the "
                              "deadline")
        return time.monotonic() - started


def make_plan(types_weights: list[tuple[list[str], int]], priorities: list[str],
              count: int) -> list[Sample]:
    cycle = [types for types, weight in types_weights for _ in range(max(weight, 0))]
    return [Sample(list(cycle[i % len(cycle)]), priorities[i % len(priorities)])
            for i in range(count)]


def result_row(name: str, profile: str, label: str, concurrency: int, plan: list[Sample],
               wall: float, watcher: Any, cost: dict[str, Any]) -> dict[str, Any]:
    done = [s for s in plan if s.fulfilled is not None]
    nodes = sum(len(s.nodes) for s in done)
    latencies = [s.fulfilled - s.submitted for s in done if s.fulfilled is not None]
    cleanup = [watcher.gone[n] - s.released for s in done if s.released is not None
               for n in s.nodes if n in watcher.gone]
    span = (max(s.fulfilled for s in done if s.fulfilled is not None)
            - min(s.submitted for s in plan)) if done else 0.0
    by_priority: dict[str, Any] = {}
    for prio in sorted({s.priority for s in plan}):
        values = [s.fulfilled - s.submitted for s in done
                  if s.priority == prio and s.fulfilled is not None]
        by_priority[prio] = summary_ms(values)["p50"]
    errors = sorted({s.error for s in plan if s.error})
    return {
        "name": name, "profile": profile, "label": label, "concurrency": concurrency,
        "requests": len(plan), "fulfilled": len(done),
        "failed": sum(1 for s in plan if s.state == "failed"),
        "errors": len([s for s in plan if s.error]), "error_examples": errors[:3],
        "nodes": nodes, "wall_s": _round(wall, 2),
        "latency_ms": summary_ms(latencies), "p50_ms_by_priority": by_priority,
        "nodes_per_s": _round(nodes / span if span > 0 else 0.0, 1),
        "cleanup_ms": summary_ms(cleanup),
        **cost,
    }


def burst_figures(plan: list[Sample]) -> dict[str, Any]:
    """How a burst was submitted and how its fulfilments spread over it: submission and
    creation spans from the first submission, the burst's duration (first submission ->
    last fulfilment), p50 / p95 of request -> fulfilled, the share of fulfilments in the
    first half of the duration (about 0.5 when they come at a steady rate, near 0 when
    they bunch at the end), and how late the watches saw the fulfilments (from the
    request znode's mtime; ZooKeeper's clock has millisecond resolution)."""
    first = min(s.submitted for s in plan)
    created = [s.created for s in plan if s.created is not None]
    done = [s.fulfilled for s in plan if s.fulfilled is not None]
    latencies = [s.fulfilled - s.submitted for s in plan if s.fulfilled is not None]
    duration = max(done) - first if done else 0.0
    p50, p95 = percentile(latencies, 50), percentile(latencies, 95)
    return {
        "size": len(plan),
        "submit_span_ms": _round((max(s.submitted for s in plan) - first) * 1000.0, 2),
        "created_span_ms": _round((max(created) - first) * 1000.0, 2)
        if len(created) == len(plan) else None,
        "duration_ms": _round(duration * 1000.0, 1),
        "p50_over_p95": _round(p50 / p95, 3) if p50 is not None and p95 else None,
        "fulfilled_first_half": _round(sum(1 for t in done if t - first <= duration / 2)
                                       / len(done), 3) if done else None,
        "seen_lag_ms": summary_ms([s.seen_lag for s in plan if s.seen_lag is not None]),
        "order": order_figures([(s.request_id, s.fulfilled) for s in plan
                                if s.fulfilled is not None]),
    }


def order_figures(done: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """How far fulfilment order strays from arrival order, for `(request id, fulfilled at)`
    pairs. Arrival is ZooKeeper's order of the creates (the id's sequence number, which
    is all a launcher can know). Per request: `overtaken`, how many requests that arrived
    later were fulfilled before it (a request that waits for a whole batch of later ones
    has a large value); `shift`, its fulfilment rank minus its arrival rank (negative:
    served early). p50, p95 and max of each, plus the shift's spread (max - min)."""
    if not done:
        return {"overtaken": None, "shift": None, "shift_spread": None}
    by_arrival = sorted(done, key=lambda d: d[0].rsplit("-", 1)[-1])
    arrival = {rid: i for i, (rid, _) in enumerate(by_arrival)}
    by_fulfil = sorted(done, key=lambda d: (d[1], arrival[d[0]]))
    fulfil = {rid: i for i, (rid, _) in enumerate(by_fulfil)}
    overtaken = [sum(1 for later, _ in by_arrival[arrival[rid] + 1:]
                     if fulfil[later] < fulfil[rid]) for rid, _ in by_arrival]
    shift = [fulfil[rid] - arrival[rid] for rid, _ in by_arrival]

    def stats(values: list[int]) -> dict[str, float | None]:
        return {"p50": percentile(values, 50), "p95": percentile(values, 95),
                "max": float(max(values))}

    return {"overtaken": stats(overtaken), "shift": stats(shift),
            "shift_spread": max(shift) - min(shift)}


def floor_comparison(ours: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """A burst row's figures beside the protocol floor's for the same burst size."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return _round(a / b, 2) if a is not None and b else None

    o, f = ours["latency_ms"], floor["latency_ms"]
    od, fd = ours["burst"]["duration_ms"], floor["burst"]["duration_ms"]
    return {
        "floor_p50_ms": f["p50"], "floor_p95_ms": f["p95"],
        "floor_p50_over_p95": floor["burst"]["p50_over_p95"],
        "floor_duration_ms": fd, "floor_wall_s": floor["wall_s"],
        "floor_cpu_ms_per_node": floor["launcher_cpu_ms_per_node"],
        "floor_zk_writes_per_node": floor["zk_writes_per_node"],
        "floor_zk_reads_per_node": floor["zk_reads_per_node"],
        "p50_ratio": ratio(o["p50"], f["p50"]), "p95_ratio": ratio(o["p95"], f["p95"]),
        "duration_ratio": ratio(od, fd), "wall_ratio": ratio(ours["wall_s"], floor["wall_s"]),
    }


# -- profiling --------------------------------------------------------------------------------

class Profiler:
    """`py-spy record` attached to launcher processes for one run (raw collapsed stacks,
    per thread). Samples of waiting threads are left out, so it shows where the CPU goes;
    with `idle` they are kept, which shows where a thread waits (wall time). py-spy is not
    a dependency: `pip install py-spy` (or the `bench` extra) into the same environment."""

    def __init__(self, directory: str | None, idle: bool = False) -> None:
        self.directory = Path(directory) if directory else None
        self.idle = idle
        self.exe = Path(sys.executable).with_name("py-spy")
        if self.directory is not None and not self.exe.exists():
            raise BenchFailed(f"--profile needs py-spy: {self.exe} not found "
                              "(pip install py-spy)")

    def start(self, name: str, procs: list[LauncherProcess]) -> list[Any]:
        if self.directory is None:
            return []
        import subprocess
        self.directory.mkdir(parents=True, exist_ok=True)
        spies = []
        for proc in procs:
            out = self.directory / f"{name.replace('/', '_')}-{proc.name}.txt"
            spies.append((subprocess.Popen(
                [str(self.exe), "record", "--pid", str(proc.pid), "--format", "raw",
                 "--rate", "200", "--threads", "--nonblocking"]
                + (["--idle"] if self.idle else []) + ["--output", str(out)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True), out))
        time.sleep(0.3)  # let py-spy attach
        return spies

    def stop(self, spies: list[Any]) -> None:
        import signal as _signal
        for popen, out in spies:
            popen.send_signal(_signal.SIGINT)
        for popen, out in spies:
            try:
                popen.wait(30)
            except Exception:
                popen.kill()
            if out.exists():
                out.with_suffix(".summary.txt").write_text(profile_summary(out))


def profile_summary(path: Path, top: int = 25) -> str:
    """Busy samples per thread, and the functions with the most samples (inclusive) and
    the most own samples, over threads that were not idle."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        leaf = frames[-1]
        if any(word in leaf for word in ("wait (threading", "select (selectors",
                                         "_wait_for_tstate_lock", "get (queue",
                                         "accept (socket", "poll (selectors")):
            continue  # idle in a wait
        total += count
        threads[thread] = threads.get(thread, 0) + count
        own[leaf] = own.get(leaf, 0) + count
        for frame in set(frames[1:]):
            inclusive[frame] = inclusive.get(frame, 0) + count
    lines = [f"{path.name}: {total} busy samples"]
    lines.append("\nbusy samples by thread:")
    for name, count in sorted(threads.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"  {count:7d}  {name}")
    lines.append("\ninclusive:")
    for name, count in sorted(inclusive.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"  {count:7d}  {100.0 * count / max(total, 1):5.1f}%  {name}")
    lines.append("\nown:")
    for name, count in sorted(own.items(), key=lambda x: -x[1])[:top]:
        lines.append(f"  {count:7d}  {100.0 * count / max(total, 1):5.1f}%  {name}")
    return "\n".join(lines) + "\n"


# -- the benchmark ----------------------------------------------------------------------------

class Bench:
    def __init__(self, params: Params, stack: Stack) -> None:
        self.p = params
        self.stack = stack
        self.deadline_at = time.monotonic() + params.timeout
        self.results: dict[str, Any] = {"runs": [], "scale": None, "launchers": []}
        self.profiler = Profiler(params.profile_dir, params.profile_idle)

    def left(self, cap: float = 1e9) -> float:
        left = self.deadline_at - time.monotonic()
        if left <= 0:
            raise BenchFailed(f"the benchmark ran out of time ({self.p.timeout:g}s)")
        return min(cap, left)

    def env(self, max_servers: int) -> dict[str, str]:
        return {"NODEPOOL_BENCH_MAX_SERVERS": str(max_servers),
                "NODEPOOL_BENCH_MAX_CONCURRENCY": str(self.p.max_concurrency)}

    def launch(self, count: int, max_servers: int) -> tuple[str, list[LauncherProcess],
                                                            list[int]]:
        chroot = self.stack.new_chroot("bench")
        procs = [self.stack.start_launcher(chroot, BENCH_CONFIG, self.env(max_servers))
                 for _ in range(count)]
        sessions = self.stack.wait_launchers(chroot, count, timeout=self.left(90))
        return chroot, procs, sessions

    def clients(self, chroot: str) -> list[Any]:
        return [self.stack.zuul(chroot) for _ in range(max(1, self.p.sessions))]

    def stop(self, procs: list[LauncherProcess]) -> None:
        for proc in procs:
            code = proc.stop(30)
            if code != 0:
                raise BenchFailed(f"{proc.name} exited with {code}:\n{proc.log_tail()}")
            self.stack.launchers.remove(proc)

    def measured(self, name: str, profile: str, label: str, types: list[tuple[list[str], int]],
                 count: int, concurrency: int, meter: Meter, load: Load,
                 watcher: Any, burst: bool = False) -> dict[str, Any]:
        """One run: `count` builds with `concurrency` in flight (closed loop), or with
        `burst` all `count` requests submitted at once and `concurrency` load threads
        handling the fulfilled ones. It ends when every released node is gone."""
        plan = make_plan(types, self.p.priorities, count)
        if burst and not watcher.wait_empty(self.left(60)):
            raise BenchFailed(f"{name}: nodes of the previous run still there")
        load.zuul_writes = 0
        spies = self.profiler.start(name, meter.launchers)
        before = meter.snapshot()
        wall = load.burst(plan, concurrency) if burst else load.run(plan, concurrency)
        self.profiler.stop(spies)
        node_ids = [n for s in plan for n in s.nodes]
        if not watcher.wait_gone(node_ids, self.left(60)):
            raise BenchFailed(f"{name}: released nodes were not deleted in time")
        after = meter.snapshot()
        nodes = len(node_ids)
        # A burst has all of its requests in flight at once.
        row = result_row(name, profile, label, count if burst else concurrency, plan, wall,
                         watcher, costs(before, after, nodes, load.zuul_writes))
        lat = row["latency_ms"]
        log(f"{name}: {row['fulfilled']}/{row['requests']} fulfilled, p50 {lat['p50']} ms, "
            f"{row['nodes_per_s']} nodes/s, {row['api_calls_per_node']} API calls and "
            f"{row['zk_writes_per_node']} ZK writes per node")
        if burst:
            row["load_threads"] = concurrency
            row["burst"] = b = burst_figures(plan)
            log(f"{name}: submitted in {b['submit_span_ms']} ms (all created after "
                f"{b['created_span_ms']} ms), fulfilled over {b['duration_ms']} ms, p50/p95 "
                f"{b['p50_over_p95']}, {b['fulfilled_first_half']} of it in the first half")
        self.results["runs"].append(row)
        return row

    # -- phases ---------------------------------------------------------------------------
    def latency_phase(self, profile: str) -> None:
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher
        delays = ZERO_DELAYS if profile == "zero" else self.p.realistic
        log(f"profile {profile} ({delays.describe()}): starting the simulator and a launcher")
        sim = self.stack.start_simulator(delays, error_rate=self.p.error_rate)
        chroot, procs, sessions = self.launch(1, self.p.max_servers)
        clients = self.clients(chroot)
        watcher = NodeWatcher(clients[0].client)
        load = Load(clients, self.left)
        meter = Meter(self.stack, sim, procs, sessions)
        bursts = self.p.burst if profile == "zero" else []
        # Warm up every label once (connections, first-use imports, guard znodes); the
        # bursts are namespace requests.
        labels = list(self.p.labels) + (["namespace"] if bursts and "namespace" not in
                                        self.p.labels else [])
        warm = make_plan([([label], 1) for label in labels], ["200"], len(labels))
        load.run(warm, 1)
        watcher.wait_gone([n for s in warm for n in s.nodes], self.left(60))
        realistic = profile != "zero"
        for label in self.p.labels:
            if not realistic and self.p.serial > 0:
                self.measured(f"{profile}/{label}/serial", profile, label, [([label], 1)],
                              self.p.serial, 1, meter, load, watcher)
            count = self.p.realistic_requests if realistic else self.p.requests
            self.measured(f"{profile}/{label}", profile, label, [([label], 1)], count,
                          self.p.concurrency, meter, load, watcher)
        if self.p.mix and not realistic:
            self.measured(f"{profile}/mix", profile, "mix", self.p.mix, self.p.requests,
                          self.p.concurrency, meter, load, watcher)
        # Bursts last, on the warm launcher, each after the previous run's nodes are gone.
        for size in bursts:
            self.measured(f"{profile}/namespace/burst-{size}", profile, "namespace",
                          [(["namespace"], 1)], size, self.p.concurrency, meter, load,
                          watcher, burst=True)
        watcher.stop()
        for client in clients:
            client.close()
        self.stop(procs)
        if bursts and self.p.floor:
            self.floor_phase(sim, profile, bursts)

    def floor_phase(self, sim: SimulatorProcess, profile: str, sizes: list[int]) -> None:
        """The same bursts against the protocol-only launcher (`testing.floor`: Nodepool's
        mandatory ZooKeeper work and nothing else) on a fresh chroot, in the same harness;
        each burst row of the launcher gets the floor's figures beside its own."""
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher
        log("the protocol floor: the same bursts against a protocol-only launcher")
        chroot = self.stack.new_chroot("floor")
        proc = self.stack.start_floor(chroot, BENCH_CONFIG, self.env(self.p.max_servers))
        sessions = self.stack.wait_launchers(chroot, 1, timeout=self.left(60))
        clients = self.clients(chroot)
        watcher = NodeWatcher(clients[0].client)
        load = Load(clients, self.left)
        meter = Meter(self.stack, sim, [proc], sessions)
        warm = make_plan([(["namespace"], 1)], ["200"], 1)
        load.run(warm, 1)
        watcher.wait_gone([n for s in warm for n in s.nodes], self.left(60))
        runs = {r["name"]: r for r in self.results["runs"]}
        for size in sizes:
            name = f"{profile}/namespace/burst-{size}"
            row = self.measured(f"{name}/floor", profile, "namespace", [(["namespace"], 1)],
                                size, self.p.concurrency, meter, load, watcher, burst=True)
            row["floor"] = True
            if name in runs:
                runs[name]["vs_floor"] = floor_comparison(runs[name], row)
        watcher.stop()
        for client in clients:
            client.close()
        self.stop([proc])

    def launchers_phase(self) -> None:
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher
        sim = self.stack.start_simulator(ZERO_DELAYS, error_rate=self.p.error_rate)
        for count in self.p.launchers:
            log(f"{count} launcher(s) on one provider, max-servers {self.p.quota}")
            chroot, procs, sessions = self.launch(count, self.p.quota)
            clients = self.clients(chroot)
            watcher = NodeWatcher(clients[0].client)
            load = Load(clients, self.left)
            meter = Meter(self.stack, sim, procs, sessions)
            # Every launcher's pool registered and one request served before the meter
            # starts, as the floor's warm-up: what a launcher reads once at its start (the
            # other launchers' registrations and pools as they come up) is not a cost per
            # node, and with four launchers starting together most of it used to fall into
            # the measured run.
            self.stack.wait_pools(chroot, count, timeout=self.left(60))
            warm = make_plan([(["namespace"], 1)], ["200"], 1)
            load.run(warm, 1)
            watcher.wait_gone([n for s in warm for n in s.nodes], self.left(60))
            row = self.measured(f"launchers-{count}", "zero", "namespace",
                                [(["namespace"], 1)], self.p.launcher_requests,
                                self.p.launcher_concurrency, meter, load, watcher)
            self.results["runs"].remove(row)
            row.update(launchers=count, quota=self.p.quota, max_nodes_seen=watcher.max_nodes,
                       quota_held=watcher.max_nodes <= self.p.quota,
                       watch_samples=watcher.samples)
            self.results["launchers"].append(row)
            watcher.stop()
            for client in clients:
                client.close()
            self.stop(procs)

    def scale_phase(self) -> None:
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher, fill_nodes
        n = self.p.scale_nodes
        log(f"scale: {n} extra nodes")
        sim = self.stack.start_simulator(ZERO_DELAYS, error_rate=self.p.error_rate)
        chroot, procs, sessions = self.launch(1, self.p.max_servers)
        launcher = procs[0]
        clients = self.clients(chroot)
        zuul = clients[0]
        watcher = NodeWatcher(zuul.client)
        load = Load(clients, self.left)
        # One real node, to copy its record: what a ready namespace node looks like.
        request_id = zuul.submit(["namespace"])
        body, _ = _wait(zuul, request_id, self.left(30))
        nodeset = zuul.accept(request_id)
        template = dict(nodeset.nodes[0].data)
        zuul.use(nodeset)
        zuul.release(nodeset)
        watcher.wait_gone([h.id for h in nodeset.nodes], self.left(30))
        watcher.stop()
        base_rss = launcher.stats()
        spies = self.profiler.start("scale-fill", procs)
        started = time.monotonic()
        created = fill_nodes(zuul.client, filler_records(template, n))
        fill_s = time.monotonic() - started
        settle_s = wait_idle(launcher, self.left(60))
        self.profiler.stop(spies)
        listing: list[float] = []
        listing_cpu: list[float] = []
        rows = 0
        for _ in range(3):
            cpu = _children_cpu()
            done, wall = self.stack.nodepool(chroot, "list", config=BENCH_CONFIG,
                                             env=self.env(self.p.max_servers),
                                             timeout=self.left(60))
            listing_cpu.append(_children_cpu() - cpu)
            if done.returncode != 0:
                raise BenchFailed(f"nodepool list failed ({done.returncode}): "
                                  f"{done.stderr[-2000:]}")
            rows = sum(1 for line in done.stdout.splitlines()
                       if line.startswith("| ") and not line.startswith("| ID "))
            listing.append(wall)
        plan = make_plan([(["namespace"], 1)], ["200"], self.p.scale_requests)
        spies = self.profiler.start("scale-requests", procs)
        load.run(plan, 1)
        self.profiler.stop(spies)
        latencies = [s.fulfilled - s.submitted for s in plan if s.fulfilled is not None]
        if self.p.scale_loop_requests > 0:
            # What a large installation costs per node: every launch and deletion among
            # the scale nodes (caches of 10,000 nodes, quota sums over them).
            watcher = NodeWatcher(zuul.client)
            self.measured("zero/namespace/at-scale", "zero", "namespace",
                          [(["namespace"], 1)], self.p.scale_loop_requests,
                          self.p.concurrency, Meter(self.stack, sim, procs, sessions), load,
                          watcher)
            watcher.stop()
        stats = launcher.stats()
        # A launcher starting now syncs all of it before it serves.
        started = time.monotonic()
        extra = self.stack.start_launcher(chroot, BENCH_CONFIG, self.env(self.p.max_servers))
        self.stack.wait_launchers(chroot, 2, timeout=self.left(90))
        startup_s = time.monotonic() - started
        extra_stats = extra.stats()
        self.results["scale"] = {
            "nodes": created, "fill_s": _round(fill_s, 2),
            "record_bytes": len(json.dumps(template)),
            "launcher_settle_s": _round(settle_s, 2),
            "list_s": [_round(v, 3) for v in listing],
            "list_s_median": _round(statistics.median(listing), 3),
            "list_cpu_s_median": _round(statistics.median(listing_cpu), 3),
            "list_rows": rows,
            "fulfilled": len(latencies), "requests": len(plan),
            "latency_ms": summary_ms(latencies),
            "launcher_rss_mib_before": _round(base_rss.rss_kib / 1024.0) if base_rss else None,
            "launcher_rss_mib": _round(stats.rss_kib / 1024.0) if stats else None,
            "launcher_peak_rss_mib": _round(stats.peak_rss_kib / 1024.0) if stats else None,
            "new_launcher_startup_s": _round(startup_s, 2),
            "new_launcher_peak_rss_mib": _round(extra_stats.peak_rss_kib / 1024.0)
            if extra_stats else None,
        }
        s = self.results["scale"]
        log(f"scale: filled {created} nodes in {fill_s:.1f}s; nodepool list "
            f"{s['list_s_median']}s ({rows} rows); launcher RSS {s['launcher_rss_mib']} MiB "
            f"(peak {s['launcher_peak_rss_mib']}); new request p50 {s['latency_ms']['p50']} ms;"
            f" a new launcher ran after {startup_s:.1f}s")
        for client in clients:
            client.close()
        self.stop(procs + [extra])

    def webflood_phase(self) -> None:
        """Zuul's requests (namespace builds, closed loop) with the status port idle, then
        while clients flood it with distinct valid queries: what a hostile or careless
        status client costs request handling, and the launcher's memory."""
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher, fill_nodes
        n = self.p.webflood_nodes
        log(f"webflood: {n} extra nodes; {self.p.webflood_clients} clients flooding the "
            "status port with distinct queries")
        sim = self.stack.start_simulator(ZERO_DELAYS, error_rate=self.p.error_rate)
        chroot = self.stack.new_chroot("bench")
        port = free_port()
        proc = self.stack.start_launcher(
            chroot, BENCH_CONFIG, dict(self.env(self.p.max_servers),
                                       NODEPOOL_WEBAPP_PORT=str(port)), webapp=True)
        sessions = self.stack.wait_launchers(chroot, 1, timeout=self.left(90))
        clients = self.clients(chroot)
        zuul = clients[0]
        watcher = NodeWatcher(zuul.client)
        load = Load(clients, self.left)
        meter = Meter(self.stack, sim, [proc], sessions)
        request_id = zuul.submit(["namespace"])
        _wait(zuul, request_id, self.left(30))
        nodeset = zuul.accept(request_id)
        template = dict(nodeset.nodes[0].data)
        zuul.use(nodeset)
        zuul.release(nodeset)
        watcher.wait_gone([h.id for h in nodeset.nodes], self.left(30))
        fill_nodes(zuul.client, filler_records(template, n))
        wait_idle(proc, self.left(60))
        flood = WebFlood(port, n, self.p.webflood_clients)
        flood.probe_ready()
        before = proc.stats()
        idle = self.measured("zero/namespace/web-idle", "zero", "namespace",
                             [(["namespace"], 1)], self.p.webflood_requests,
                             self.p.concurrency, meter, load, watcher)
        flood.start()
        try:
            flooded = self.measured("zero/namespace/web-flood", "zero", "namespace",
                                    [(["namespace"], 1)], self.p.webflood_requests,
                                    self.p.concurrency, meter, load, watcher)
        finally:
            figures = flood.stop()
        after = proc.stats()
        self.results["webflood"] = w = {
            "nodes": n, "clients": self.p.webflood_clients, **figures,
            "idle_p50_ms": idle["latency_ms"]["p50"], "idle_p95_ms": idle["latency_ms"]["p95"],
            "flood_p50_ms": flooded["latency_ms"]["p50"],
            "flood_p95_ms": flooded["latency_ms"]["p95"],
            "launcher_rss_mib_before": _round(before.rss_kib / 1024.0) if before else None,
            "launcher_rss_mib_after": _round(after.rss_kib / 1024.0) if after else None,
        }
        log(f"webflood: request p50 {w['idle_p50_ms']} ms idle, {w['flood_p50_ms']} ms "
            f"under {w['flood_requests']} status requests ({w['flood_per_s']}/s, "
            f"{w['flood_errors']} errors); /ready max {w['ready_max_ms']} ms; RSS "
            f"{w['launcher_rss_mib_before']} -> {w['launcher_rss_mib_after']} MiB")
        watcher.stop()
        for client in clients:
            client.close()
        self.stop([proc])

    def soak_phase(self) -> None:
        """Rounds of namespace builds (optionally with API errors) against one launcher;
        after each round (every node released and deleted) its RSS and thread count, and
        with `soak_tracemalloc` the launcher's own report of where its memory grew."""
        from nodepool_k8s.dev.testing.loadtools import NodeWatcher
        p = self.p
        log(f"soak: {p.soak_rounds} rounds of {p.soak_requests} namespace requests, "
            f"{p.error_rate:.0%} of Kubernetes writes failing")
        sim = self.stack.start_simulator(ZERO_DELAYS, error_rate=p.error_rate)
        env = self.env(p.max_servers)
        if p.soak_lock_dir_age > 0:
            env["NODEPOOL_K8S_LOCK_DIR_MAX_AGE"] = f"{p.soak_lock_dir_age:g}"
        trace_prefix = self.stack.workdir / "tracemalloc"
        mem_prefix = self.stack.workdir / "memstats"
        if p.soak_memstats:
            env["NODEPOOL_K8S_PROFILE_MEMSTATS"] = str(mem_prefix)
            if p.soak_memstats_collect:
                env["NODEPOOL_K8S_PROFILE_MEMSTATS_COLLECT"] = "1"
        if p.soak_tracemalloc:
            env["NODEPOOL_K8S_PROFILE_TRACEMALLOC"] = str(trace_prefix)
        if p.soak_tracemalloc or p.soak_memstats:
            env["PYTHONPATH"] = os.pathsep.join(
                x for x in (str(PROFILE_HOOKS), os.environ.get("PYTHONPATH")) if x)
        chroot = self.stack.new_chroot("bench")
        procs = [self.stack.start_launcher(chroot, BENCH_CONFIG, env)]
        self.stack.wait_launchers(chroot, 1, timeout=self.left(90))
        clients = self.clients(chroot)
        watcher = NodeWatcher(clients[0].client)
        load = Load(clients, self.left)
        rounds: list[dict[str, Any]] = []
        traces: list[dict[str, Any]] = []
        memstats: list[dict[str, Any]] = []
        del sim
        nodes = 0
        for index in range(1, p.soak_rounds + 1):
            plan = make_plan([(["namespace"], 1)], p.priorities, p.soak_requests)
            load.run(plan, p.concurrency)
            node_ids = [n for s in plan for n in s.nodes]
            if not watcher.wait_gone(node_ids, self.left(120)):
                raise BenchFailed(f"soak round {index}: released nodes were not deleted")
            nodes += len(node_ids)
            wait_idle(procs[0], self.left(30))
            stats = proc_stats(procs[0].pid)
            row = {"round": index, "requests": len(plan), "nodes": nodes,
                   "fulfilled": sum(1 for s in plan if s.state == "fulfilled"),
                   "rss_mib": _round(stats.rss_kib / 1024 if stats else None, 1),
                   "rss_kib": stats.rss_kib if stats else None,
                   "threads": stats.threads if stats else None}
            rounds.append(row)
            log(f"soak round {index}: {row['fulfilled']}/{row['requests']} fulfilled, "
                f"{nodes} nodes, RSS {row['rss_mib']} MiB, {row['threads']} threads")
            if p.soak_tracemalloc and (index % p.soak_tracemalloc == 0 or index == 1
                                       or index == p.soak_rounds):
                traces.append(self.ask_tracemalloc(procs[0], trace_prefix, index))
            if p.soak_memstats and (index % p.soak_memstats == 0 or index == 1
                                    or index == p.soak_rounds):
                memstats.append(self.ask_tracemalloc(procs[0], mem_prefix, index))
                log(memstats_line(index, memstats[-1]))
        self.results["soak"] = soak_summary(rounds, p)
        if memstats:
            self.results["soak"]["memstats"] = memstats
        if traces:
            self.results["soak"]["tracemalloc"] = traces
            last = traces[-1]
            log("tracemalloc, growth since the first report:\n" + "\n".join(
                f"  {t['size_diff_kib']:+9.1f} KiB {t['count_diff']:+7d}  {t['where']}"
                for t in last["since_first"][:15]))
        watcher.stop()
        for client in clients:
            client.close()
        self.stop(procs)

    def ask_tracemalloc(self, proc: LauncherProcess, prefix: Path,
                        index: int) -> dict[str, Any]:
        """Ask the launcher (tools/profile's hook under `prefix`: tracemalloc or memstats)
        for its report; return it."""
        base = f"{prefix}.{proc.pid}"
        ask = Path(f"{base}.ask")
        ask.write_text(str(index))
        deadline = time.monotonic() + min(120.0, self.left(120))
        while ask.exists():
            proc.check_alive()
            if time.monotonic() > deadline:
                raise BenchFailed("the launcher did not answer the tracemalloc request "
                                  "(tools/profile on PYTHONPATH?)")
            time.sleep(0.1)
        lines = Path(f"{base}.jsonl").read_text().splitlines()
        report: dict[str, Any] = json.loads(lines[-1])
        return report

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.results["machine"] = machine()
        self.results["parameters"] = params_json(self.p)
        log("starting ZooKeeper")
        self.stack.start_zookeeper()
        if self.p.soak_rounds > 0:
            self.soak_phase()
            self.results["duration_s"] = _round(time.monotonic() - started, 1)
            self.results["targets"] = [self.results["soak"]["target"]]
            return self.results
        for profile in self.p.profiles:
            self.latency_phase(profile)
        if self.p.launchers:
            self.launchers_phase()
        if self.p.scale_nodes > 0:
            self.scale_phase()
        if self.p.webflood_nodes > 0:
            self.webflood_phase()
        self.results["duration_s"] = _round(time.monotonic() - started, 1)
        if self.p.nodepool_burst:
            self.results["nodepool_burst"] = read_nodepool_burst(self.p.nodepool_burst)
        self.results["targets"] = targets(self.results)
        return self.results


class WebFlood:
    """Clients sending the status port distinct valid queries back to back (node ids,
    column orders, both formats, event filters, /metrics), and a probe timing `/ready`."""

    def __init__(self, port: int, nodes: int, clients: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.nodes = max(1, nodes)
        self.clients = clients
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.requests = 0
        self.errors = 0
        self.ready_ms: list[float] = []
        self._started = 0.0

    def _get(self, path: str, accept: str | None = None) -> int:
        request = urllib.request.Request(self.base + path,
                                         headers={"Accept": accept} if accept else {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
                return int(response.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    def probe_ready(self) -> None:
        deadline = time.monotonic() + 30
        while self._get("/metrics") != 200:
            if time.monotonic() > deadline:
                raise BenchFailed("the launcher's web app did not answer /metrics")
            time.sleep(0.2)

    def _query(self, rng: random.Random, index: int) -> tuple[str, str | None]:
        kind = index % 5
        accept = "application/json" if rng.random() < 0.5 else None
        if kind == 0:
            return f"/node-list?node_id={9_000_000_000 + rng.randrange(self.nodes)}", accept
        if kind == 1:
            keys = [key for _, key in NODE_DETAIL_COLUMNS]
            return "/node-list?fields=" + ",".join(rng.sample(keys, 5)), accept
        if kind == 2:
            return f"/events?since={rng.randrange(1, 10**6)}", accept
        if kind == 3:
            return "/metrics", None
        return f"/request-list?fields={','.join(rng.sample(['id', 'state', 'nodes'], 2))}", \
            accept

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        index = 0
        while not self._stop.is_set():
            path, accept = self._query(rng, index)
            index += 1
            try:
                ok = self._get(path, accept) == 200
            except OSError:
                ok = False
            with self._lock:
                self.requests += 1
                self.errors += 0 if ok else 1

    def _probe(self) -> None:
        while not self._stop.wait(0.5):
            started = time.monotonic()
            try:
                self._get("/ready")
            except OSError:
                pass
            self.ready_ms.append((time.monotonic() - started) * 1000.0)

    def start(self) -> None:
        self._started = time.monotonic()
        self._threads = [threading.Thread(target=self._client, args=(seed,), daemon=True)
                         for seed in range(self.clients)]
        self._threads.append(threading.Thread(target=self._probe, daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        elapsed = max(1e-9, time.monotonic() - self._started)
        return {"flood_requests": self.requests, "flood_errors": self.errors,
                "flood_per_s": _round(self.requests / elapsed, 1),
                "ready_p50_ms": _round(percentile(self.ready_ms, 50)),
                "ready_max_ms": _round(max(self.ready_ms, default=0.0))}


def _wait(zuul: Any, request_id: str, timeout: float) -> tuple[dict[str, Any], float]:
    from nodepool_k8s.dev.testing.loadtools import timed_wait
    body, at = timed_wait(zuul.client, request_id, timeout)
    if body is None or body.get("state") != "fulfilled":
        raise BenchFailed(f"request {request_id} was not fulfilled: {body}")
    return body, at


def filler_records(template: dict[str, Any], count: int) -> Any:
    """`count` ready, unallocated namespace nodes of a provider this launcher does not
    serve, shaped exactly like `template` (a real node record)."""
    now = time.time()
    for index in range(count):
        node_id = f"{9_000_000_000 + index:010d}"
        name = f"main-{node_id}"
        record = dict(template)
        port = dict(template.get("connection_port") or {})
        port.update(name=name, namespace=name)
        record.update(provider=OTHER_PROVIDER, allocated_to=None, state="ready",
                      state_time=now, created_time=now, external_id=name,
                      connection_port=port, ssh_port=port, requestor=None,
                      launcher="elsewhere-PoolWorker.k8s-elsewhere-main")
        record.pop("id", None)
        yield node_id, record


def _children_cpu() -> float:
    """CPU seconds of this process's waited-for children (the `nodepool` CLI runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_idle(proc: LauncherProcess, timeout: float, window: float = 0.5,
              threshold: float = 0.05) -> float:
    """Wait until the process used less than `threshold` CPU seconds in `window`."""
    started = time.monotonic()
    last = proc.stats()
    while time.monotonic() - started < timeout:
        time.sleep(window)
        now = proc.stats()
        if last is None or now is None:
            break
        if now.cpu_seconds - last.cpu_seconds < threshold:
            break
        last = now
    return time.monotonic() - started


# -- reporting --------------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "memory_gib": round(mem_kib / 1024 / 1024, 1),
            "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"),
            "command": "tools/benchmark " + " ".join(shlex.quote(a) for a in sys.argv[1:])}


def params_json(p: Params) -> dict[str, Any]:
    data = asdict(p)
    data["realistic"] = asdict(p.realistic)
    data["mix"] = ["+".join(t) + f"={w}" for t, w in p.mix]
    return data


def read_nodepool_burst(path: str) -> dict[str, Any]:
    """The figures of `tools/compat/burst_side_by_side.py`'s JSON (`{"bursts": {"30":
    {"nodepool": {"p50_ms": ..}, "ours": {"p50_ms": ..}}}}`), tolerantly: a burst size
    whose two p50s are not both there (numbers, Nodepool's > 0) is left out, an unreadable
    file gives an `error`; never raises."""
    out: dict[str, Any] = {"file": path, "bursts": {}, "error": None}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        out["error"] = f"unreadable ({type(exc).__name__}: {exc})"
        return out
    bursts = data.get("bursts") if isinstance(data, dict) else None
    if not isinstance(bursts, dict):
        out["error"] = 'no "bursts" object'
        return out
    for size, sides in bursts.items():
        ours, theirs = _side_p50(sides, "ours"), _side_p50(sides, "nodepool")
        if ours is not None and theirs is not None and theirs > 0:
            out["bursts"][str(size)] = {"ours_p50_ms": ours, "nodepool_p50_ms": theirs}
    return out


def _side_p50(sides: Any, key: str) -> float | None:
    side = sides.get(key) if isinstance(sides, dict) else None
    value = side.get("p50_ms") if isinstance(side, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def memstats_line(index: int, mem: dict[str, Any]) -> str:
    """One line of the launcher's memstats report (tools/profile) for the log."""
    malloc, libc = mem["malloc"], mem.get("libc") or {}
    line = (f"memstats round {index}: gc objects by generation {mem['gc_objects']}, full "
            f"collections {mem['collections'][2]} (freed {mem['collected'][2]} objects); "
            f"pymalloc arenas {malloc.get('arenas allocated current')}, in use "
            f"{malloc.get('bytes in allocated blocks', 0) // 1024} KiB, free "
            f"{malloc.get('bytes in available blocks', 0) // 1024} KiB; libc heap "
            f"{libc.get('heap_kib')} KiB, in use {libc.get('in_use_kib')} KiB, free "
            f"{libc.get('free_kib')} KiB, mmapped {libc.get('mmapped_kib')} KiB; resident "
            "KiB by mapping " + ", ".join(f"{k} {v}" for k, v in
                                          sorted((mem.get("smaps") or {}).items()) if v))
    if mem.get("largest"):
        line += "; largest: " + ", ".join(
            f"{b['type']}[{b['len']}] {b['kib']} KiB ({b['held_by']})" for b in mem["largest"][:6])
    garbage = mem.get("garbage")
    if garbage:
        line += (f"; forced collection found {garbage['found']} objects, RSS "
                 f"{garbage['rss_before_kib']} -> {garbage['rss_after_kib']} KiB")
    return line


def soak_summary(rounds: list[dict[str, Any]], p: Params) -> dict[str, Any]:
    """The soak's figures: RSS slope (KiB per node, least squares over the rounds after
    `soak_warmup` nodes), its projection over SOAK_TARGET_NODES, and threads added after the
    warm-up; with the target judged (None when too few rounds follow the warm-up)."""
    after = [r for r in rounds if r["nodes"] >= p.soak_warmup and r["rss_kib"] is not None]
    slope = None
    if len(after) >= 3:
        xs = [float(r["nodes"]) for r in after]
        ys = [float(r["rss_kib"]) for r in after]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        var = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else None
    measured = after[-1]["nodes"] - after[0]["nodes"] if after else 0
    projected = slope * SOAK_TARGET_NODES / 1024 if slope is not None else None
    threads = [r["threads"] for r in after if r["threads"] is not None]
    new_threads = max(threads) - threads[0] if threads else None
    met = (projected < SOAK_TARGET_MIB and new_threads == 0
           if projected is not None and new_threads is not None else None)
    half = rounds[len(rounds) // 2:]
    return {
        "rounds": rounds, "requests_per_round": p.soak_requests, "error_rate": p.error_rate,
        "warmup_nodes": p.soak_warmup,
        "lock_dir_max_age_s": p.soak_lock_dir_age or None,
        "measured_nodes": measured,
        "rss_mib_after_warmup": after[0]["rss_mib"] if after else None,
        "rss_mib_last": after[-1]["rss_mib"] if after else None,
        "rss_growth_measured_mib": _round((after[-1]["rss_kib"] - after[0]["rss_kib"]) / 1024,
                                          2) if after else None,
        "slope_kib_per_node": _round(slope, 3) if slope is not None else None,
        # The slope over SOAK_TARGET_NODES: measured when the run was that long, else an
        # extrapolation (`measured_nodes` says over how many nodes the slope was fitted).
        "projected_mib_per_target_nodes": _round(projected, 2) if projected is not None
        else None,
        "threads_after_warmup": threads[0] if threads else None,
        "new_threads_after_warmup": new_threads,
        "target": {"name": f"soak: RSS over {SOAK_TARGET_NODES:,} nodes after "
                           f"{p.soak_warmup:,} of warm-up, new threads",
                   "target": f"< {SOAK_TARGET_MIB:g} MiB, 0",
                   "value": None if projected is None else
                   f"{projected:.2f} MiB, {new_threads}",
                   "met": met,
                   **({"note": f"extrapolated from {measured:,} measured nodes"}
                      if 0 < measured < SOAK_TARGET_NODES else {}),
                   **({} if after else {"note": "no round after the warm-up"})},
        # Growth over the second half: what is left once caches and pools are warm.
        "rss_growth_second_half_mib": _round(
            (half[-1]["rss_mib"] or 0) - (half[0]["rss_mib"] or 0), 1) if half else None,
        "thread_growth_second_half": (half[-1]["threads"] or 0) - (half[0]["threads"] or 0)
        if half else None,
    }


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The performance targets: met True/False, or None with a `note` when not measured."""
    runs = {r["name"]: r for r in results["runs"]}
    out: list[dict[str, Any]] = []

    def add(name: str, target: str, value: Any, met: bool | None,
            note: str | None = None) -> None:
        row = {"name": name, "target": target, "value": value, "met": met}
        if note:
            row["note"] = note
        out.append(row)

    serial = runs.get("zero/namespace/serial") or runs.get("zero/namespace")
    if serial:
        p50 = serial["latency_ms"]["p50"]
        add("namespace request -> fulfilled p50 (zero delay, one at a time)",
            f"<= {TARGET_P50_MS:g} ms", p50, p50 is not None and p50 <= TARGET_P50_MS)
    loaded = runs.get("zero/namespace")
    burst_name = f"zero/namespace/burst-{TARGET_BURST}"
    burst = runs.get(burst_name)
    no_burst = f"not measured (no {burst_name} run: --burst {TARGET_BURST})"
    if loaded:
        add(f"namespace nodes per second, one launcher, closed loop (zero/namespace, "
            f"{loaded['concurrency']} in flight)", f">= {TARGET_NODES_PER_S:g}",
            loaded["nodes_per_s"], loaded["nodes_per_s"] >= TARGET_NODES_PER_S)
    add(f"namespace nodes per second, one launcher, burst of {TARGET_BURST} ({burst_name})",
        f">= {TARGET_NODES_PER_S:g}", burst["nodes_per_s"] if burst else None,
        burst["nodes_per_s"] >= TARGET_NODES_PER_S if burst else None,
        None if burst else no_burst)
    spread = burst["burst"]["p50_over_p95"] if burst else None
    add(f"burst-{TARGET_BURST} p50 well below p95 (p50 / p95 of request -> fulfilled)",
        f"<= {TARGET_BURST_SPREAD:g}", spread,
        spread is not None and spread <= TARGET_BURST_SPREAD if burst else None,
        None if burst else no_burst)
    vs_floor = burst.get("vs_floor") if burst else None
    ratio = vs_floor["duration_ratio"] if vs_floor else None
    add(f"burst-{TARGET_BURST} fulfilled within {TARGET_FLOOR_RATIO:g}x the protocol floor's "
        "time (first submission -> last fulfilment, same harness)",
        f"<= {TARGET_FLOOR_RATIO:g}", ratio,
        ratio <= TARGET_FLOOR_RATIO if ratio is not None else None,
        None if ratio is not None else
        (no_burst if not burst else "not measured (--no-floor)"))
    if loaded:
        add("launcher CPU ms per namespace node, closed loop (zero/namespace)",
            f"<= {TARGET_CPU_MS:g}", loaded["launcher_cpu_ms_per_node"],
            loaded["launcher_cpu_ms_per_node"] <= TARGET_CPU_MS)
    add(f"launcher CPU ms per namespace node, burst of {TARGET_BURST} ({burst_name})",
        f"<= {TARGET_CPU_MS:g}", burst["launcher_cpu_ms_per_node"] if burst else None,
        burst["launcher_cpu_ms_per_node"] <= TARGET_CPU_MS if burst else None,
        None if burst else no_burst)
    if loaded:
        # "About": half a call or write per node of slack (a retried write, a lost race).
        add("Kubernetes API calls per namespace node", f"<= ~{TARGET_API_CALLS:g}",
            loaded["api_calls_per_node"],
            loaded["api_calls_per_node"] <= TARGET_API_CALLS + 0.5)
        add("ZooKeeper writes per namespace node (launcher)", f"<= ~{TARGET_ZK_WRITES:g}",
            loaded["zk_writes_per_node"],
            loaded["zk_writes_per_node"] <= TARGET_ZK_WRITES + 0.5)
    side = results.get("nodepool_burst") or {}
    for size, divisor in NODEPOOL_BURST_DIVISORS.items():
        name = f"burst-{size} p50 <= 1/{divisor} of Nodepool 11's (side by side)"
        target = f"<= {1 / divisor:.3g} x Nodepool 11's p50"
        figures = side.get("bursts", {}).get(str(size))
        if figures:
            ours, theirs = figures["ours_p50_ms"], figures["nodepool_p50_ms"]
            add(name, target, round(ours / theirs, 3), ours <= theirs / divisor,
                f"ours {ours:g} ms vs Nodepool 11 {theirs:g} ms, both measured in one run of "
                f"{SIDE_BY_SIDE} ({side['file']}), not in this benchmark")
        else:
            why = (f": {side['file']}: {side['error'] or f'no p50_ms of both sides for {size}'}"
                   if side else "")
            add(name, target, None, None, f"not measured (run {SIDE_BY_SIDE}){why}")
    scale = results.get("scale")
    if scale:
        nodes = scale["nodes"]
        add(f"nodepool list over {nodes} nodes (median wall time)", f"< {TARGET_LIST_S:g} s",
            scale["list_s_median"], scale["list_s_median"] < TARGET_LIST_S)
        add(f"nodepool list over {nodes} nodes, no regression (issue 30)",
            f"< {TARGET_LIST_NO_REGRESSION_S:g} s", scale["list_s_median"],
            scale["list_s_median"] < TARGET_LIST_NO_REGRESSION_S)
        add(f"launcher peak RSS with {nodes} nodes", f"< {TARGET_RSS_MIB:g} MiB",
            scale["launcher_peak_rss_mib"],
            scale["launcher_peak_rss_mib"] is not None
            and scale["launcher_peak_rss_mib"] < TARGET_RSS_MIB)
    for row in results.get("launchers", []):
        add(f"{row['launchers']} launcher(s): provider max-servers held",
            f"<= {row['quota']} nodes", row["max_nodes_seen"], row["quota_held"])
    return out


def failures(results: dict[str, Any], params: Params) -> list[str]:
    problems = []
    for row in results["runs"] + results.get("launchers", []):
        if row["fulfilled"] != row["requests"] and params.error_rate == 0:
            problems.append(f"{row['name']}: {row['fulfilled']} of {row['requests']} requests "
                            f"fulfilled {row['error_examples']}")
        if row.get("quota_held") is False:
            problems.append(f"{row['name']}: {row['max_nodes_seen']} nodes seen, quota "
                            f"{row['quota']}")
    scale = results.get("scale")
    if scale and scale["fulfilled"] != scale["requests"]:
        problems.append("scale: a request was not fulfilled")
    soak = results.get("soak")
    if soak and params.error_rate == 0:
        problems += [f"soak round {r['round']}: {r['fulfilled']} of {r['requests']} fulfilled"
                     for r in soak["rounds"] if r["fulfilled"] != r["requests"]]
    return problems


def _fmt(value: Any) -> str:
    return "-" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def table(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [f"nodepool_k8s benchmark: {m['nproc']} CPUs, {m['memory_gib']} GiB, Python "
             f"{m['python']}, {m['date']}, load average at start "
             f"{' '.join(str(x) for x in m['loadavg_at_start'])}",
             f"command: {m['command']}   ({results.get('duration_s')} s)", ""]
    head = ("run", "conc", "reqs", "nodes", "p50ms", "p95ms", "p99ms", "nodes/s", "clean50",
            "clean95", "API/n", "ZKw/n", "ZKr/n", "CPUms/n", "RSS MiB")
    rows = [head]
    if results.get("soak") and not results["runs"]:
        rows = []
    for r in results["runs"] + results.get("launchers", []):
        lat, clean = r["latency_ms"], r["cleanup_ms"]
        rows.append((r["name"], r["concurrency"], f"{r['fulfilled']}/{r['requests']}",
                     r["nodes"], lat["p50"], lat["p95"], lat["p99"], r["nodes_per_s"],
                     clean["p50"], clean["p95"], r["api_calls_per_node"],
                     r["zk_writes_per_node"], r["zk_reads_per_node"],
                     r["launcher_cpu_ms_per_node"], r["launcher_peak_rss_mib"]))
    soak = results.get("soak")
    if soak and not rows:
        lines += [f"soak: {len(soak['rounds'])} rounds of {soak['requests_per_round']} "
                  f"namespace requests, {soak['error_rate']:.0%} of Kubernetes writes failing"
                  f", request-lock dirs kept {_fmt(soak['lock_dir_max_age_s'] or '8 h')}"
                  f"{' s' if soak['lock_dir_max_age_s'] else ''}",
                  "  round  fulfilled  RSS MiB  threads"]
        lines += [f"  {r['round']:>5}  {r['fulfilled']:>5}/{r['requests']:<4} "
                  f"{_fmt(r['rss_mib']):>7}  {_fmt(r['threads']):>7}" for r in soak["rounds"]]
        lines.append(f"  second half: RSS {soak['rss_growth_second_half_mib']:+} MiB, "
                     f"threads {soak['thread_growth_second_half']:+}")
        lines.append(f"  after {soak['warmup_nodes']:,} nodes of warm-up, over "
                     f"{soak['measured_nodes']:,} nodes: RSS {_fmt(soak['rss_mib_after_warmup'])}"
                     f" -> {_fmt(soak['rss_mib_last'])} MiB, slope "
                     f"{_fmt(soak['slope_kib_per_node'])} KiB per node "
                     f"({_fmt(soak['projected_mib_per_target_nodes'])} MiB per "
                     f"{SOAK_TARGET_NODES:,} nodes), threads "
                     f"{_fmt(soak['threads_after_warmup'])} "
                     f"{soak['new_threads_after_warmup'] or 0:+} after the warm-up")
        t = soak["target"]
        mark = "n/a   " if t["met"] is None else "met   " if t["met"] else "MISSED"
        note = f"; {t['note']}" if t.get("note") else ""
        lines.append(f"  {mark} {t['name']}: {_fmt(t['value'])} (target {t['target']}){note}")
        return "\n".join(lines)
    widths = [max(len(_fmt(row[i])) for row in rows) for i in range(len(head))]
    for index, row in enumerate(rows):
        lines.append("  ".join(_fmt(v).rjust(w) if i else _fmt(v).ljust(w)
                               for i, (v, w) in enumerate(zip(row, widths))))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("latency = request submitted -> fulfilled seen by the request watch; "
                 "clean = release -> node gone (ms);")
    lines.append("per node (/n): Kubernetes API calls, ZooKeeper write transactions and read "
                 "requests of the launcher(s), launcher CPU ms")
    for r in results["runs"]:
        b = r.get("burst")
        if b:
            lines.append(f"{r['name']}: {b['size']} requests submitted within "
                         f"{_fmt(b['submit_span_ms'])} ms (all created after "
                         f"{_fmt(b['created_span_ms'])} ms, {r['load_threads']} load threads"
                         f"), fulfilled within {_fmt(b['duration_ms'])} ms; p50/p95 "
                         f"{_fmt(b['p50_over_p95'])}, {_fmt(b['fulfilled_first_half'])} of "
                         "them in the first half")
            order = b.get("order") or {}
            if order.get("overtaken"):
                ov, sh = order["overtaken"], order["shift"]
                lines.append(f"  arrival order: overtaken by later requests p50/p95/max "
                             f"{_fmt(ov['p50'])}/{_fmt(ov['p95'])}/{_fmt(ov['max'])}, rank "
                             f"shift p50/p95/max {_fmt(sh['p50'])}/{_fmt(sh['p95'])}/"
                             f"{_fmt(sh['max'])} (spread {_fmt(order['shift_spread'])})")
        f = r.get("vs_floor")
        if f:
            lines.append(f"  vs the protocol floor: p50 {_fmt(r['latency_ms']['p50'])} vs "
                         f"{_fmt(f['floor_p50_ms'])} ms (x{_fmt(f['p50_ratio'])}), p95 "
                         f"{_fmt(r['latency_ms']['p95'])} vs {_fmt(f['floor_p95_ms'])} ms "
                         f"(x{_fmt(f['p95_ratio'])}), fulfilled within "
                         f"{_fmt(r['burst']['duration_ms'])} vs {_fmt(f['floor_duration_ms'])}"
                         f" ms (x{_fmt(f['duration_ratio'])}), wall {_fmt(r['wall_s'])} vs "
                         f"{_fmt(f['floor_wall_s'])} s; floor p50/p95 "
                         f"{_fmt(f['floor_p50_over_p95'])}")
    for r in results.get("launchers", []):
        lines.append(f"{r['name']}: most nodes seen at once {r['max_nodes_seen']} "
                     f"(max-servers {r['quota']}, {r['watch_samples']} samples): "
                     f"{'held' if r['quota_held'] else 'EXCEEDED'}")
    s = results.get("scale")
    if s:
        lines += ["", f"scale: {s['nodes']} extra nodes ({s['record_bytes']} bytes each, with "
                  f"lock dirs) created in {s['fill_s']} s",
                  f"  nodepool list: {s['list_s_median']} s median wall time "
                  f"({', '.join(_fmt(v) for v in s['list_s'])}; {s['list_rows']} rows), "
                  f"{s['list_cpu_s_median']} s CPU",
                  f"  launcher RSS: {s['launcher_rss_mib_before']} MiB before, "
                  f"{s['launcher_rss_mib']} MiB after, peak {s['launcher_peak_rss_mib']} MiB"
                  f" (settled {s['launcher_settle_s']} s after the fill)",
                  f"  new namespace request -> fulfilled: p50 {s['latency_ms']['p50']} ms, "
                  f"max {s['latency_ms']['max']} ms ({s['fulfilled']}/{s['requests']})",
                  f"  a launcher started now runs after {s['new_launcher_startup_s']} s "
                  f"(peak RSS {s['new_launcher_peak_rss_mib']} MiB)"]
    w = results.get("webflood")
    if w:
        lines += ["", f"webflood: {w['nodes']} extra nodes, {w['clients']} clients sending "
                  f"{w['flood_requests']} distinct status queries ({w['flood_per_s']}/s, "
                  f"{w['flood_errors']} errors)",
                  f"  namespace request -> fulfilled p50/p95: {w['idle_p50_ms']}/"
                  f"{w['idle_p95_ms']} ms idle, {w['flood_p50_ms']}/{w['flood_p95_ms']} ms "
                  "flooded",
                  f"  /ready during the flood: p50 {w['ready_p50_ms']} ms, max "
                  f"{w['ready_max_ms']} ms; launcher RSS {w['launcher_rss_mib_before']} -> "
                  f"{w['launcher_rss_mib_after']} MiB"]
    lines += ["", "targets (zero simulator delay):"]
    for t in results.get("targets", []):
        mark = "n/a   " if t["met"] is None else "met   " if t["met"] else "MISSED"
        note = f"; {t['note']}" if t.get("note") else ""
        lines.append(f"  {mark} {t['name']}: {_fmt(t['value'])} (target {t['target']}){note}")
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    d = Params()
    p = argparse.ArgumentParser(
        prog="tools/benchmark",
        description="Measure nodepool-launcher as a whole system: real ZooKeeper, the "
                    "simulated Kubernetes API (own process), real launcher processes and "
                    "a Zuul-like load generator. See doc/benchmark.md.")
    p.add_argument("--quick", action="store_true",
                   help="smoke mode: few requests, 1,000 scale nodes, 1 and 2 launchers")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--requests", type=int, help=f"requests per label, zero delays "
                   f"(default {d.requests})")
    p.add_argument("--realistic-requests", type=int,
                   help=f"requests per label, realistic delays (default {d.realistic_requests})")
    p.add_argument("--serial", type=int,
                   help=f"one-at-a-time requests per label, zero delays (default {d.serial})")
    p.add_argument("--concurrency", type=int,
                   help=f"builds in flight (load threads) (default {d.concurrency})")
    p.add_argument("--sessions", type=int,
                   help=f"ZooKeeper sessions of the load generator (default {d.sessions})")
    p.add_argument("--labels", help="labels measured one by one (default namespace,pod)")
    p.add_argument("--mix", help="an extra run with a request mix, e.g. "
                   "namespace=3,pod=1,namespace+pod=1 (types joined by +, weights)")
    p.add_argument("--priorities", help="request priorities cycled, e.g. 100,200,300 "
                   "(default 200)")
    p.add_argument("--profiles", help="delay profiles: zero,realistic (default both)")
    p.add_argument("--realistic", metavar="DELAYS",
                   help="realistic delays, default schedule=0.2,start=1,token=0.1,"
                        "ns-delete=0.5,pod-delete=0 (latency=S: added to every API request)")
    p.add_argument("--error-rate", type=float,
                   help="fraction of Kubernetes API calls answered 500/429 (default 0)")
    p.add_argument("--max-concurrency", type=int,
                   help=f"the provider's max-concurrency (default {d.max_concurrency})")
    p.add_argument("--launchers", help="launcher counts for the quota runs, e.g. 1,2,4; "
                   "0 skips them")
    p.add_argument("--launcher-requests", type=int,
                   help=f"requests per quota run (default {d.launcher_requests})")
    p.add_argument("--launcher-concurrency", type=int,
                   help=f"builds in flight in the quota runs (default "
                        f"{d.launcher_concurrency})")
    p.add_argument("--quota", type=int,
                   help=f"max-servers in the quota runs (default {d.quota})")
    p.add_argument("--burst", metavar="SIZES",
                   help="namespace bursts (all requests submitted at once) at zero delays, "
                        f"comma list of sizes; 0 skips them (default "
                        f"{','.join(map(str, d.burst))}, --quick "
                        f"{','.join(map(str, Params.quick_params().burst))})")
    p.add_argument("--no-floor", action="store_true",
                   help="skip the protocol floor (the same bursts against a launcher that "
                        "does only the Nodepool protocol's ZooKeeper work, run after them)")
    p.add_argument("--nodepool-burst", metavar="FILE",
                   help=f"JSON of {SIDE_BY_SIDE} (Nodepool 11 and ours, side by side): "
                        "adds its figures to the burst ratio targets")
    p.add_argument("--scale-nodes", type=int,
                   help=f"extra nodes for the scale run, 0 skips it (default {d.scale_nodes})")
    p.add_argument("--scale-loop-requests", type=int,
                   help="namespace builds in a closed loop among the scale run's nodes, 0 "
                        f"skips it (default {d.scale_loop_requests})")
    p.add_argument("--timeout", type=float,
                   help=f"give up (and stop everything) after this many seconds (default "
                        f"{d.timeout:g}, --quick {Params.quick_params().timeout:g})")
    p.add_argument("--output", metavar="FILE", help="also write the JSON results here")
    p.add_argument("--profile", metavar="DIR",
                   help="record each run's launcher(s) with py-spy (raw stacks and a summary "
                        "per run in DIR; needs `pip install py-spy`)")
    p.add_argument("--profile-idle", action="store_true",
                   help="with --profile: keep samples of waiting threads (where time goes, "
                        "not only CPU)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument("--soak", type=int, metavar="ROUNDS", dest="soak_rounds",
                   help="run only the soak mode: ROUNDS rounds of --soak-requests namespace "
                        "requests (with --error-rate), RSS and threads after each")
    p.add_argument("--webflood", type=int, metavar="NODES", dest="webflood_nodes",
                   help="extra nodes for the web flood runs (Zuul's requests idle and while "
                        "clients flood the status port), 0 skips them (default "
                        f"{d.webflood_nodes}, --quick {Params.quick_params().webflood_nodes})")
    p.add_argument("--webflood-requests", type=int,
                   help=f"namespace builds per web flood run (default {d.webflood_requests})")
    p.add_argument("--soak-requests", type=int,
                   help=f"requests per soak round (default {Params.soak_requests})")
    p.add_argument("--soak-warmup", type=int, metavar="NODES",
                   help="nodes before the soak's RSS slope is measured (default "
                        f"{Params.soak_warmup})")
    p.add_argument("--soak-lock-dir-age", type=float, metavar="SECONDS",
                   help="soak: the launcher's NODEPOOL_K8S_LOCK_DIR_MAX_AGE (default "
                        f"{SOAK_LOCK_DIR_AGE:g}; 0: the launcher's own 8 h, whose lock dirs "
                        "then grow for 8 h before they level off)")
    p.add_argument("--soak-tracemalloc", type=int, metavar="N", default=0,
                   help="soak: the launcher traces its allocations (tools/profile hook) and "
                        "reports the growth by source line and its thread names after the "
                        "first, every N-th and the last round (slows it several times; RSS "
                        "figures are then not comparable)")
    p.add_argument("--soak-memstats", type=int, metavar="N", default=0,
                   help="soak: the launcher (tools/profile hook, no tracing) reports its "
                        "garbage collector's generations and pymalloc's arenas after the "
                        "first, every N-th and the last round")
    p.add_argument("--soak-memstats-collect", action="store_true",
                   help="with --soak-memstats: each report forces a full collection and "
                        "lists the garbage it found (changes the RSS it measures)")
    return p


def params_from(args: argparse.Namespace) -> Params:
    p = Params.quick_params() if args.quick else Params()
    for name in ("requests", "realistic_requests", "serial", "concurrency", "sessions",
                 "error_rate", "max_concurrency", "launcher_requests", "launcher_concurrency",
                 "quota", "scale_nodes", "scale_loop_requests", "timeout", "soak_rounds",
                 "soak_requests", "soak_warmup", "soak_lock_dir_age", "webflood_nodes",
                 "webflood_requests"):
        value = getattr(args, name)
        if value is not None:
            setattr(p, name, value)
    p.profile_dir = args.profile
    p.soak_tracemalloc = args.soak_tracemalloc
    p.soak_memstats = args.soak_memstats
    p.soak_memstats_collect = args.soak_memstats_collect
    if p.soak_rounds > 0 and args.timeout is None:
        # A soak round takes about 5 s on a 2-core machine; the limit follows the rounds.
        p.timeout = max(p.timeout, 120.0 + 30.0 * p.soak_rounds)
    p.profile_idle = args.profile_idle
    if args.labels:
        p.labels = [x for x in args.labels.split(",") if x]
    if args.mix:
        p.mix = parse_mix(args.mix)
    if args.priorities:
        p.priorities = [f"{x.strip():0>3}" for x in args.priorities.split(",") if x.strip()]
    if args.profiles:
        p.profiles = [x for x in args.profiles.split(",") if x]
        unknown = set(p.profiles) - {"zero", "realistic"}
        if unknown:
            raise SystemExit(f"unknown profile(s): {', '.join(sorted(unknown))}")
    if args.realistic:
        p.realistic = parse_delays(args.realistic, REALISTIC_DELAYS)
    if args.launchers is not None:
        p.launchers = [int(x) for x in args.launchers.split(",") if x.strip() and int(x) > 0]
    if args.burst is not None:
        p.burst = [int(x) for x in args.burst.split(",") if x.strip() and int(x) > 0]
    p.nodepool_burst = args.nodepool_burst
    p.floor = not args.no_floor
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    params = params_from(args)
    stack = Stack(prefix="nodepool-k8s-bench-", keep=args.keep)
    bench = Bench(params, stack)
    status, results, problems = run_guarded(stack, "benchmark", params.timeout + 5, bench.run)
    if results is not None:
        problems = problems + failures(results, params)
        results["ok"] = not problems
        results["problems"] = problems
        print(json.dumps(results, indent=2) if args.json else table(results), flush=True)
        if args.output:
            Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems and status == 0:
        status = 1
    if args.keep:
        print(f"work directory kept: {stack.workdir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
