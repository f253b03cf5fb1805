"""Znodes another ZooKeeper client put in a running launcher's way, with ACLs that deny
us what the protocol would have us do: one unreadable node or unwritable request is
skipped, logged once with its path, and left alone, while every other request is served;
protocol dirs deleted under the caches, junk node znodes, a persistent pool registration
and our own registrations deleted by another client.

What the cleanup worker meets on its own (nodes it may not remove, a request it may not
reset, persistent lock contenders) is stepped in tests/launcher/upkeep/test_foreign_znodes.py;
its helpers for foreign records come from here.
"""

from __future__ import annotations

import json
import logging

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from nodepool_k8s.core import records
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

# A znode only some other identity may use at all, and one anybody may only read.
OTHERS_ONLY = [make_digest_acl("someone", "else", all=True)]
READ_ONLY = [ACL(Permissions.READ, Id("world", "anyone"))]
# Read-only for everybody but its owner (who may change it back).
OWNED_READ_ONLY = READ_ONLY + [make_digest_acl("owner", "secret", all=True)]
OUR_READY_NODE = {"state": "ready", "provider": "fake", "pool": "main", "type": ["small"]}


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_unreadable_node_does_not_stop_node_creation(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """Every quota decision reads the nodes the cache does not have: one node znode we may
    not read made each of them fail, so no node was ever created again."""
    caplog.set_level(logging.INFO)
    kazoo_client.ensure_path(paths.NODES)
    foreign = kazoo_client.create(paths.NODE_CREATE_PREFIX,
                                  json.dumps(OUR_READY_NODE).encode(),
                                  acl=OTHERS_ONLY, sequence=True)
    launchers()
    for _ in range(2):
        zuul.run_build(["small"], timeout=20)
    assert kazoo_client.exists(foreign) is not None
    assert len(messages(caplog, f"{foreign}: not readable")) == 1
    assert not messages(caplog, "pass failed")


def foreign_request(node_types: list[str]) -> bytes:
    return json.dumps({"state": "requested", "node_types": node_types, "requestor": "other",
                       "reuse": False, "relative_priority": 0, "declined_by": [],
                       "tenant_name": None}).encode()


def test_requests_we_may_not_lock_or_write_are_skipped(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """Requests ahead of every other one that ZooKeeper does not let us write (read-only
    for us), or lock (their request-lock dir, made beforehand, is read-only): each failed
    every pass of the pool worker, and no request behind it was ever served."""
    caplog.set_level(logging.INFO)
    kazoo_client.ensure_path(paths.REQUESTS)
    kazoo_client.ensure_path(paths.REQUEST_LOCKS)
    unwritable = kazoo_client.create(paths.request_create_prefix("000"),
                                     foreign_request(["small"]), acl=READ_ONLY,
                                     sequence=True)
    unlockable = kazoo_client.create(paths.request_create_prefix("000"),
                                     foreign_request(["small"]), sequence=True)
    kazoo_client.create(paths.request_lock_path(paths.basename(unlockable)), b"",
                        acl=READ_ONLY)
    launchers()
    for _ in range(3):
        zuul.run_build(["small"], timeout=20)
    for path in (unwritable, unlockable):
        assert json.loads(kazoo_client.get(path)[0])["state"] == "requested"
        assert len(messages(caplog, f"Skipping request {path} until it changes")) == 1
    assert not messages(caplog, "pass failed")


def test_serving_goes_on_after_the_protocol_dirs_are_deleted(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """Somebody deletes `/nodepool/requests`, `/nodepool/nodes` and the request-lock dir
    (all empty, between builds). The caches' watches went with the dirs: no request was
    seen again until a reconnect. And the recreated dirs start their sequence numbers over,
    so the next request and node had the names of deleted ones, which the caches ignored
    as deleted for a minute."""
    launchers()
    first, nodes = zuul.run_build(["small"], timeout=20)
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 20, message="nodes removed")
    for path in (paths.REQUESTS, paths.NODES, paths.REQUEST_LOCKS):
        kazoo_client.delete(path, recursive=True)
    second, again = zuul.run_build(["small"], timeout=20)
    assert (second, again) == (first, nodes)  # the same names, as the sequences started over
    wait_for(lambda: not kazoo_client.get_children(paths.NODES), 20,
             message="the used node of the second build removed")


def test_junk_nodes_are_not_read_at_every_quota_decision(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node znodes the cache found malformed were read again by every quota decision
    (they are not in the cache, like a node created a moment ago): ten thousand of them
    cost each decision a second of reading, and past the memory of reported records
    (here made small) every decision logged each of them again."""
    monkeypatch.setattr(records.REPORTS, "limit", 5)
    kazoo_client.ensure_path(paths.NODES)
    junk = [kazoo_client.create(paths.NODE_CREATE_PREFIX, b'{"state": 5}', sequence=True)
            for _ in range(8)]
    launcher = launchers()
    wait_for(lambda: len(launcher.node_cache.malformed()) == len(junk), 20,
             message="the junk seen by the cache")
    for _ in range(3):
        zuul.run_build(["small"], timeout=20)
    for path in junk:
        assert len(messages(caplog, f"Skipping malformed node {path}:")) == 1, path


def test_a_persistent_pool_registration_is_not_yielded_to(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """A pool registration that is no ephemeral znode (left by a tool, or written by hand)
    names no live launcher; with a better priority for our label, every pool yielded to it
    forever, silently, and no request was served."""
    caplog.set_level(logging.INFO)
    path = kazoo_client.create(f"{paths.POOL_COMPONENTS}/oldtool-", json.dumps({
        "hostname": "gone", "kind": "pool", "id": "gone-PoolWorker.x-main-1", "name": "main",
        "provider_name": "x", "supported_labels": ["small"], "priority": 1, "paused": False,
        "state": "running"}).encode(), sequence=True, makepath=True)
    launchers()
    for _ in range(2):
        zuul.run_build(["small"], timeout=20)
    assert len(messages(caplog, f"Ignoring pool registration {path}:")) == 1
    assert kazoo_client.exists(path) is not None


def test_our_registrations_deleted_by_another_client_come_back(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient) -> None:
    """Another client deleted the launcher's ephemeral pool and launcher registrations:
    they were created again only after the next change of their data (or the session), so
    Zuul and the other launchers saw no pool for the label meanwhile."""
    launcher = launchers()
    ours = {kind: kazoo_client.get_children(f"{paths.COMPONENTS}/{kind}")
            for kind in ("pool", "launcher")}
    assert all(len(names) == 1 for names in ours.values()), ours
    for kind, names in ours.items():
        kazoo_client.delete(f"{paths.COMPONENTS}/{kind}/{names[0]}")
    for kind, names in ours.items():
        wait_for(lambda: (now := kazoo_client.get_children(f"{paths.COMPONENTS}/{kind}"))
                 and now != names, 20, message=f"our {kind} registration again")
    pool = kazoo_client.get_children(f"{paths.COMPONENTS}/pool")[0]
    data = json.loads(kazoo_client.get(f"{paths.COMPONENTS}/pool/{pool}")[0])
    assert "small" in data["supported_labels"] and launcher.pool_workers
    zuul.run_build(["small"], timeout=20)
