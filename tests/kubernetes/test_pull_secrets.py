"""Copies of image pull Secrets, through the driver against the simulator.

Aspects: a pod label's named Secrets are read, copied (type and data only, our labels) and
named in the pod's imagePullSecrets; nothing else is copied; a missing one fails the attempt
`PullSecretMissing`, another type or an oversized one `PullSecretRefused`, neither retried,
and the attempt's namespace is removed; 5xx on the read are retried; a create whose answer
was lost meets a 409 accepted only when the copy there is this node's; a 403 on the source
is `Forbidden`; the simulator refuses a registry Secret without its JSON key.
"""

from __future__ import annotations

import base64
import json
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import PullSecret
from nodepool_k8s.core.errors import LaunchError
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.driver.kubernetes import manifests
from tests.e2e.util import admin_api
from tests.helpers import wait_for
from tests.kubernetes.conftest import ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

NAMESPACE = "main-0000000000"
DOCKER_JSON = "kubernetes.io/dockerconfigjson"
REGISTRY = PullSecret("registry-credentials", "registries")
MIRROR = PullSecret("mirror", "registries")


def docker_config(host: str = "registry.example.com", padding: int = 0) -> dict[str, str]:
    config = {"auths": {host: {"auth": base64.b64encode(b"ci:s3cret").decode()}},
              "padding": "x" * padding}
    return {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}


def place(sim: Simulator, name: str, kind: str = DOCKER_JSON,
          data: dict[str, str] | None = None, namespace: str = "registries") -> None:
    """The operator's Secret, with a label and an annotation that must not be copied."""
    core = admin_api(sim)
    if sim.get("namespaces", namespace) is None:
        core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": name, "labels": {"origin": "ops"},
                     "annotations": {"owner": "registry-team"}},
        "type": kind, "data": data if data is not None else docker_config()})
    sim.reset_counters()  # the counters show what the launcher sent, not this


def _launch(provider: Any, label: str, **kw: Any) -> Any:
    return provider.launch(make_spec(provider.config, label, **kw), threading.Event())


def _no_node_namespace(sim: Simulator) -> bool:
    return sim.get("namespaces", NAMESPACE) is None


def test_copied_and_named_in_the_pod(sim: Simulator,
                                     make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    place(sim, MIRROR.name, "kubernetes.io/dockercfg",
          {".dockercfg": base64.b64encode(b'{"mirror.example.com": {}}').decode()})
    place(sim, "not-named")
    label = make_label(image_pull_secrets=(REGISTRY, MIRROR))
    provider = make_k8s_provider(sim, label)
    result = _launch(provider, label.name)
    assert result.external_id == NAMESPACE
    pod = sim.get("pods", label.name, NAMESPACE)
    assert pod is not None
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"},
                                               {"name": "mirror"}]
    account = sim.get("serviceaccounts", manifests.SERVICE_ACCOUNT, NAMESPACE)
    assert account is not None
    for pull in (REGISTRY, MIRROR):
        source = sim.get("secrets", pull.name, pull.namespace)
        copy = sim.get("secrets", pull.name, NAMESPACE)
        assert source is not None and copy is not None
        assert (copy["type"], copy["data"]) == (source["type"], source["data"])
        # Our labels (those of every object of the node), none of the source's metadata.
        assert copy["metadata"]["labels"] == account["metadata"]["labels"]
        assert manifests.ownership_problem(copy, provider.name, provider.installation_id,
                                           "0000000000") is None
        assert "annotations" not in copy["metadata"] or \
            "owner" not in copy["metadata"]["annotations"]
    # Only what was named: two copies, not the third Secret of the namespace.
    assert sorted(s["metadata"]["name"] for s in sim.list("secrets", NAMESPACE)) == [
        "mirror", "registry-credentials"]


