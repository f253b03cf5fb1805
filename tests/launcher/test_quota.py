"""Quotas end to end: pool and provider limits pause the pool (never exceeded, sampled by a
watcher), paused requests are served in order as capacity frees, tenant limits defer
without declining, requests that can never fit are declined, a full pool reclaims an idle
node of another label. The cloud refusing for quota (the node aborted and launched again)
is stepped on its own in tests/launcher/requests/."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import replaced, wait_for
from tests.launchers import LauncherFactory
from tests.launcher.util import NodeCounter


LIMITED = """
labels:
  - name: small
  - name: other
tenant-resource-limits:
  - tenant-name: limited
    max-servers: 1
providers:
  - name: fake
    driver: fake
    max-servers: {provider_max}
    pools:
      - name: one
        max-servers: {pool_max}
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
          - name: other
            type: namespace
      - name: two
        max-servers: {pool_max}
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
"""


def test_pool_limit_pauses_then_serves_in_order(launchers: LauncherFactory, zuul: ZuulClient,
                                                kazoo_client: KazooClient) -> None:
    counter = NodeCounter(kazoo_client)
    body = replaced(
        LIMITED.format(provider_max=100, pool_max=2),
        "      - name: two\n        max-servers: 2\n        labels:\n          - name: small\n"
        "            type: namespace\n            launch-delay: 0.02\n", "")
    launcher = launchers(body)
    held = [zuul.accept(wait_fulfilled(zuul, zuul.submit(["small"]))) for _ in range(2)]
    # The pool is full: it accepts the next request, pauses and says so in its component.
    first = zuul.submit(["small"], priority="200")
    wait_for(lambda: any(c.paused for c in launcher.component_cache.pools()), 10,
             message="pool paused")
    assert zuul.get_request(first)["state"] == "pending"  # type: ignore[index]
    low = zuul.submit(["small"], priority="300")
    high = zuul.submit(["small"], priority="100")
    for nodeset in held:
        zuul.use(nodeset)
        zuul.release(nodeset)
    # The paused request goes first, then the higher priority; the low one waits again.
    wait_fulfilled(zuul, first)
    wait_fulfilled(zuul, high)
    assert zuul.get_request(low)["state"] in ("requested", "pending")  # type: ignore[index]
    for request_id in (first, high):
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)
    wait_fulfilled(zuul, low)
    zuul.cancel(low)
    wait_for(lambda: not any(c.paused for c in launcher.component_cache.pools()), 10)
    assert counter.max.get("fake", 0) <= 2
    # Exact, unlike the sampling watcher: the cloud never held more than the pool allows.
    assert launcher.providers["fake"].peak_resources() == 2  # type: ignore[attr-defined]


def wait_fulfilled(zuul: ZuulClient, request_id: str, timeout: float = 20) -> str:
    body = zuul.wait(request_id, timeout)
    assert body is not None and body["state"] == "fulfilled", body
    return request_id


def test_provider_limit_across_pools(launchers: LauncherFactory, zuul: ZuulClient,
                                     kazoo_client: KazooClient) -> None:
    counter = NodeCounter(kazoo_client)
    launchers(LIMITED.format(provider_max=3, pool_max=3))
    errors: list[BaseException] = []

    def build() -> None:
        try:
            zuul.run_build(["small"], timeout=60)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(15)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors
    assert counter.max["fake"] <= 3


def test_tenant_limit_defers(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(LIMITED.format(provider_max=100, pool_max=10))
    first = wait_fulfilled(zuul, zuul.submit(["small"], tenant_name="limited"))
    second = zuul.submit(["small"], tenant_name="limited")
    other = wait_fulfilled(zuul, zuul.submit(["small"], tenant_name="free"))
    # The other tenant was served while `second` stays untouched: deferred, not declined.
    body = zuul.get_request(second)
    assert body is not None and body["state"] == "requested"
    assert body.get("declined_by", []) == []
    assert not any(c.paused for c in launcher.component_cache.pools())
    nodeset = zuul.accept(first)
    zuul.use(nodeset)
    zuul.release(nodeset)
    wait_fulfilled(zuul, second)
    zuul.cancel(other)


def test_never_fits_is_declined(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launchers(LIMITED.format(provider_max=2, pool_max=5))
    request_id = zuul.submit(["small", "small", "small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "failed"
    assert len(body["declined_by"]) == 2  # both pools declined, then it failed


def test_full_pool_reclaims_idle_node_of_other_label(launchers: LauncherFactory,
                                                     zuul: ZuulClient) -> None:
    body = LIMITED.format(provider_max=1, pool_max=1)
    launcher = launchers(body)
    # Make an idle ready node of label "other": a request cancelled once fulfilled.
    idle = wait_fulfilled(zuul, zuul.submit(["other"]))
    idle_node = zuul.get_request(idle)["nodes"][0]  # type: ignore[index]
    zuul.cancel(idle)
    wait_for(lambda: (zuul.get_node(idle_node) or {}).get("allocated_to", "x") is None, 10,
             message="idle node de-allocated")
    request_id = wait_fulfilled(zuul, zuul.submit(["small"]))
    assert zuul.get_node(idle_node) is None
    assert zuul.get_request(request_id)["nodes"] != [idle_node]  # type: ignore[index]
    assert launcher.deleter.deleted >= 1
