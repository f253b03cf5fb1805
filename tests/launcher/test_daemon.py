"""The composition root: readiness, graceful stop (requests handed back, launches
cancelled, components unregistered), reload (pools added, removed, limits changed, paused
requests that became impossible declined), and the read-only views it exposes."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory, make_config

ONE = """
labels:
  - name: small
  - name: big
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: {max_servers}
        labels:
          - name: small
            type: namespace
            launch-delay: {delay}
"""

TWO = ONE + """
  - name: extra
    driver: fake
    pools:
      - name: gpu
        labels:
          - name: big
            type: pod
"""


def test_ready_and_views(launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher = launchers(ONE.format(max_servers=5, delay=0.0), start=False)
    assert not launcher.ready
    assert launcher.start()
    assert launcher.ready and launcher.wait_ready(1)
    zuul.run_build(["small"])
    rows = launcher.reader.nodes()
    assert all(isinstance(r.node, model.Node) for r in rows)
    assert [c.id for c in launcher.reader.pool_components()] == \
        [c.id for c in launcher.component_cache.pools()]
    launcher.stop()
    assert not launcher.ready


def test_graceful_stop_hands_requests_back(launchers: LauncherFactory, zuul: ZuulClient,
                                           kazoo_client: KazooClient) -> None:
    first = launchers(ONE.format(max_servers=5, delay=30.0))
    request_id = zuul.submit(["small"])
    wait_for(lambda: (zuul.get_request(request_id) or {}).get("state") == "pending", 10)
    wait_for(lambda: first.node_cache.ids(), 10)
    abandoned = first.node_cache.ids()[0]
    first.stop()  # the 30 s launch is cancelled, not waited for
    body = zuul.get_request(request_id)
    assert body is not None and body["state"] == "requested"
    assert body["nodes"] == [] and body["declined_by"] == []
    assert kazoo_client.get_children(paths.POOL_COMPONENTS) == []
    assert kazoo_client.get_children(paths.request_lock_path(request_id)) == []
    second = launchers(ONE.format(max_servers=5, delay=0.0))
    result = zuul.wait(request_id, 20)
    assert result is not None and result["state"] == "fulfilled"
    wait_for(lambda: zuul.get_node(abandoned) is None, 15, message="abandoned node removed")
    assert second.ready


def test_reload_adds_and_removes_pools(zk: ZkConnection, launchers: LauncherFactory,
                                       zuul: ZuulClient) -> None:
    launcher = launchers(ONE.format(max_servers=5, delay=0.0))
    assert len(launcher.component_cache.pools()) == 1
    launcher.reload(make_config(zk, TWO.format(max_servers=5, delay=0.0)))
    wait_for(lambda: len(launcher.component_cache.pools()) == 2, 10)
    request_id = zuul.submit(["big"])
    result = zuul.wait(request_id, 20)
    assert result is not None and result["state"] == "fulfilled"
    assert zuul.get_node(result["nodes"][0])["provider"] == "extra"  # type: ignore[index]
    zuul.cancel(request_id)
    launcher.reload(make_config(zk, ONE.format(max_servers=5, delay=0.0)))
    wait_for(lambda: [c.provider_name for c in launcher.component_cache.pools()] == ["fake"],
             10)
    assert "extra" not in launcher.providers


def paused_pool(launchers: LauncherFactory,
                zuul: ZuulClient) -> tuple[Launcher, Any, str]:
    """A launcher whose only pool (max-servers 1) is full: its node held by Zuul (the
    nodeset, to return at the end) and a second request waiting (its id)."""
    launcher = launchers(ONE.format(max_servers=1, delay=0.0))
    held = zuul.submit(["small"])
    assert (zuul.wait(held) or {}).get("state") == "fulfilled"
    nodeset = zuul.accept(held)
    waiting = zuul.submit(["small"])
    wait_for(lambda: any(c.paused for c in launcher.component_cache.pools()), 10)
    return launcher, nodeset, waiting


def test_reload_declines_paused_request_that_became_impossible(
        zk: ZkConnection, launchers: LauncherFactory, zuul: ZuulClient) -> None:
    launcher, nodeset, waiting = paused_pool(launchers, zuul)
    launcher.reload(make_config(zk, ONE.format(max_servers=0, delay=0.0)))
    result = zuul.wait(waiting, 20)
    assert result is not None and result["state"] == "failed"
    zuul.use(nodeset)
    zuul.release(nodeset)


def test_a_request_of_a_removed_pool_is_handed_back_not_declined(
        zk: ZkConnection, launchers: LauncherFactory, zuul: ZuulClient) -> None:
    """A reload sets the new configuration first, then stops the removed pools' workers,
    which hand their requests back. A handler advanced in between saw its pool gone and
    declined: renaming a pool during a burst failed 9 requests of 30."""
    launcher, nodeset, waiting = paused_pool(launchers, zuul)
    renamed = make_config(zk, ONE.format(max_servers=5, delay=0.0).replace(
        "- name: main", "- name: other"))
    # The window inside reload: the new configuration is in force while the old worker
    # still holds the request (its pass, or a launch thread, advances the handler).
    worker = next(iter(launcher.pool_workers.values()))
    handler = worker.handlers[waiting]
    launcher.engine.set_config(launcher._with_installation_id(renamed))
    handler.advance(may_allocate=True)
    assert not handler.done
    assert (zuul.get_request(waiting) or {}).get("state") == "pending"
    launcher.reload(renamed)
    result = zuul.wait(waiting, 20)
    assert result is not None and result["state"] == "fulfilled"
    assert zuul.get_node(result["nodes"][0])["pool"] == "other"  # type: ignore[index]
    zuul.use(nodeset)
    zuul.release(nodeset)


def test_launcher_over_tls(zk_tls: ZkConnection) -> None:
    """The launcher talks to ZooKeeper over TLS with client certificates (Nodepool's norm)."""
    assert zk_tls.tls_ca and zk_tls.tls_cert and zk_tls.tls_key
    launcher = Launcher(make_config(zk_tls, ONE.format(max_servers=5, delay=0.0)),
                        settings=TEST_SETTINGS)
    assert launcher.start()
    try:
        with ZuulClient(zk_tls.hosts, tls=(zk_tls.tls_ca, zk_tls.tls_cert,
                                           zk_tls.tls_key)) as zuul:
            request_id, nodes = zuul.run_build(["small"])
            assert len(nodes) == 1
    finally:
        launcher.stop()