def test_verbatim_spec_gets_the_copies_too(sim: Simulator,
                                           make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    spec = {"containers": [{"name": "main", "image": "registry.example.com/ci:1"}],
            "imagePullSecrets": [{"name": "node-local"}]}
    label = make_label("raw", spec=spec, image_pull_secrets=(REGISTRY,))
    _launch(make_k8s_provider(sim, label), "raw")
    pod = sim.get("pods", "raw", NAMESPACE)
    assert pod is not None and pod["spec"]["imagePullSecrets"] == [
        {"name": "node-local"}, {"name": "registry-credentials"}]
    assert sim.get("secrets", REGISTRY.name, NAMESPACE) is not None


@pytest.mark.parametrize("kind,data,reason,fragment", [
    (None, None, "PullSecretMissing",
     "image pull Secret registries/registry-credentials does not exist"),
    ("Opaque", {"password": base64.b64encode(b"hunter2").decode()}, "PullSecretRefused",
     "its type is 'Opaque'; only kubernetes.io/dockerconfigjson and"
     " kubernetes.io/dockercfg Secrets are copied"),
    (DOCKER_JSON, docker_config(padding=S.MAX_PULL_SECRET_BYTES), "PullSecretRefused",
     f"bytes, over the {S.MAX_PULL_SECRET_BYTES} allowed"),
])
def test_refused_sources_fail_the_attempt_for_good(
        sim: Simulator, make_k8s_provider: ProviderFactory, kind: str | None,
        data: dict[str, str] | None, reason: str, fragment: str) -> None:
    if kind is not None:
        place(sim, REGISTRY.name, kind, data)
    label = make_label(image_pull_secrets=(REGISTRY,))
    provider = make_k8s_provider(sim, label)
    with pytest.raises(LaunchError) as info:
        _launch(provider, label.name)
    assert info.value.reason == reason and not info.value.retryable
    assert fragment in str(info.value)
    assert sim.counters.get("create secrets", 0) == 0 and sim.counters.get(
        "create pods", 0) == 0
    wait_for(lambda: _no_node_namespace(sim), message="the attempt's namespace removed")


def test_api_errors_on_the_source_are_retried(sim: Simulator,
                                              make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    label = make_label(image_pull_secrets=(REGISTRY,))
    provider = make_k8s_provider(sim, label, api_retries=3)
    sim.fail_next("get", "secrets", count=2, code=503)
    sim.fail_next("create", "secrets", count=1, code=500)
    assert _launch(provider, label.name).external_id == NAMESPACE
    assert sim.counters["create secrets"] == 2
    assert sim.get("secrets", REGISTRY.name, NAMESPACE) is not None


def test_a_lost_create_answer_meets_our_own_copy(sim: Simulator,
                                                 make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    label = make_label(image_pull_secrets=(REGISTRY,))
    provider = make_k8s_provider(sim, label, api_timeout=1.5, api_retries=1)
    sim.stall_next("create", "secrets", seconds=4.0)
    assert _launch(provider, label.name).external_id == NAMESPACE
    assert sim.counters["create secrets"] == 2  # the retry met the first try's copy (409)
    assert len(sim.list("secrets", NAMESPACE)) == 1


def test_a_409_on_someone_elses_secret_is_not_accepted(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    label = make_label(image_pull_secrets=(REGISTRY,))
    provider = make_k8s_provider(sim, label, api_timeout=1.5, api_retries=1)

    # The first create applies but its answer is lost; before the retry, the copy is
    # swapped for a Secret without our labels (the retry's 409 then names a stranger).
    sim.stall_next("create", "secrets", seconds=4.0)
    swapped: list[bool] = []

    def swap() -> bool:
        copy = sim.get("secrets", REGISTRY.name, NAMESPACE)
        if copy is None:
            return False
        sim.patch("secrets", REGISTRY.name, {"metadata": {"labels": None}},
                  namespace=NAMESPACE)
        swapped.append(True)
        return True

    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(_try_launch(provider, label.name)))
    thread.start()
    wait_for(swap, message="the first copy to exist")
    thread.join(30)
    assert swapped and outcome and isinstance(outcome[0], LaunchError), outcome
    assert outcome[0].reason == "Conflict"
    assert "is not our copy" in str(outcome[0])


def _try_launch(provider: Any, label: str) -> Any:
    try:
        return _launch(provider, label)
    except LaunchError as exc:
        return exc


def test_forbidden_on_the_source_is_reported(sim: Simulator,
                                             make_k8s_provider: ProviderFactory) -> None:
    place(sim, REGISTRY.name)
    label = make_label(image_pull_secrets=(REGISTRY,))
    provider = make_k8s_provider(sim, label)
    sim.fail_next("get", "secrets", count=1, code=403)
    with pytest.raises(LaunchError) as info:
        _launch(provider, label.name)
    assert info.value.reason == "Forbidden" and not info.value.retryable
    assert "read image pull Secret registries/registry-credentials" in str(info.value)


def test_simulator_wants_the_json_key_of_a_registry_secret(sim: Simulator) -> None:
    with pytest.raises(ApiException) as info:
        place(sim, "broken", DOCKER_JSON, {"other": base64.b64encode(b"{}").decode()})
    assert info.value.status == 422 and "data[.dockerconfigjson]" in str(info.value.body)
    with pytest.raises(ApiException) as info:
        place(sim, "broken", DOCKER_JSON,
              {".dockerconfigjson": base64.b64encode(b"not json").decode()})
    assert info.value.status == 422 and "secret contents redacted" in str(info.value.body)
