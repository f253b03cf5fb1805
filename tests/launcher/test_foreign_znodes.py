"""Znodes another ZooKeeper client put in the launcher's way, with ACLs that deny us what
the protocol would have us do: one unreadable node or unwritable request is skipped,
logged once with its path, and left alone, while every other request is served."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions, make_digest_acl

from nodepool_k8s.core import records
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import wait_for
from tests.launchers import BASIC, LauncherFactory

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


def test_request_made_read_only_while_launching_is_given_up(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """The requestor takes our write access to its request while its node launches: the
    final write failed every pass of the pool worker from then on (no other request of
    the pool was served), and the cleanup's reset of the now unlocked `pending` request
    failed every full pass with a traceback. The request is given up instead, its node
    kept for reuse, and both say so once."""
    caplog.set_level(logging.INFO)
    launcher = launchers()
    gate = threading.Event()

    def hold(spec: Any) -> None:
        if spec.request.id == victim:
            gate.wait(30)
    victim = ""
    launcher.providers["fake"].on_launch = hold  # type: ignore[attr-defined]
    victim = zuul.submit(["small"])
    zuul.wait(victim, 20, states=("pending",))
    wait_for(lambda: launcher.providers["fake"].launching, 20,  # type: ignore[attr-defined]
             message="the launch")
    path = paths.request_path(victim)
    kazoo_client.set_acls(path, READ_ONLY)
    gate.set()
    wait_for(lambda: messages(caplog, "Giving the request up"), 20,
             message="the request given up")
    launcher.cleanup.request_full_pass()
    for _ in range(2):
        zuul.run_build(["small"], timeout=20)
    wait_for(lambda: messages(caplog, f"Skipping request {path} until it changes"), 20,
             message="the cleanup skipping it")
    assert json.loads(kazoo_client.get(path)[0])["state"] == "pending"
    assert len(messages(caplog, "Giving the request up")) == 1
    assert not messages(caplog, "pass failed") and not messages(caplog, "step lost")


def test_nodes_we_may_not_remove_are_reported_once(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """A used node of ours that is read-only for us, and a node znode without data whose
    child we may not remove: each deletion attempt logged a traceback ("Unexpected error
    while deleting", at every retry), and the empty-node step failed with a traceback on
    every cleanup pass (one per node event). Both are said once now and left in place,
    and removed once their ACL lets us."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="nodepool_k8s.NodeDeleter")
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.add_auth("digest", "owner:secret")
    used = kazoo_client.create(paths.NODE_CREATE_PREFIX, json.dumps(
        {**OUR_READY_NODE, "state": "used"}).encode(), acl=OWNED_READ_ONLY, sequence=True)
    empty = kazoo_client.create(paths.NODE_CREATE_PREFIX, b"", sequence=True)
    kazoo_client.create(f"{empty}/child", b"")
    kazoo_client.set_acls(empty, OWNED_READ_ONLY)
    launcher = launchers()
    for _ in range(2):
        zuul.run_build(["small"], timeout=20)
    used_id, empty_id = paths.basename(used), paths.basename(empty)
    wait_for(lambda: len(messages(caplog, f"[node: {used_id}] Cannot delete")) >= 3, 20,
             message="retried deletions")
    passes = launcher.cleanup.passes
    wait_for(lambda: launcher.cleanup.passes >= passes + 3, 20, message="cleanup passes")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in warnings if f"[node: {used_id}] Cannot delete" in m]) == 1
    assert len(messages(caplog, f"Leaving node znode {empty_id} without data")) == 1
    assert not messages(caplog, "Unexpected error") and not messages(caplog, "step empty")
    assert kazoo_client.exists(used) is not None and kazoo_client.exists(empty) is not None
    # Its owner opens them up: the next attempts remove both.
    for path in (used, empty):
        kazoo_client.set_acls(path, OPEN_ACL_UNSAFE)
    launcher.cleanup.request_full_pass()
    wait_for(lambda: kazoo_client.exists(used) is None and kazoo_client.exists(empty) is None,
             30, message="both removed")


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


