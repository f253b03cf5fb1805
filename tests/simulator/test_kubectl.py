"""kubectl against the simulator: plain commands, no extra flags (skipped without kubectl)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.simulator.conftest import existing

KUBECTL = shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata:
  name: demo
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: demo
  labels: {app: web}
spec:
  containers:
  - name: main
    image: nginx:1.25
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: demo}
data: {level: debug}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: demo}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list]
"""


def kubectl(sim: Simulator, *args: str, check: bool = True) -> str:
    assert KUBECTL is not None and sim.kubeconfig_path
    result = subprocess.run([KUBECTL, "--kubeconfig", sim.kubeconfig_path, *args],
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
    return result.stdout + result.stderr


def test_get_create_delete(k8s_sim: Simulator, tmp_path: Path, changes: Signal) -> None:
    out = kubectl(k8s_sim, "get", "ns")
    assert out.split()[:3] == ["NAME", "STATUS", "AGE"] and "kube-system" in out
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(MANIFEST)
    out = kubectl(k8s_sim, "create", "-f", str(manifest))
    assert "namespace/demo created" in out and "pod/web created" in out
    assert "role.rbac.authorization.k8s.io/reader created" in out
    changes.until(lambda: (k8s_sim.get("pods", "web", "demo") or {}).get(
        "status", {}).get("phase") == "Running")
    out = kubectl(k8s_sim, "get", "pods", "-n", "demo", "-o", "wide")
    assert "web" in out and "Running" in out and "sim-node-1" in out and "1/1" in out
    assert kubectl(k8s_sim, "get", "po", "-A", "-l", "app=web", "-o", "name").strip() \
        == "pod/web"
    assert "settings" in kubectl(k8s_sim, "get", "cm", "-n", "demo")
    assert kubectl(k8s_sim, "get", "ns", "demo", "-o",
                   "jsonpath={.status.phase}") == "Active"
    kubectl(k8s_sim, "label", "pod", "web", "-n", "demo", "tier=front")
    assert existing(k8s_sim, "pods", "web", "demo")["metadata"]["labels"]["tier"] == "front"
    assert "Running" in kubectl(k8s_sim, "describe", "pod", "web", "-n", "demo")
    assert 'pod "web" deleted' in kubectl(k8s_sim, "delete", "pod", "web", "-n", "demo")
    assert k8s_sim.get("pods", "web", "demo") is None
    assert 'namespace "demo" deleted' in kubectl(k8s_sim, "delete", "ns", "demo")
    assert k8s_sim.get("namespaces", "demo") is None
    out = kubectl(k8s_sim, "get", "ns", "demo", check=False)
    assert 'namespaces "demo" not found' in out


def test_apply_is_idempotent(k8s_sim: Simulator, tmp_path: Path) -> None:
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(MANIFEST)
    assert "configmap/settings created" in kubectl(k8s_sim, "apply", "-f", str(manifest))
    manifest.write_text(MANIFEST.replace("level: debug", "level: info"))
    out = kubectl(k8s_sim, "apply", "-f", str(manifest))
    assert "configmap/settings configured" in out
    assert existing(k8s_sim, "configmaps", "settings", "demo")["data"] == {"level": "info"}


def test_imperative_creates_send_protobuf(k8s_sim: Simulator) -> None:
    # kubectl's typed clients send protobuf bodies; the simulator decodes these kinds.
    kubectl(k8s_sim, "create", "namespace", "imp")
    kubectl(k8s_sim, "create", "serviceaccount", "bot", "-n", "imp")
    kubectl(k8s_sim, "create", "secret", "generic", "s", "-n", "imp", "--from-literal=k=v")
    kubectl(k8s_sim, "create", "configmap", "c", "-n", "imp", "--from-literal=a=b")
    kubectl(k8s_sim, "create", "role", "r", "-n", "imp", "--verb=get,list", "--resource=pods")
    kubectl(k8s_sim, "create", "rolebinding", "rb", "-n", "imp", "--role=r",
            "--serviceaccount=imp:bot")
    token = kubectl(k8s_sim, "create", "token", "bot", "-n", "imp", "--duration=20m").strip()
    assert token.count(".") == 2
    assert existing(k8s_sim, "secrets", "s", "imp")["data"] == {"k": "dg=="}
    assert existing(k8s_sim, "configmaps", "c", "imp")["data"] == {"a": "b"}
    assert existing(k8s_sim, "roles", "r", "imp")["rules"] == [
        {"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]
    binding = existing(k8s_sim, "rolebindings", "rb", "imp")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "r"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "bot",
                                    "namespace": "imp"}]
    out = kubectl(k8s_sim, "create", "namespace", "Bad_Name", check=False)
    assert 'The Namespace "Bad_Name" is invalid' in out


def test_watch_with_kubectl(k8s_sim: Simulator, changes: Signal) -> None:
    assert KUBECTL is not None and k8s_sim.kubeconfig_path
    proc = subprocess.Popen([KUBECTL, "--kubeconfig", k8s_sim.kubeconfig_path, "get", "ns",
                             "-w", "--request-timeout=5s"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["NAME", "STATUS", "AGE"]
        changes.until(lambda: k8s_sim.open_watches == 1)
        subprocess.run([KUBECTL, "--kubeconfig", k8s_sim.kubeconfig_path, "create", "namespace",
                        "watched"], check=True, capture_output=True, timeout=30)
        line = "first"
        while line and not line.startswith("watched"):
            line = proc.stdout.readline()  # "" at EOF (the 5 s request timeout ends the watch)
        assert line.split()[:2] == ["watched", "Active"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_plain_http(make_sim: Any) -> None:
    sim, _ = make_sim(tls=False)
    assert "kube-system" in kubectl(sim, "get", "ns")
