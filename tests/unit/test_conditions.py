"""Pure parts of the lifecycle conditions: update rules, failure placement, timings, the
bounded reason set, the spec-request quota of verbatim pod specs."""

from __future__ import annotations

from typing import Any

from nodepool_k8s.core import conditions as cond
from nodepool_k8s.views import listing
from nodepool_k8s.config import quantity
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.core.model import Node


def test_transition_time_moves_with_the_status_or_the_reason() -> None:
    first = cond.update([], cond.Condition(cond.LAUNCHED, cond.UNKNOWN, "Pending", "", 1.0))
    same = cond.update(first, cond.Condition(cond.LAUNCHED, cond.UNKNOWN, "Pending", "x", 5.0))
    assert same[0].last_transition_time == 1.0 and same[0].message == "x"
    retrying = cond.update(same, cond.Condition(cond.LAUNCHED, cond.UNKNOWN, "Retrying",
                                                "attempt 2/3", 6.0))
    assert retrying[0].last_transition_time == 6.0  # since the retry, not the first try
    done = cond.update(retrying, cond.Condition(cond.LAUNCHED, cond.TRUE, "NamespaceCreated",
                                                "", 7.0))
    assert done[0].last_transition_time == 7.0


def test_node_records_keep_messages_to_the_limit_pools_whole() -> None:
    long = cond.Condition(cond.LAUNCHED, cond.FALSE, "Forbidden", "x" * 1000, 1.0)
    node = Node.from_dict("1", {"state": "building"})
    node.set_condition(long)
    assert len(node.to_dict()["conditions"][0]["message"]) == cond.MESSAGE_LIMIT
    [pool] = cond.serialise([long], time_key=cond.POOL_TIME_KEY, message_limit=None)
    assert len(pool["message"]) == 1000 and pool["last_transition"] == 1.0
    assert cond.parse([pool], time_key=cond.POOL_TIME_KEY) == [long]


def test_failure_marks_the_first_incomplete_phase_and_restart_resets() -> None:
    now = 10.0
    conditions = cond.initial(now)
    conditions = cond.update(conditions, cond.Condition(cond.LAUNCHED, cond.TRUE, "x", "", 11))
    failed = cond.fail(conditions, "ImagePullBackOff", "image foo:1", 12.0)
    assert [(c.type, c.status) for c in failed] == [
        (cond.LAUNCHED, cond.TRUE), (cond.REGISTERED, cond.FALSE),
        (cond.INITIALIZED, cond.UNKNOWN), (cond.READY, cond.UNKNOWN)]
    assert cond.failure(failed) == failed[1]
    assert cond.fail(conditions, "made-up", "", 12.0)[1].reason == "Unknown"  # bounded
    again = cond.restart(failed, 13.0, "attempt 2/3 after ImagePullBackOff")
    assert {c.status for c in again} == {cond.UNKNOWN} and cond.failure(again) is None


def test_timings_from_transition_times() -> None:
    conditions = [cond.Condition(t, cond.TRUE, "r", "", when) for t, when in
                  ((cond.LAUNCHED, 101.0), (cond.REGISTERED, 102.5),
                   (cond.INITIALIZED, 110.0), (cond.READY, 110.25))]
    assert cond.timings(conditions, 100.0) == {
        "launch": 1.0, "register": 1.5, "initialize": 7.5, "ready": 0.25, "total": 10.25}
    assert cond.timings(conditions[:1], None) == {}


def test_every_failure_reason_says_what_to_do() -> None:
    assert all(text.strip() for text in cond.REASONS.values())
    assert {"ErrImagePull", "ImagePullBackOff", "Unschedulable", "Forbidden",
            "QuotaExceeded", "BootTimeout", "ApiError", "NotOwned"} <= cond.FAILURE_REASONS


def test_node_accessors_keep_conditions_in_an_extra_key() -> None:
    node = Node.from_dict("1", {"state": "building", "conditions": [
        {"type": "Launched", "status": "False", "reason": "Forbidden", "message": "no",
         "last_transition_time": 3.0}]})
    assert node.failure_reason == "Forbidden"
    node.set_condition(cond.Condition(cond.READY, cond.TRUE, "HandedToZuul", "", 4.0))
    data = node.to_dict()
    assert [c["type"] for c in data["conditions"]] == ["Launched", "Ready"]
    assert listing.failure_reason(data["conditions"]) == "Forbidden"
    assert listing.failure_reason(None) is None


def test_spec_requests() -> None:
    spec: dict[str, Any] = {"containers": [
        {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": 1, "memory": "512Mi"}}},
        {"name": "c"}],
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]}
    assert quantity.spec_requests(spec) == {"cpu": 2.0, "memory": 1536.0, "storage": None}


def test_spec_label_counts_its_requests() -> None:
    config = load_config_text("""
zookeeper-servers: [{host: localhost}]
labels: [{name: raw}, {name: bare}]
providers:
  - name: k8s
    driver: kubernetes
    context: c
    pools:
      - name: main
        allow-verbatim-spec: true
        default-label-cpu: 4
        default-label-memory: 4096
        labels:
          - name: raw
            type: pod
            spec:
              containers:
                - name: main
                  image: busybox
                  resources: {requests: {cpu: 250m, memory: 256Mi}}
          - name: bare
            type: pod
            spec:
              containers: [{name: main, image: busybox}]
""")
    labels = config.providers["k8s"].pools["main"].labels
    assert dict(labels["raw"].quota()) == {"instances": 1, "cores": 0.25, "ram": 256}
    # No container asks: the pool defaults (the LimitRange applies them to the pod).
    assert dict(labels["bare"].quota()) == {"instances": 1, "cores": 4, "ram": 4096}
