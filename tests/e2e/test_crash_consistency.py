"""Randomised faults during a burst of builds: SIGKILL, session expiry, dropped ZooKeeper
connections (lost replies), SIGTERM.

Each test runs a few seeded iterations. A seed fixes the burst (20-40 Zuul-like builds of
one or two nodes, about one in seven cancelled at a random moment), the pod start delay
and the fault schedule: the faults land once a random number of node changes has been
seen (a condition, not a sleep), so they hit launches, fulfilments, deletions and resets
alike. Once things settle the same invariants must hold whatever the timing:

- every build that was not cancelled got its nodes (fulfilled exactly once: a node is
  never allocated to two requests, and no request is left behind);
- `max-servers` was never exceeded at any sampled moment (a watcher samples every change
  of `/nodepool/nodes`);
- what is left is only spare ready nodes (min-ready, cancelled builds), and the cluster
  holds exactly their namespaces: everything else was deleted or swept as a leak;
- no launcher log has a traceback or an ERROR line; SIGTERM exits 0 promptly.

A failure names its seed; `CRASH_SEEDS=1,2,...` runs other seeds (a longer hunt).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.dev.testing.zuul_client import ZuulClient, ZuulError
from nodepool_k8s.zk import paths
from tests.e2e.util import leftovers
from tests.helpers import ZkConnection, wait_for
from tests.launcher.util import NodeCounter, Processes
from tests.launchers import TEST_SETTINGS, LauncherFactory, make_config
from tests.sessions import CuttingProxy, expire_session

pytestmark = pytest.mark.slow

MAX_SERVERS = 6
CONFIG = f"""
labels:
  - name: pod
  - name: ns
    min-ready: 1
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    leak-grace: 1
    api-backoff: [0.05]
    pools:
      - name: main
        max-servers: {MAX_SERVERS}
        labels:
          - name: pod
            type: pod
            image: docker.io/fedora:40
          - name: ns
            type: namespace
