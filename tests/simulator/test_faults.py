"""Fault injection: latency, random errors, stalls, one-shot failures, pod and namespace faults."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import Faults, Simulator
from nodepool_k8s.dev.simulator.api import Api
from nodepool_k8s.dev.simulator.faults import FaultInjector
from tests.helpers import Signal
from tests.simulator.conftest import Kube, pod_body


def waiting_reason(kube: Kube, name: str, ns: str) -> str | None:
    pod = kube.core.read_namespaced_pod(name, ns)
    for status in pod.status.container_statuses or []:
        if status.state.waiting:
            return str(status.state.waiting.reason)
    return None


def test_latency_is_added_to_each_call(make_sim: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The waits the API handler makes (each one a real wait, cut short only by shutdown)
    # are recorded: the latency is observed as the delay applied, not by the wall clock.
    waits: list[float] = []
    real_sleep = Api._sleep

    def sleep(self: Api, seconds: float) -> None:
        waits.append(seconds)
        real_sleep(self, seconds)

    monkeypatch.setattr(Api, "_sleep", sleep)
    sim, kube = make_sim(faults=Faults(latency=0.2))
    kube.core.list_namespace()
    assert [w for w in waits if w] == [0.2]
    sim.set_faults(latency=0)
    assert sim.faults.latency == 0
    waits.clear()
    kube.core.list_namespace()
    assert waits and not any(waits), waits  # the call went through, without a delay


def test_errors_are_real_status_bodies(kube: Kube, k8s_sim: Simulator) -> None:
    k8s_sim.set_faults(error_rate=1.0, error_codes=(500,))
    with pytest.raises(ApiException) as info:
        kube.core.list_namespace()
    body = json.loads(info.value.body)
    assert info.value.status == 500 and body["reason"] == "InternalError"
    k8s_sim.set_faults(error_codes=(429,), retry_after=0)
    k8s_sim.reset_counters()
    with pytest.raises(ApiException) as info:
        kube.core.list_namespace()
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "0"
    assert json.loads(info.value.body)["reason"] == "TooManyRequests"
    # urllib3 under the client retried the 429 three times by itself (Retry-After present).
    assert k8s_sim.counters["list namespaces"] == 4
    k8s_sim.set_faults(error_rate=0)
    kube.core.list_namespace()


def test_random_errors_are_reproducible_with_a_seed() -> None:
    def pattern(seed: int) -> list[int | None]:
        injector = FaultInjector(Faults(error_rate=0.5, seed=seed))
        return [injector.decide("get", "pods").error_code for _ in range(40)]
    assert pattern(7) == pattern(7)
    assert pattern(7) != pattern(8)
    assert {500, 429, None} == set(pattern(7))


def test_error_rate_through_the_server(make_sim: Any) -> None:
    sim, kube = make_sim(faults=Faults(error_rate=0.5, error_codes=(500, 504), seed=3))
    outcomes = []
    for _ in range(30):
        try:
            kube.core.list_namespace()
            outcomes.append(200)
        except ApiException as exc:
            outcomes.append(exc.status)
    assert {200, 500, 504} == set(outcomes)
    assert sim.counters["list namespaces"] == 30


def test_timeouts_stall_until_the_client_gives_up(kube: Kube, k8s_sim: Simulator) -> None:
    k8s_sim.set_faults(timeout_rate=1.0, timeout_seconds=5)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kube.core.create_namespace({"metadata": {"name": "late"}}, _request_timeout=0.3)
    # The request was applied; only the answer was lost (the nastiest case for a client).
    assert k8s_sim.get("namespaces", "late") is not None
    k8s_sim.set_faults(timeout_rate=0)
    kube.core.read_namespace("late")


def test_fail_next_is_deterministic_and_one_shot(kube: Kube, k8s_sim: Simulator) -> None:
    k8s_sim.fail_next("create", "namespaces", count=2, code=503)
    k8s_sim.fail_next("get", "secrets", code=404)
    for _ in range(2):
        with pytest.raises(ApiException) as info:
            kube.core.create_namespace({"metadata": {"name": "x"}})
        assert info.value.status == 503
    kube.core.create_namespace({"metadata": {"name": "x"}})
    kube.core.list_namespace()  # other verbs are unaffected
    with pytest.raises(ApiException) as info:
        kube.core.read_namespaced_secret("s", "x")
    assert info.value.status == 404
    k8s_sim.fail_next("replace", "configmaps", code=409)
    kube.core.create_namespaced_config_map("x", {"metadata": {"name": "c"}})
    with pytest.raises(ApiException) as info:
        kube.core.replace_namespaced_config_map("c", "x", {"metadata": {"name": "c"}})
    assert info.value.status == 409 and json.loads(info.value.body)["reason"] == "Conflict"


def test_counters(kube: Kube, k8s_sim: Simulator) -> None:
    k8s_sim.reset_counters()
    kube.core.create_namespace({"metadata": {"name": "cnt"}})
    kube.core.create_namespaced_service_account("cnt", {"metadata": {"name": "sa"}})
    kube.core.create_namespaced_service_account_token("sa", "cnt", {"spec": {}})
    with pytest.raises(ApiException):
        kube.core.read_namespaced_secret("nope", "cnt")
    kube.core.list_namespaced_pod("cnt", watch=True, timeout_seconds=1, _preload_content=False
                                  ).release_conn()
    counts = k8s_sim.counters
    assert counts["create namespaces"] == 1 and counts["create serviceaccounts"] == 1
    assert counts["create serviceaccounts/token"] == 1 and counts["get secrets"] == 1
    assert counts["watch pods"] == 1 and counts["total"] == 5
    k8s_sim.reset_counters()
    assert k8s_sim.counters == {}


def test_image_pull_failure_then_recovery(kube: Kube, k8s_sim: Simulator, changes: Signal) -> None:
    k8s_sim.set_faults(image_pull_fail=("registry.example/*",))
    kube.core.create_namespace({"metadata": {"name": "img"}})
    kube.core.create_namespaced_pod("img", pod_body("bad", image="registry.example/app:1"))
    kube.core.create_namespaced_pod("img", pod_body("good"))
    changes.until(lambda: waiting_reason(kube, "bad", "img") == "ImagePullBackOff")
    pod = kube.core.read_namespaced_pod("bad", "img")
    assert pod.status.phase == "Pending" and pod.spec.node_name == "sim-node-1"
    changes.until(lambda: kube.core.read_namespaced_pod("good", "img").status.phase == "Running")
    k8s_sim.set_faults(image_pull_fail=())
    changes.until(lambda: kube.core.read_namespaced_pod("bad", "img").status.phase == "Running")


def test_err_image_pull_comes_before_back_off(make_sim: Any, changes: Signal) -> None:
    sim, kube = make_sim(image_pull_backoff_delay=0.5, faults=Faults(image_pull_fail=("bad",)))
    kube.core.create_namespace({"metadata": {"name": "img"}})
    kube.core.create_namespaced_pod("img", pod_body("p", image="bad"))
    changes.until(lambda: waiting_reason(kube, "p", "img") == "ErrImagePull")
    changes.until(lambda: waiting_reason(kube, "p", "img") == "ImagePullBackOff")


def test_unschedulable_fault(kube: Kube, k8s_sim: Simulator, changes: Signal) -> None:
    k8s_sim.set_faults(unschedulable=True)
    kube.core.create_namespace({"metadata": {"name": "un"}})
    kube.core.create_namespaced_pod("un", pod_body("p"))

    def reason() -> str | None:
        conditions = kube.core.read_namespaced_pod("p", "un").status.conditions or []
        return next((c.reason for c in conditions if c.type == "PodScheduled"), None)
    changes.until(lambda: reason() == "Unschedulable")
    assert kube.core.read_namespaced_pod("p", "un").spec.node_name is None
    k8s_sim.set_faults(unschedulable=False)
    changes.until(lambda: kube.core.read_namespaced_pod("p", "un").status.phase == "Running")


def test_namespace_delete_hang(kube: Kube, k8s_sim: Simulator, changes: Signal) -> None:
    k8s_sim.set_faults(namespace_delete_hang=True)
    kube.core.create_namespace({"metadata": {"name": "stuck"}})
    kube.core.delete_namespace("stuck")
    k8s_sim.set_faults(latency=0)  # other changes re-check, but the hang holds
    assert kube.core.read_namespace("stuck").status.phase == "Terminating"
    k8s_sim.set_faults(namespace_delete_hang=False)
    changes.until(lambda: k8s_sim.get("namespaces", "stuck") is None)


def test_quota_exceeded_always_and_for_next_n(kube: Kube, k8s_sim: Simulator) -> None:
    kube.core.create_namespace({"metadata": {"name": "q"}})
    k8s_sim.set_faults(quota_exceeded=True)
    for name in ("a", "b"):
        with pytest.raises(ApiException) as info:
            kube.core.create_namespaced_pod("q", pod_body(name))
        body = json.loads(info.value.body)
        assert info.value.status == 403 and body["reason"] == "Forbidden"
        assert body["message"].startswith(f'pods "{name}" is forbidden: exceeded quota: ')
    kube.core.create_namespaced_config_map("q", {"metadata": {"name": "cm"}})  # pods only
    k8s_sim.set_faults(quota_exceeded=2)
    for name in ("c", "d"):
        with pytest.raises(ApiException):
            kube.core.create_namespaced_pod("q", pod_body(name))
    kube.core.create_namespaced_pod("q", pod_body("e"))
    assert k8s_sim.faults.quota_exceeded is False
    k8s_sim.fail_next("create", "pods", code=403)
    with pytest.raises(ApiException) as info:
        kube.core.create_namespaced_pod("q", pod_body("f"))
    assert "exceeded quota" in info.value.body


def test_fault_settings_api(k8s_sim: Simulator) -> None:
    assert k8s_sim.faults == Faults()
    changed = k8s_sim.set_faults(latency=0.01, image_pull_fail=["x"])
    assert changed.image_pull_fail == ("x",) and k8s_sim.faults.latency == 0.01
    with pytest.raises(TypeError):
        k8s_sim.set_faults(no_such_fault=True)
    k8s_sim.clear_faults()
    assert k8s_sim.faults == Faults()


def test_rewrite_next_changes_the_answer_not_the_write(kube: Kube, k8s_sim: Simulator) -> None:
    k8s_sim.rewrite_next("create", "namespaces", lambda body: ["not", "an", "object"])
    response = kube.core.create_namespace({"metadata": {"name": "rw"}},
                                          _preload_content=False)
    assert json.loads(response.data) == ["not", "an", "object"]
    assert k8s_sim.get("namespaces", "rw") is not None  # applied all the same
    assert kube.core.read_namespace("rw").metadata.name == "rw"  # one-shot
