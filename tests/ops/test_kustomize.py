"""etc/kubernetes as a kustomize base, built by the real kubectl and applied to the simulator.

Aspects: the base builds to exactly the objects of the four plain manifests, unchanged but
for one metadata label and the configuration Secret, whose files match the Secret of
launcher-deployment.yaml (so `kubectl apply -f` of a single file and `-k` of the base install
the same thing); the example overlay builds and changes what it says; a server-side dry run
(`kubectl apply --dry-run=server`) of the build is admitted object by object and stores
nothing, and an invalid object in it is refused.

kubectl with kustomize v5 is installed by tools/test-setup.sh. Without it these tests skip on
a developer's machine but fail under CI (`CI=true`), so CI never stops checking unnoticed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.simulator.resources import RESOURCES

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "etc" / "kubernetes"
OVERLAY = REPO / "etc" / "kubernetes-overlay"
MANIFESTS = ("launcher-deployment.yaml", "launcher-rbac.yaml", "network-policies.yaml",
             "job-policy.yaml")
PART_OF = ("app.kubernetes.io/part-of", "nodepool-k8s")
PLURAL = {(r.api_version, r.kind): r.plural for r in RESOURCES}

Obj = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace, name


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="module")
def kubectl() -> str:
    """The kubectl binary; it must embed kustomize v5 (Debian's 1.20 has v2, which lacks
    `labels`)."""
    found = shutil.which("kubectl")
    problem = ""
    if found is None:
        problem = "kubectl is not installed (tools/test-setup.sh installs it)"
    else:
        result = subprocess.run([found, "version", "--client", "-o", "json"],
                                capture_output=True, text=True, timeout=60)
        version = ""
        if result.returncode == 0:
            version = str(json.loads(result.stdout).get("kustomizeVersion", ""))
        match = re.match(r"v?(\d+)\.", version)
        if match is None or int(match.group(1)) < 5:
            problem = (f"{found} embeds kustomize {version or '(none)'}; v5 or later is needed "
                       "(tools/test-setup.sh installs a recent kubectl)")
    if problem:
        if _in_ci():
            pytest.fail(problem)
        pytest.skip(problem)
    assert found is not None
    return found


def build(kubectl: str, directory: Path) -> list[Obj]:
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def key(obj: Obj) -> Key:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


def plain_objects() -> dict[Key, Obj]:
    out: dict[Key, Obj] = {}
    for name in MANIFESTS:
        for doc in yaml.safe_load_all((BASE / name).read_text()):
            if doc:
                out[key(doc)] = doc
    return out


def without_part_of(obj: Obj) -> Obj:
    copy = json.loads(json.dumps(obj))
    labels = copy["metadata"]["labels"]
    assert labels.pop(PART_OF[0]) == PART_OF[1], f"{key(obj)} lacks the part-of label"
    return copy


def test_base_builds_to_the_plain_manifests(kubectl: str) -> None:
    built = {key(obj): obj for obj in build(kubectl, BASE)}
    plain = plain_objects()
    assert set(built) == set(plain)
    assert {k[0] for k in built} == {
        "Namespace", "ServiceAccount", "Secret", "Deployment", "ClusterRole",
        "ClusterRoleBinding", "Role", "RoleBinding", "NetworkPolicy", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding"}
    # The ZooKeeper policy stays in Zuul's namespace, the launcher's objects in its own.
    assert ("NetworkPolicy", "zuul", "zookeeper-clients") in built
    assert ("Deployment", "nodepool", "nodepool-launcher") in built
    for k, obj in built.items():
        if k[0] == "Secret":
            continue
        # Nothing but one metadata label is added: selectors and pod labels stay as they are.
        assert without_part_of(obj) == plain[k], k


def test_base_config_is_the_example_files_and_the_plain_secret(kubectl: str) -> None:
    built = {key(obj): obj for obj in build(kubectl, BASE)}
    secret = built[("Secret", "nodepool", "nodepool-config")]
    files = {name: (BASE / "config" / name).read_text()
             for name in ("nodepool.yaml", "secure.conf")}
    assert {name: base64.b64decode(value).decode()
            for name, value in secret["data"].items()} == files
    assert plain_objects()[("Secret", "nodepool", "nodepool-config")]["stringData"] == files
    assert secret["type"] == "Opaque" and dict(secret["metadata"]["labels"]) == {
        "app.kubernetes.io/name": "nodepool-launcher", PART_OF[0]: PART_OF[1]}


def test_example_overlay_builds_with_its_changes(kubectl: str) -> None:
    built = {key(obj): obj for obj in build(kubectl, OVERLAY)}
    assert set(built) == set(plain_objects())
    pod = built[("Deployment", "nodepool", "nodepool-launcher")]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.internal.example/zuul/nodepool-k8s:1.0"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert pod["volumes"][0]["secret"]["secretName"] == "nodepool-config"


@pytest.fixture
def kubeconfig(k8s_sim: Simulator, tmp_path: Path) -> Iterator[list[str]]:
    """kubectl's arguments for the simulator, with a discovery cache of the test's own."""
    assert k8s_sim.kubeconfig_path
    yield ["--kubeconfig", k8s_sim.kubeconfig_path, "--cache-dir", str(tmp_path / "cache")]


def run(kubectl: str, args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl, *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def create_namespaces(kubectl: str, kubeconfig: list[str]) -> None:
    # A dry run creates nothing, so the namespaces the objects go to must exist (as on a
    # real server): Zuul's, and the launcher's, as an operator creates it first.
    for name in ("zuul", "nodepool"):
        result = run(kubectl, [*kubeconfig, "create", "namespace", name])
        assert result.returncode == 0, result.stderr


def stored(sim: Simulator, objects: list[Obj]) -> list[Key]:
    return [key(obj) for obj in objects
            if sim.get(PLURAL[(obj["apiVersion"], obj["kind"])], obj["metadata"]["name"],
                       obj["metadata"].get("namespace")) is not None]


def test_server_dry_run_admits_the_base_and_stores_nothing(
        kubectl: str, k8s_sim: Simulator, kubeconfig: list[str]) -> None:
    objects = build(kubectl, BASE)
    text = yaml.safe_dump_all(objects)
    create_namespaces(kubectl, kubeconfig)
    before = k8s_sim.get("namespaces", "nodepool")
    assert before is not None

    result = run(kubectl, [*kubeconfig, "apply", "--dry-run=server", "-f", "-"], text)
    assert result.returncode == 0, result.stderr
    done = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
    assert len(done) == len(objects), result.stdout
    assert "namespace/nodepool configured (server dry run)" in done
    assert "deployment.apps/nodepool-launcher created (server dry run)" in done

    # Read back through the API: only the two namespaces made above exist, unchanged.
    result = run(kubectl, [*kubeconfig, "get", "--ignore-not-found", "-o", "name", "-f", "-"],
                 text)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["namespace/nodepool"]
    assert stored(k8s_sim, objects) == [("Namespace", "", "nodepool")]
    after = k8s_sim.get("namespaces", "nodepool")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "pod-security.kubernetes.io/enforce" not in after["metadata"]["labels"]


def test_server_dry_run_refuses_an_invalid_object(
        kubectl: str, k8s_sim: Simulator, kubeconfig: list[str]) -> None:
    objects = build(kubectl, BASE)
    broken = [obj for obj in objects if obj["kind"] == "NetworkPolicy"][0]
    del broken["spec"]["podSelector"]
    create_namespaces(kubectl, kubeconfig)
    result = run(kubectl, [*kubeconfig, "apply", "--dry-run=server", "-f", "-"],
                 yaml.safe_dump_all(objects))
    assert result.returncode != 0
    assert "is invalid" in result.stderr and "podSelector" in result.stderr, result.stderr
    assert stored(k8s_sim, objects) == [("Namespace", "", "nodepool")]