STUCK_CONFIG = BASIC.replace("  - name: small\n", "  - name: small\n    min-ready: 1\n", 1)


def persistent_contender(client: KazooClient, lock_dir: str) -> str:
    """A lock contender named as kazoo's recipe names them, but not ephemeral."""
    return client.create(f"{lock_dir}/{uuid.uuid4().hex}__lock__0000000000", b"",
                         makepath=True)


def full_pass(launcher: Launcher) -> None:
    passes = launcher.cleanup.passes
    launcher.cleanup.request_full_pass()
    # A pass under way may have started before the request: the one after it is full.
    wait_for(lambda: launcher.cleanup.passes >= passes + 2, 30, message="a full pass")


def ready_spares(client: KazooClient) -> list[str]:
    found = []
    for node_id in client.get_children(paths.NODES):
        try:
            body = json.loads(client.get(paths.node_path(node_id))[0])
        except Exception:
            continue
        if body.get("state") == "ready" and not body.get("allocated_to"):
            found.append(node_id)
    return found


def test_persistent_lock_contenders_are_reported_once(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """A lock contender that is not ephemeral (a tool's, a hand edit's) is released by no
    session: its node or request stays locked for ever, as with Nodepool, and nothing said
    why. The cleanup reports each once with its path; the pool worker no longer tries the
    request's lock again and again (three writes every 0.2 s), and the ready node it locks
    is no min-ready spare. An ephemeral lock held as long by a live session (Zuul's on a
    node in use) is not reported."""
    caplog.set_level(logging.INFO)
    request = kazoo_client.create(paths.request_create_prefix("100"),
                                  foreign_request(["small"]), sequence=True, makepath=True)
    request_id = paths.basename(request)
    request_lock = persistent_contender(kazoo_client, paths.request_lock_path(request_id))
    launcher = launchers(STUCK_CONFIG)
    spare = wait_for(lambda: ready_spares(kazoo_client), 30, message="a min-ready spare")[0]
    node_lock = persistent_contender(kazoo_client, paths.node_lock_path(spare))
    in_use = zuul.submit(["small"])
    body = zuul.wait(in_use, 30)
    assert body is not None and body["state"] == "fulfilled", body
    nodeset = zuul.accept(in_use)
    zuul.use(nodeset)
    zuul_lock_dir = paths.node_lock_path(nodeset.nodes[0].id)

    def reported(path: str) -> list[str]:
        return [m for m in messages(caplog, f"Lock contender {path} is not ephemeral")]

    def both_reported() -> bool:
        full_pass(launcher)
        return bool(reported(request_lock) and reported(node_lock))

    wait_for(both_reported, 120, interval=0, message="both contenders reported")
    for _ in range(2):
        full_pass(launcher)
    assert len(reported(request_lock)) == 1 and len(reported(node_lock)) == 1
    assert f"request {request_id} (requested)" in reported(request_lock)[0]
    assert f"nodepool delete --force {spare}" in reported(node_lock)[0]
    assert not messages(caplog, f"{zuul_lock_dir}/")  # Zuul's lock: ephemeral, fine
    assert len(messages(caplog, "is not ephemeral")) == 2
    # The locked spare is not counted: min-ready builds another.
    wait_for(lambda: len(ready_spares(kazoo_client)) == 2, 30, message="a second spare")
    # The stuck request's lock is not tried any more (each try creates and deletes a
    # contender: the lock dir's child version would move).
    before = kazoo_client.exists(paths.request_lock_path(request_id)).cversion
    worker = next(iter(launcher.pool_workers.values()))
    for _ in range(5):
        passes = worker.passes
        worker.wake()
        wait_for(lambda: worker.passes > passes, 30, message="a pool pass")
    assert kazoo_client.exists(paths.request_lock_path(request_id)).cversion == before
    assert json.loads(kazoo_client.get(request)[0])["state"] == "requested"
    # Removed by hand: the request is served.
    kazoo_client.delete(request_lock)
    full_pass(launcher)
    wait_for(lambda: json.loads(kazoo_client.get(request)[0])["state"] == "fulfilled", 30,
             message="the request served once its lock is gone")
    zuul.release(nodeset)