"""
ENV = {"NODEPOOL_K8S_LEAK_SWEEP_INTERVAL": "1"}
SETTINGS = dataclasses.replace(TEST_SETTINGS, cleanup_interval=2.0, leak_sweep_interval=1.0,
                               stale_init_age=2.0)


def seeds(default: str) -> list[int]:
    return [int(s) for s in os.environ.get("CRASH_SEEDS", default).split(",")]


class Burst:
    """Builds from six Zuul-like clients at once; `results` maps each served request to
    its nodes, `problems` collects what Zuul would have reported as NODE_FAILURE."""

    def __init__(self, zk: ZkConnection, rng: random.Random) -> None:
        self.zk = zk
        self.count = rng.randint(20, 40)
        self.results: dict[str, list[str]] = {}
        self.problems: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        builds = [([rng.choice(["pod", "ns"]) for _ in range(rng.choice([1, 1, 2]))],
                   rng.uniform(0.0, 1.0) if rng.random() < 0.15 else None)
                  for _ in range(self.count)]
        self.cancelled = sum(1 for _, cancel in builds if cancel is not None)
        self._threads = [threading.Thread(target=self._run, args=(builds[i::6],), daemon=True)
                         for i in range(6)]

    def _run(self, builds: list[tuple[list[str], float | None]]) -> None:
        with ZuulClient(self.zk.hosts) as zuul:
            for labels, cancel_after in builds:
                if self._stop.is_set():
                    return
                try:
                    self._build(zuul, labels, cancel_after)
                except (ZuulError, TimeoutError, AssertionError) as exc:
                    with self._lock:
                        self.problems.append(f"{labels}: {exc}")

    def _build(self, zuul: ZuulClient, labels: list[str], cancel_after: float | None) -> None:
        request_id = zuul.submit(labels)
        if cancel_after is not None:
            # Zuul cancels at any moment: wait for nothing, just let some time pass.
            self._stop.wait(cancel_after)
            zuul.cancel(request_id)
            return
        body = zuul.wait(request_id, 90)
        assert body is not None and body["state"] == "fulfilled", f"{request_id}: {body}"
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        with self._lock:
            self.results[request_id] = [held.id for held in nodeset.nodes]
        zuul.release(nodeset)

    def start(self) -> "Burst":
        for thread in self._threads:
            thread.start()
        return self

    @property
    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> None:
        wait_for(lambda: self.done, timeout, interval=0.1, message="the burst to finish")

    def stop(self) -> None:
        self._stop.set()


def at_random_moments(rng: random.Random, counter: NodeCounter, burst: Burst, most: int,
                      fault: Callable[[], None]) -> None:
    """Call `fault` at 1..`most` random moments: after a random number of further node
    changes each (none once the burst is over)."""
    threshold = counter.samples
    for _ in range(rng.randint(1, most)):
        threshold += rng.randint(1, 12)
        wait_for(lambda: counter.samples >= threshold or burst.done, 120, interval=0.005,
                 message=f"{threshold} node changes")
        if burst.done:
            return
        fault()


def settled(kazoo_client: KazooClient, sim: Simulator) -> bool:
    """Only spare ready nodes are left (unallocated, or held by a min-ready request) and
    the cluster has exactly their namespaces."""
    namespaces = set()
    for node_id in kazoo_client.get_children(paths.NODES):
        try:
            body = json.loads(kazoo_client.get(paths.node_path(node_id))[0])
        except (NoNodeError, ValueError):
            return False
        allocated = body.get("allocated_to")
        if body.get("state") != "ready" or allocated and not allocated.startswith("900-"):
            return False
        namespaces.add(body.get("external_id"))
    return set(leftovers(sim).get("namespaces", [])) == namespaces


def check(seed: int, burst: Burst, counter: NodeCounter, kazoo_client: KazooClient,
          sim: Simulator, logs: Callable[[], str]) -> None:
    where = f"seed {seed}"
    burst.join(240)
    assert not burst.problems, f"{where}: {burst.problems[:3]}\n{logs()}"
    assert len(burst.results) == burst.count - burst.cancelled, where
    nodes = [n for ns in burst.results.values() for n in ns]
    assert len(nodes) == len(set(nodes)), f"{where}: a node was allocated twice"
    assert counter.max.get("k8s", 0) <= MAX_SERVERS, f"{where}: {counter.max}"
    try:
        wait_for(lambda: settled(kazoo_client, sim), 60, interval=0.1, message="settled")
    except AssertionError:
        raise AssertionError(f"{where}: not settled: nodes "
                             f"{kazoo_client.get_children(paths.NODES)}, cluster "
                             f"{leftovers(sim)}\n{logs()}") from None
    left = [r for r in kazoo_client.get_children(paths.REQUESTS) if not r.startswith("900-")]
    assert left == [], f"{where}: requests left {left}"


def check_logs(seed: int, processes: Processes) -> None:
    for log in sorted(processes.tmp.glob("launcher-*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if "Traceback" in line or " ERROR " in line:
                raise AssertionError(f"seed {seed}: {log.name}:\n"
                                     + "\n".join(lines[max(0, index - 5):index + 25]))


def log_of(processes: Processes, proc: subprocess.Popen[bytes]) -> Path:
    return processes.tmp / f"launcher-{processes.procs.index(proc)}.log"


def stop_all(seed: int, processes: Processes, procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        log = log_of(processes, proc)
        wait_for(lambda: b"Launcher running" in log.read_bytes(), 30, message="running")
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(30) == 0, f"seed {seed}\n{processes.logs()}"
    check_logs(seed, processes)


@pytest.fixture
def counter(kazoo_client: KazooClient) -> NodeCounter:
    return NodeCounter(kazoo_client)


def start_registered(processes: Processes, kazoo_client: KazooClient,
                     count: int) -> list[subprocess.Popen[bytes]]:
    procs = [processes.start(CONFIG, env=ENV) for _ in range(count)]
    wait_for(lambda: kazoo_client.exists(paths.POOL_COMPONENTS) is not None
             and len(kazoo_client.get_children(paths.POOL_COMPONENTS)) == count, 60,
             message="the launchers registered")
    return procs


@pytest.mark.parametrize("seed", seeds("1,2"))
def test_sigkill_during_a_burst(seed: int, processes: Processes, zk: ZkConnection,
                                k8s_sim: Simulator, kazoo_client: KazooClient,
                                counter: NodeCounter) -> None:
    """Two launchers; one of them, at random, is killed and started again (1-4 times)."""
    rng = random.Random(seed)
    k8s_sim.config.start_delay = rng.choice([0.0, 0.1, 0.5, 1.5])
    procs = start_registered(processes, kazoo_client, 2)
    burst = Burst(zk, rng).start()

    def kill_one() -> None:
        index = rng.randrange(len(procs))
        procs[index].kill()
        procs[index].wait(10)
        procs[index] = processes.start(CONFIG, env=ENV)

    try:
        at_random_moments(rng, counter, burst, 4, kill_one)
        check(seed, burst, counter, kazoo_client, k8s_sim, processes.logs)
    finally:
        burst.stop()
    stop_all(seed, processes, procs)


@pytest.mark.parametrize("seed", seeds("1,2,3"))
def test_session_expiry_during_a_burst(seed: int, launchers: LauncherFactory,
                                       zk: ZkConnection, k8s_sim: Simulator,
                                       kazoo_client: KazooClient, counter: NodeCounter,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """One launcher whose session expires (1-5 times); it recovers without a restart."""
    rng = random.Random(seed)
    k8s_sim.config.start_delay = rng.choice([0.0, 0.1, 0.5, 1.5])
    launcher = launchers(CONFIG, settings=SETTINGS)
    burst = Burst(zk, rng).start()

    def expire() -> None:
        # The previous expiry's reconnect first: a session to expire.
        wait_for(lambda: launcher.zk.connected and launcher.zk.session_id is not None, 30,
                 message="connected")
        expire_session(zk, launcher.zk)

    try:
        at_random_moments(rng, counter, burst, 5, expire)
        check(seed, burst, counter, kazoo_client, k8s_sim, lambda: "")
    finally:
        burst.stop()
    bad = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not bad, f"seed {seed}: {bad[:5]}"


@pytest.mark.parametrize("seed", seeds("1,2,3"))
def test_connection_drops_during_a_burst(seed: int, zk: ZkConnection, k8s_sim: Simulator,
                                         kazoo_client: KazooClient, counter: NodeCounter,
                                         caplog: pytest.LogCaptureFixture) -> None:
    """One launcher whose connections to ZooKeeper are cut (1-15 times) while its session
    lives on: every write in flight at a cut may or may not have been applied."""
    rng = random.Random(seed)
    k8s_sim.config.start_delay = rng.choice([0.0, 0.1, 0.5])
    proxy = CuttingProxy(zk.port)
    via = ZkConnection(host=zk.host, port=proxy.port, chroot=zk.chroot)
    launcher = Launcher(make_config(via, CONFIG), settings=SETTINGS,
                        stats=Stats(RecordingBackend()))
    burst: Burst | None = None
    try:
        assert launcher.start()
        burst = Burst(zk, rng).start()

        def cut() -> None:
            wait_for(lambda: launcher.zk.connected, 30, message="reconnected")
            proxy.cut()

        at_random_moments(rng, counter, burst, 15, cut)
        check(seed, burst, counter, kazoo_client, k8s_sim, lambda: "")
    finally:
        if burst is not None:
            burst.stop()
        launcher.stop()
        proxy.stop()
    bad = [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert not bad, f"seed {seed}: {bad[:5]}"


@pytest.mark.parametrize("seed", seeds("1,2"))
def test_sigterm_during_a_burst(seed: int, processes: Processes, zk: ZkConnection,
                                k8s_sim: Simulator, kazoo_client: KazooClient,
                                counter: NodeCounter) -> None:
    """One launcher, stopped with SIGTERM and started again (1-4 times): it exits 0
    within its stop deadline and leaves no request `pending` behind."""
    rng = random.Random(seed)
    # 5 s: pods that do not start before the stop deadline (launches cancelled).
    k8s_sim.config.start_delay = rng.choice([0.0, 0.5, 5.0])
    procs = start_registered(processes, kazoo_client, 1)
    burst = Burst(zk, rng).start()

    def terminate() -> None:
        proc = procs[0]
        log = log_of(processes, proc)
        # Its signal handler is in place once it logs.
        wait_for(lambda: log.stat().st_size > 0, 30, message="the launcher logging")
        proc.send_signal(signal.SIGTERM)
        try:
            status = proc.wait(10)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"seed {seed}: no exit 10 s after SIGTERM") from None
        assert status == 0, f"seed {seed}: exit status {status}\n{processes.logs()}"
        for request_id in kazoo_client.get_children(paths.REQUESTS):
            try:
                body = json.loads(kazoo_client.get(paths.request_path(request_id))[0])
            except (NoNodeError, ValueError):
                continue
            assert body["state"] != "pending", f"seed {seed}: {request_id} left {body}"
        procs[0] = processes.start(CONFIG, env=ENV)

    try:
        at_random_moments(rng, counter, burst, 4, terminate)
        k8s_sim.config.start_delay = 0.0
        check(seed, burst, counter, kazoo_client, k8s_sim, processes.logs)
    finally:
        burst.stop()
    stop_all(seed, processes, procs)
