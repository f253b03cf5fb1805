"""A simulated Kubernetes API server for tests, the demo and benchmarks (see doc/simulator.md).

It speaks the real REST API (JSON over HTTP/1.1, HTTPS by default) for namespaces, pods,
service accounts (+ TokenRequest), secrets, configmaps, nodes, roles and rolebindings, with
watches, selectors, Status errors, background controllers (pod phases, service-account token
secrets, namespace deletion) and fault injection, so the official `kubernetes` client and
kubectl work against it unchanged. It never imports the `kubernetes` package.

    from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig, Faults
    with Simulator(SimulatorConfig(faults=Faults(latency=0.01))) as sim:
        sim.write_kubeconfig("/tmp/kubeconfig")
"""

from nodepool_k8s.dev.simulator.config import SimulatorConfig
from nodepool_k8s.dev.simulator.faults import Faults
from nodepool_k8s.dev.simulator.simulator import Simulator
from nodepool_k8s.dev.simulator.tls import TlsError

__all__ = ["Faults", "Simulator", "SimulatorConfig", "TlsError"]
