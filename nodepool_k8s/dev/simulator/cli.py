"""`nodepool-k8s-sim`: run the simulated API server in the foreground.

Owns: command-line parsing, starting a `Simulator`, writing the kubeconfig (and optionally a
ready file) once it listens, printing the URL, and stopping cleanly on SIGTERM/SIGINT.
Exits 1 with a message if the simulator cannot start (port taken, openssl missing).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from nodepool_k8s.dev.simulator.config import SimulatorConfig
from nodepool_k8s.dev.simulator.faults import Faults
from nodepool_k8s.dev.simulator.simulator import Simulator


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodepool-k8s-sim",
        description="Run a simulated Kubernetes API server (for tests and demos).")
    p.add_argument("--kubeconfig", required=True, help="write an admin kubeconfig here")
    p.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--no-tls", action="store_true", help="serve plain HTTP instead of HTTPS")
    p.add_argument("--context", default="sim", help="context/cluster name in the kubeconfig")
    p.add_argument("--namespace", default=None, help="default namespace of the context")
    p.add_argument("--schedule-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--start-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--token-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--namespace-delete-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--pod-delete-delay", type=float, default=0.0, metavar="S")
    p.add_argument("--error-rate", type=float, default=0.0, metavar="F",
                   help="fraction of API calls answered 500 or 429")
    p.add_argument("--latency", type=float, default=0.0, metavar="S",
                   help="seconds added to every API call")
    p.add_argument("--seed", type=int, default=0, help="seed for random faults")
    p.add_argument("--namespace-defaults", action="store_true",
                   help="create a default ServiceAccount and kube-root-ca.crt in new namespaces")
    p.add_argument("--enforce-rbac", action="store_true",
                   help="enforce Roles and RoleBindings for service-account tokens")
    p.add_argument("--watch-history", type=int, default=1000, metavar="N",
                   help="change events kept for resuming watches (older: 410 Expired)")
    p.add_argument("--ready-file", default=None, metavar="PATH",
                   help="write the URL to this file once listening")
    p.add_argument("--verbose", "-v", action="store_true", help="log every request")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = SimulatorConfig(
        tls=not args.no_tls, host=args.host, port=args.port,
        schedule_delay=args.schedule_delay, start_delay=args.start_delay,
        token_delay=args.token_delay, namespace_delete_delay=args.namespace_delete_delay,
        pod_delete_delay=args.pod_delete_delay, namespace_defaults=args.namespace_defaults,
        enforce_rbac=args.enforce_rbac, watch_history=args.watch_history,
        faults=Faults(error_rate=args.error_rate, latency=args.latency, seed=args.seed))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    sim = Simulator(config)
    try:
        sim.start()
    except Exception as exc:
        print(f"nodepool-k8s-sim: cannot start: {exc}", file=sys.stderr)
        return 1
    try:
        path = sim.write_kubeconfig(args.kubeconfig, context=args.context,
                                    namespace=args.namespace)
        print(f"Kubernetes API simulator listening on {sim.url}", flush=True)
        print(f"kubeconfig: {path} (context {args.context})", flush=True)
        if args.ready_file:
            ready = Path(args.ready_file)
            tmp = ready.with_name(ready.name + ".tmp")
            tmp.write_text(sim.url + "\n")
            tmp.replace(ready)
        stop.wait()
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
