"""The local demo (`bash tools/demo.sh`, or `python -m nodepool_k8s.dev.testing.demo`).

Owns: one walk through the launcher's life cycle on the local stack (see `stack.py`): a real
ZooKeeper, the simulated Kubernetes API and a real `nodepool-launcher` with
`etc/demo/nodepool.yaml`; three requests written the way Zuul writes them (a namespace, a
pod, and a three-node request), `nodepool list` / `nodepool request-list`, the nodes
accepted, used and released like Zuul's executor does, `kubectl get ns` when kubectl is
installed, and the wait until every namespace is gone again. Prints a summary line and
stops everything.

Exit status: 0 when every request was fulfilled, every namespace created was removed and
the launcher stopped cleanly (exit 0 on SIGTERM); 1 otherwise (the reason and the tail of
the launcher's log on stderr); 130 on Ctrl-C. Bounded: every wait has a deadline and the
whole run gives up after `--timeout` seconds (default 110).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

from nodepool_k8s.dev.testing.stack import (DEMO_CONFIG, DEMO_PROVIDER, SIM_CONTEXT, Stack,
                                            run_guarded, wait_until)

# What the demo asks for: (title, node types) — each request is one Zuul nodeset.
REQUESTS: list[tuple[str, list[str]]] = [
    ("a namespace", ["namespace"]),
    ("a pod", ["pod-fedora"]),
    ("a three-node nodeset", ["namespace", "pod-debian", "namespace"]),
]


class DemoFailed(Exception):
    pass


class Demo:
    def __init__(self, out: Any = None, timeout: float = 110.0) -> None:
        self.out = out or sys.stdout
        self.deadline = time.monotonic() + timeout

    # -- output ---------------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        self.say(f"\n== {text}")

    def remaining(self, cap: float) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DemoFailed("the demo ran out of time")
        return min(cap, left)

    def show_cli(self, stack: Stack, chroot: str, *args: str) -> bool:
        self.say(f"$ nodepool -c {DEMO_CONFIG.relative_to(DEMO_CONFIG.parents[2])} "
                 f"{' '.join(args)}")
        try:
            done, _ = stack.nodepool(chroot, *args, timeout=self.remaining(30))
        except subprocess.TimeoutExpired:
            self.say("   (timed out)")
            return False
        text = (done.stdout + done.stderr).rstrip()
        self.say(text or "   (no output)")
        if done.returncode != 0:
            self.say(f"   (exit status {done.returncode}; the summary below comes from "
                     "the demo itself)")
        return done.returncode == 0

    # -- the walk-through -----------------------------------------------------------------
    def run(self, stack: Stack) -> None:
        self.step("Starting ZooKeeper, the simulated Kubernetes API and nodepool-launcher")
        zk = stack.start_zookeeper()
        self.say(f"ZooKeeper         127.0.0.1:{zk.port} (Debian's zookeeper package)")
        sim = stack.start_simulator()
        self.say(f"Kubernetes API    {sim.url} (simulator, kubeconfig {sim.kubeconfig.name}, "
                 f"context {SIM_CONTEXT})")
        chroot = stack.new_chroot("nodepool-demo")
        launcher = stack.start_launcher(chroot)
        stack.wait_launchers(chroot, 1, timeout=self.remaining(60))
        self.say(f"nodepool-launcher pid {launcher.pid}, configuration {DEMO_CONFIG.name}, "
                 f"provider {DEMO_PROVIDER}, ZooKeeper chroot {chroot}")

        zuul = stack.zuul(chroot)
        self.step("Submitting node requests the way Zuul does")
        submitted: list[tuple[str, str, list[str], float]] = []
        for title, types in REQUESTS:
            request_id = zuul.submit(types)
            submitted.append((request_id, title, types, time.monotonic()))
            self.say(f"request {request_id}: {title} {types}")

        fulfilled: dict[str, dict[str, Any]] = {}
        for request_id, title, types, started in submitted:
            body = zuul.wait(request_id, timeout=self.remaining(60))
            if body is None or body.get("state") != "fulfilled":
                raise DemoFailed(f"request {request_id} ({title}) was not fulfilled: {body}")
            fulfilled[request_id] = body
            self.say(f"request {request_id}: fulfilled in "
                     f"{(time.monotonic() - started) * 1000:.0f} ms, "
                     f"nodes {', '.join(body['nodes'])}")

        self.step("What the operator sees")
        self.show_cli(stack, chroot, "list")
        self.show_cli(stack, chroot, "request-list")

        self.step("Zuul accepts the nodes (locks them) and runs its builds on them")
        nodesets = []
        for request_id, title, types, _ in submitted:
            nodeset = zuul.accept(request_id)
            zuul.use(nodeset)
            nodesets.append(nodeset)
            for held in nodeset.nodes:
                data = held.data
                port = data.get("connection_port") or {}
                where = f"namespace {port.get('namespace')}"
                if port.get("pod"):
                    where += f", pod {port['pod']}"
                self.say(f"node {held.id}  {data['type'][0]:<11} {data['state']:<7} "
                         f"{data.get('connection_type'):<10} {where}")
        created = sim.namespaces(f"nodepool_provider_name={DEMO_PROVIDER}")
        self.say(f"{len(created)} namespaces exist in the cluster for the provider "
                 f"{DEMO_PROVIDER}: {', '.join(sorted(created))}")
        self.show_kubectl(sim.kubeconfig)

        self.step("The builds finish: Zuul releases the nodes; the launcher deletes them")
        released = time.monotonic()
        for nodeset in nodesets:
            zuul.release(nodeset)
        node_ids = [h.id for ns in nodesets for h in ns.nodes]
        wait_until(lambda: all(zuul.get_node(n) is None for n in node_ids),
                   self.remaining(60), "the released nodes to be deleted", interval=0.05,
                   check=launcher.check_alive)
        wait_until(lambda: not sim.namespaces(f"nodepool_provider_name={DEMO_PROVIDER}"),
                   self.remaining(30), "the namespaces to be gone", interval=0.05)
        self.say(f"all {len(node_ids)} nodes and their namespaces are gone after "
                 f"{(time.monotonic() - released) * 1000:.0f} ms")
        self.show_cli(stack, chroot, "list")

        counters = sim.counters()
        made, removed = counters.get("create namespaces", 0), counters.get(
            "delete namespaces", 0)
        if made != len(node_ids) or removed != made:
            raise DemoFailed(f"expected {len(node_ids)} namespaces created and removed, the "
                             f"simulator counted {made} created and {removed} deleted")

        self.step("Stopping (SIGTERM to the launcher, then the simulator and ZooKeeper)")
        codes = stack.stop_launchers()
        if codes != [0]:
            raise DemoFailed(f"the launcher exited with {codes}")
        self.say("nodepool-launcher stopped cleanly (exit status 0)")
        self.summary = (f"{len(fulfilled)} requests fulfilled, {made} namespaces created and "
                        f"removed ({counters.get('total', 0)} Kubernetes API calls)")

    def show_kubectl(self, kubeconfig: Any) -> None:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.say("(kubectl is not installed: skipping `kubectl get ns`)")
            return
        self.say(f"$ kubectl --kubeconfig {kubeconfig.name} get ns")
        try:
            done = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "ns"],
                                  capture_output=True, text=True, timeout=self.remaining(20),
                                  stdin=subprocess.DEVNULL)
            self.say((done.stdout + done.stderr).rstrip())
        except subprocess.TimeoutExpired:
            self.say("   (kubectl timed out)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nodepool_k8s.dev.testing.demo",
        description="Run nodepool-launcher against a local ZooKeeper and the Kubernetes API "
                    "simulator, submit requests like Zuul, show them, clean up.")
    parser.add_argument("--timeout", type=float, default=110.0,
                        help="give up after this many seconds (default: 110)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, configuration) for inspection")
    args = parser.parse_args(argv)
    demo = Demo(timeout=args.timeout)
    stack = Stack(prefix="nodepool-k8s-demo-", keep=args.keep)
    status, _, problems = run_guarded(stack, "demo", args.timeout + 10,
                                      lambda: demo.run(stack))
    if problems:
        for problem in problems:
            print(f"problem: {problem}", file=sys.stderr)
        status = status or 1
    if status == 0:
        demo.say(f"\nDemo finished: {demo.summary}.")
    elif args.keep:
        print(f"logs kept in {stack.workdir}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
