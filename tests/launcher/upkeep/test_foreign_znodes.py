"""Znodes another ZooKeeper client put in the cleanup worker's way, one pass at a time
(support.Upkeep, with a pool worker and min-ready on the same deps where the test needs
them): what ZooKeeper will not let us remove, reset or lock is said once with its path and
left alone, and the rest goes on.

The same kind of znodes in the way of a whole launcher (its caches, its registrations,
its quota decisions) are in tests/launcher/test_foreign_znodes.py.
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE

from nodepool_k8s.core import model
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.launcher.test_foreign_znodes import (OUR_READY_NODE, OWNED_READ_ONLY, READ_ONLY,
                                                foreign_request, messages)
from tests.launcher.upkeep.conftest import MakeUpkeep
from tests.launchers import BASIC, TEST_SETTINGS

RETRY = TEST_SETTINGS.delete_retry_max  # any deletion retry is due after this long
STUCK_CONFIG = BASIC.replace("  - name: small\n", "  - name: small\n    min-ready: 1\n", 1)


def persistent_contender(client: KazooClient, lock_dir: str) -> str:
    """A lock contender named as kazoo's recipe names them, but not ephemeral."""
    return client.create(f"{lock_dir}/{uuid.uuid4().hex}__lock__0000000000", b"",
                         makepath=True)


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


def test_nodes_we_may_not_remove_are_reported_once(
        upkeep: MakeUpkeep, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """A used node of ours that is read-only for us, and a node znode without data whose
    child we may not remove: each deletion attempt logged a traceback ("Unexpected error
    while deleting", at every retry), and the empty-node step failed with a traceback on
    every cleanup pass (one per node event). Both are said once now and left in place,
    and removed once their ACL lets us."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="nodepool_k8s.NodeDeleter")
    world = upkeep(BASIC)
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.add_auth("digest", "owner:secret")
    used = kazoo_client.create(paths.NODE_CREATE_PREFIX, json.dumps(
        {**OUR_READY_NODE, "state": "used"}).encode(), acl=OWNED_READ_ONLY, sequence=True)
    empty = kazoo_client.create(paths.NODE_CREATE_PREFIX, b"", sequence=True)
    kazoo_client.create(f"{empty}/child", b"")
    kazoo_client.set_acls(empty, OWNED_READ_ONLY)
    used_id, empty_id = paths.basename(used), paths.basename(empty)
    world.step()
    for _ in range(3):  # full passes, each with the deletion's retry due
        world.step(RETRY)
    assert len(messages(caplog, f"[node: {used_id}] Cannot delete")) >= 3  # retried
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([m for m in warnings if f"[node: {used_id}] Cannot delete" in m]) == 1
    assert len(messages(caplog, f"Leaving node znode {empty_id} without data")) == 1
    assert not messages(caplog, "Unexpected error") and not messages(caplog, "step empty")
    assert kazoo_client.exists(used) is not None and kazoo_client.exists(empty) is not None
    # Its owner opens them up: the next attempts remove both.
    for path in (used, empty):
        kazoo_client.set_acls(path, OPEN_ACL_UNSAFE)
    world.full_pass(RETRY)
    assert kazoo_client.exists(used) is None and kazoo_client.exists(empty) is None


def test_request_made_read_only_while_launching_is_given_up(
        upkeep: MakeUpkeep, kazoo_client: KazooClient,
        caplog: pytest.LogCaptureFixture) -> None:
    """The requestor takes our write access to its request while its node launches: the
    final write failed every pass of the pool worker from then on (no other request of
    the pool was served), and the cleanup's reset of the now unlocked `pending` request
    failed every full pass with a traceback. The request is given up instead, its node
    kept for reuse, and both say so once."""
    caplog.set_level(logging.INFO)
    world = upkeep(BASIC)
    worker, launches = world.pool_worker()
    victim = world.deps.submit(["small"])
    worker.run_once()
    assert launches.in_flight == 1  # accepted (pending), its launch not yet run
    path = paths.request_path(victim)
    kazoo_client.set_acls(path, READ_ONLY)
    launches.run_all()
    worker.run_once()
    assert len(messages(caplog, "Giving the request up")) == 1
    world.full_pass()
    for _ in range(2):  # the pool serves on
        other = world.deps.submit(["small"])
        worker.run_once()
        launches.run_all()
        fulfilled = world.deps.requests.get(other)
        assert fulfilled is not None and fulfilled.state == model.RequestState.FULFILLED
        world.full_pass()
    assert len(messages(caplog, f"Skipping request {path} until it changes")) == 1
    assert json.loads(kazoo_client.get(path)[0])["state"] == "pending"
    assert len(messages(caplog, "Giving the request up")) == 1
    assert not messages(caplog, "pass failed") and not messages(caplog, "step lost")


def test_persistent_lock_contenders_are_reported_once(
        upkeep: MakeUpkeep, zuul: ZuulClient, kazoo_client: KazooClient,
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
    world = upkeep(STUCK_CONFIG)
    worker, launches = world.pool_worker()
    min_ready = world.min_ready()

    def serve() -> None:
        """min-ready asks, the pool serves, min-ready finishes its request."""
        min_ready.run_once()
        worker.run_once()
        launches.run_all()
        worker.run_once()
        min_ready.run_once()

    serve()
    [spare] = ready_spares(kazoo_client)
    node_lock = persistent_contender(kazoo_client, paths.node_lock_path(spare))
    in_use = zuul.submit(["small"])
    worker.run_once()
    launches.run_all()
    body = zuul.wait(in_use, 30)
    assert body is not None and body["state"] == "fulfilled", body
    nodeset = zuul.accept(in_use)
    zuul.use(nodeset)
    zuul_lock_dir = paths.node_lock_path(nodeset.nodes[0].id)

    def reported(path: str) -> list[str]:
        return [m for m in messages(caplog, f"Lock contender {path} is not ephemeral")]

    # A node's contender is judged on its second full pass, a request's lock dir is listed
    # from its second full pass as a waiting request on: all are reported by the third.
    for _ in range(3):
        world.full_pass()
    assert reported(request_lock) and reported(node_lock)
    for _ in range(2):
        world.full_pass()
    assert len(reported(request_lock)) == 1 and len(reported(node_lock)) == 1
    assert f"request {request_id} (requested)" in reported(request_lock)[0]
    assert f"nodepool delete --force {spare}" in reported(node_lock)[0]
    assert not messages(caplog, f"{zuul_lock_dir}/")  # Zuul's lock: ephemeral, fine
    assert len(messages(caplog, "is not ephemeral")) == 2
    # The locked spare is not counted: min-ready builds another.
    serve()
    assert len(ready_spares(kazoo_client)) == 2
    # The stuck request's lock is not tried any more (each try creates and deletes a
    # contender: the lock dir's child version would move).
    before = kazoo_client.exists(paths.request_lock_path(request_id)).cversion
    for _ in range(5):
        worker.run_once()
    assert kazoo_client.exists(paths.request_lock_path(request_id)).cversion == before
    assert json.loads(kazoo_client.get(request)[0])["state"] == "requested"
    # Removed by hand: the request is served.
    kazoo_client.delete(request_lock)
    world.full_pass()
    worker.run_once()
    launches.run_all()
    assert json.loads(kazoo_client.get(request)[0])["state"] == "fulfilled"
    zuul.release(nodeset)
