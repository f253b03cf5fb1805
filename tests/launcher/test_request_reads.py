"""Request reads per request with two launchers serving one pool (architecture.md, "What
the caches read"): each launcher's request cache reads a request at its creation; the
launcher that takes it writes `pending` and `fulfilled` under its lock (its own writes
are echoed, not read); the other one leaves those changes unread while that lock is there
and reads the request once when it goes (the `fulfilled` write releases it in the same
transaction). So both launchers together read a request about three times, where reading
every change cost about four (creation twice, `pending` and `fulfilled` once more each).
The slack covers a creation read answered late and a change read because its lock event
came a moment after it. A request another launcher declines (lock, write, unlock in one
transaction) is read and served.
"""

from __future__ import annotations

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.core import model
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.registry import ComponentRegistry, pool_worker_id
from nodepool_k8s.zk.requests import RequestStore
from tests.helpers import ZkConnection, client_for, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory


def pool(provider: str, priority: int, max_servers: int) -> str:
    return f"""
labels:
  - name: small
providers:
  - name: {provider}
    driver: fake
    pools:
      - name: main
        priority: {priority}
        max-servers: {max_servers}
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
"""


REQUESTS = 20
BUDGET = 3.3  # reads per request, both launchers together


def test_request_reads_per_request_with_two_launchers(launchers: LauncherFactory,
                                                      zuul: ZuulClient,
                                                      kazoo_client: KazooClient) -> None:
    first, second = launchers(), launchers()
    for _ in range(2):  # warm up: lock roots, both registrations seen
        zuul.run_build(["small"])
    wait_for(lambda: not kazoo_client.get_children(paths.REQUESTS), 15)
    mirrors = [first.request_cache._mirror, second.request_cache._mirror]
    before = [m.reads for m in mirrors]
    for _ in range(REQUESTS):
        zuul.run_build(["small"])
    wait_for(lambda: not kazoo_client.get_children(paths.REQUESTS), 15)
    reads = [m.reads - b for m, b in zip(mirrors, before)]
    skipped = [m.skipped for m in mirrors]
    print(f"request-cache reads of {REQUESTS} requests, per launcher: {reads}; "
          f"changes left unread: {skipped}")
    assert sum(reads) <= BUDGET * REQUESTS, reads


def test_a_request_another_launcher_declines_is_read_and_served(
        launchers: LauncherFactory, zuul: ZuulClient) -> None:
    """The preferred pool (priority 1) cannot ever fit two nodes and declines: its decline
    is written under its lock, which the other launcher's cache leaves unread until the
    lock goes in the same transaction; then that launcher serves the request."""
    preferred = launchers(pool("first", 1, 1))
    other = launchers(pool("second", 50, 5))
    wait_for(lambda: len(other.component_cache.pools()) == 2, 10)
    request_id = zuul.submit(["small", "small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled", body
    assert body["declined_by"] == [c.id for c in preferred.component_cache.pools()
                                   if c.provider_name == "first"]
    assert other.request_cache._mirror.skipped >= 1  # the decline, left unread at first


def test_a_request_whose_holder_dies_is_served(launchers: LauncherFactory, zuul: ZuulClient,
                                               zk: ZkConnection) -> None:
    """Another launcher (a session with a registered pool of the request's preferred
    provider) takes the request, writes `pending` under its lock and dies: the pending
    write, left unread under its lock, is read when its contender goes with the session,
    the request is reset at once (no full cleanup pass is due for an hour) and served."""
    launcher = launchers(pool("first", 100, 5),
                         settings=TEST_SETTINGS.replace(cleanup_interval=3600.0))
    other = client_for(zk)
    try:
        ComponentRegistry(other, hostname="other").register_pool(
            pool_worker_id("second", "main", fqdn="other.example.com"), "second", "main",
            ["small"], 100)
        wait_for(lambda: len(launcher.component_cache.pools()) == 2, 10)
        request_id = zuul.submit(["small"], provider="second")  # left to `second`
        store = RequestStore(other)
        got = store.lock_and_read(request_id)
        assert got is not None
        held, request = got
        request.state = model.RequestState.PENDING
        store.store(request, held)
        mirror = launcher.request_cache._mirror
        wait_for(lambda: request_id in mirror.stale(), 10)
    finally:
        other.stop()  # its contender and its pool registration go with the session
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled", body
