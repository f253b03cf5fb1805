"""Capacity awareness from a ResourceQuota (`capacity: {resource-quota: NS/NAME}`), end to end
with the shipped RBAC: the launcher authenticates as the deployment's service account, RBAC
enforced, with etc/kubernetes/launcher-rbac.yaml and launcher-capacity-rbac.yaml applied.

Aspects:
- the share (`nodepool-capacity/launcher-share`) allows 2 cpu; someone else's pod in that
  namespace requests 1 (`used`): a label of 4 cpu can never fit (Validated
  LabelExceedsLimits, its requests declined) and Capacity reads Constrained (it is short
  of the quota, the 1-cpu label has room);
- one node of the 1-cpu label is launched; the second request waits (the pool pauses, Quota
  AtLimit in scope cloud) rather than creating a pod the quota leaves no room for;
- the other pod deleted, `used` drops: the quota watch wakes the pool and the request is
  served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.e2e.test_capacity import capacity_is, pool_record
from tests.e2e.test_guards import DEPLOYMENT_YAML, RBAC_YAML, kubectl, needs_kubectl
from tests.e2e.test_pool_status import condition
from tests.e2e.util import admin_api
from tests.helpers import replaced, wait_for
from tests.launchers import LauncherFactory

CAPACITY_RBAC_YAML = RBAC_YAML.parent / "launcher-capacity-rbac.yaml"
SHARE = ("nodepool-capacity", "launcher-share")

CONFIG = """
labels:
  - name: app
  - name: big
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    job-role: cluster-role
    boot-timeout: 60
    api-backoff: [0.01, 0.02]
    capacity:
      resource-quota: nodepool-capacity/launcher-share
    pools:
      - name: main
        labels:
          - name: app
            type: pod
            image: docker.io/fedora:40
            cpu: 1
            memory: 256
          - name: big
            type: pod
            image: docker.io/fedora:40
            cpu: 4
            memory: 256
"""


@pytest.fixture
def quota_account(k8s_sim: Simulator, tmp_path: Path,
                  monkeypatch: pytest.MonkeyPatch) -> Simulator:
    """The shipped RBAC, deployment and capacity RBAC applied; $KUBECONFIG authenticates as
    the deployment's service account, RBAC enforced; the share cut to 2 cpu, half of it
    used by someone else's pod."""
    # The shipped share, cut down to a size one test can fill.
    share = replaced(replaced(CAPACITY_RBAC_YAML.read_text(), 'requests.cpu: "64"',
                              'requests.cpu: "2"'), "requests.memory: 256Gi",
                     "requests.memory: 4Gi")
    (tmp_path / "capacity.yaml").write_text(share)
    for path in (RBAC_YAML, DEPLOYMENT_YAML, tmp_path / "capacity.yaml"):
        assert "created" in kubectl(k8s_sim, "apply", "-f", str(path))
    core = admin_api(k8s_sim)
    core.create_namespaced_pod(SHARE[0], {
        "metadata": {"name": "other"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
            "requests": {"cpu": "1", "memory": "128Mi"}}}]}})
    token = kubectl(k8s_sim, "create", "token", "nodepool-launcher", "-n", "nodepool",
                    "--duration=1h").strip()
    path = k8s_sim.write_kubeconfig(tmp_path / "launcher-kubeconfig", token=token)
    monkeypatch.setenv("KUBECONFIG", path)
    k8s_sim.config.enforce_rbac = True
    return k8s_sim


def _state(zuul: ZuulClient, request_id: str) -> Any:
    return (zuul.get_request(request_id) or {}).get("state")


@needs_kubectl
def test_resource_quota_share_bounds_the_pool(quota_account: Simulator,
                                              launchers: LauncherFactory,
                                              zuul: ZuulClient) -> None:
    launcher = launchers(CONFIG)
    wait_for(lambda: capacity_is(launcher, "Constrained"), 15,
             message="Capacity from the ResourceQuota watch")
    record = pool_record(launcher)
    assert record is not None
    assert record["capacity"]["labels"]["big"]["quota_short"] == ["cores"]
    assert record["capacity"]["labels"]["app"]["available"] is True
    validated = condition(record, "Validated")
    assert validated["reason"] == "LabelExceedsLimits" and "big" in validated["message"]
    big = zuul.submit(["big"])
    body = zuul.wait(big, 30)
    assert body is not None and body["state"] == "failed"

    first = zuul.submit(["app"])
    body = zuul.wait(first, 60)
    assert body is not None and body["state"] == "fulfilled"
    second = zuul.submit(["app"])
    wait_for(lambda: (pool_record(launcher) or {}).get("requests_queued") == 1
             and condition(pool_record(launcher) or {}, "Quota")["reason"] == "AtLimit", 30,
             message="the second request held at the quota")
    assert "cloud" in condition(pool_record(launcher) or {}, "Quota")["message"]
    assert _state(zuul, second) == "pending"

    admin_api(quota_account).delete_namespaced_pod("other", SHARE[0])
    body = zuul.wait(second, 60)
    assert body is not None and body["state"] == "fulfilled"
