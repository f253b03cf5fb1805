"""Label and field selectors: the parser on its own, and through list calls."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client import ApiException

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.resources import by_plural
from nodepool_k8s.dev.simulator.selectors import field_matcher, label_matcher
from tests.helpers import Signal
from tests.simulator.conftest import Kube, pod_body

OBJS: list[dict[str, Any]] = [
    {"metadata": {"name": "a", "labels": {"env": "prod", "tier": "web", "n": "5"}}},
    {"metadata": {"name": "b", "labels": {"env": "dev", "tier": "web"}}},
    {"metadata": {"name": "c", "labels": {"env": "qa"}}},
    {"metadata": {"name": "d"}},
]


@pytest.mark.parametrize("selector,expected", [
    ("", "abcd"),
    ("env=prod", "a"),
    ("env==prod", "a"),
    ("env!=prod", "bcd"),
    ("env in (prod, dev)", "ab"),
    ("env notin (prod,dev)", "cd"),
    ("tier", "ab"),
    ("!tier", "cd"),
    ("env in (prod,dev),tier=web", "ab"),
    ("tier,env!=dev", "a"),
    ("n>3", "a"),
    ("n<3", ""),
])
def test_label_selector_grammar(selector: str, expected: str) -> None:
    match = label_matcher(selector)
    assert "".join(o["metadata"]["name"] for o in OBJS if match(o)) == expected


@pytest.mark.parametrize("selector", ["env in prod", "a=b c", "(x)", "n>x", "!a in (b)"])
def test_bad_label_selectors_are_400(selector: str) -> None:
    with pytest.raises(errors.ApiError) as info:
        label_matcher(selector)
    assert info.value.code == 400


def test_field_selector_paths_are_checked() -> None:
    pods = by_plural("pods")
    pod = {"metadata": {"name": "p", "namespace": "n"}, "spec": {"nodeName": "sim-node-1"},
           "status": {"phase": "Running"}}
    assert field_matcher("status.phase=Running,spec.nodeName=sim-node-1", pods)(pod)
    assert field_matcher("metadata.name!=q", pods)(pod)
    assert not field_matcher("metadata.namespace==other", pods)(pod)
    with pytest.raises(errors.ApiError) as info:
        field_matcher("spec.containers=x", pods)
    assert info.value.code == 400 and "field label not supported" in info.value.message
    assert field_matcher("type=Opaque", by_plural("secrets"))({"type": "Opaque",
                                                               "metadata": {"name": "s"}})


def test_selectors_through_the_client(kube: Kube, changes: Signal) -> None:
    kube.core.create_namespace({"metadata": {"name": "sel"}})
    kube.core.create_namespace({"metadata": {"name": "other"}})
    kube.core.create_namespaced_pod("sel", pod_body("one"))
    kube.core.create_namespaced_pod("sel", pod_body("two", nodeSelector={"disk": "ssd"}))
    kube.core.create_namespaced_pod("other", pod_body("three"))
    changes.until(lambda: kube.core.read_namespaced_pod("one", "sel").status.phase == "Running")

    def names(**kw: str) -> list[str]:
        return [p.metadata.name for p in kube.core.list_pod_for_all_namespaces(**kw).items]
    assert names(label_selector="app in (one,three)") == ["three", "one"]  # by ns, then name
    assert names(label_selector="app!=one") == ["three", "two"]
    assert names(field_selector="metadata.namespace=sel") == ["one", "two"]
    assert names(field_selector="metadata.name=two") == ["two"]
    assert names(field_selector="spec.nodeName=sim-node-1") == ["three", "one"]
    assert names(field_selector="status.phase=Pending") == ["two"]
    assert names(field_selector="status.phase!=Pending,metadata.namespace=sel") == ["one"]
    ns = kube.core.list_namespace(field_selector="metadata.name=sel").items
    assert [n.metadata.name for n in ns] == ["sel"]
    with pytest.raises(ApiException) as info:
        kube.core.list_namespaced_pod("sel", field_selector="spec.bogus=1")
    assert info.value.status == 400
