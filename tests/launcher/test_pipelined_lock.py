"""The new node's lock + `building` write, sent by the pool worker and collected by the
launch (so the worker goes on to the next request of a burst meanwhile).

Aspects: when someone else holds the new node's lock by the time the write arrives, the
launch reports UNLOCKED without launching anything, the node is left to its lock holder
(not launched, not written), and the request is served with a replacement node.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.driver.base import LaunchSpec
from nodepool_k8s.core.model import Node
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.nodes import NodeStore, PendingLock
from tests.launchers import LauncherFactory


def test_a_new_node_locked_by_someone_else_is_replaced(
        launchers: LauncherFactory, zuul: ZuulClient, kazoo_client: KazooClient,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    launcher = launchers()
    launched: list[str] = []
    launcher.providers["fake"].on_launch = (  # type: ignore[attr-defined]
        lambda spec: launched.append(spec.node_id))
    taken: list[str] = []
    original = NodeStore.lock_new_async

    def foreign_lock_first(self: NodeStore, node: Node, state: str,
                           state_time: float) -> PendingLock:
        if not taken:
            # Another party locks the first new node before our write reaches ZooKeeper.
            kazoo_client.create(f"{paths.node_lock_path(node.id)}/foreign__lock__0000000000",
                                b"", makepath=True, ephemeral=True)
            taken.append(node.id)
        return original(self, node, state, state_time)

    monkeypatch.setattr(NodeStore, "lock_new_async", foreign_lock_first)
    caplog.set_level(logging.WARNING)
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id, timeout=30)
    assert body is not None and body["state"] == "fulfilled"
    assert len(taken) == 1 and body["nodes"] != taken
    assert launched == body["nodes"]  # the foreign-locked node was never launched
    foreign: Any = zuul.get_node(taken[0])
    assert foreign is not None and foreign["state"] == "init"
    assert not foreign.get("external_id")
    assert any("Could not lock our new node" in r.getMessage() for r in caplog.records)


def test_launch_spec_is_only_built_after_the_lock(launchers: LauncherFactory,
                                                  zuul: ZuulClient,
                                                  kazoo_client: KazooClient) -> None:
    """A launch starts only once the node is ours and `building` (what Zuul and other
    launchers see while the driver works)."""
    launcher = launchers()
    seen: list[tuple[str, str]] = []

    def look(spec: LaunchSpec) -> None:
        data = zuul.get_node(spec.node_id) or {}
        locked = kazoo_client.get_children(paths.node_lock_path(spec.node_id))
        seen.append((str(data.get("state")), "locked" if locked else "unlocked"))

    launcher.providers["fake"].on_launch = look  # type: ignore[attr-defined]
    body = zuul.wait(zuul.submit(["small", "small"]), timeout=30)
    assert body is not None and body["state"] == "fulfilled"
    assert seen == [("building", "locked")] * 2


def test_a_created_node_whose_lock_could_not_be_sent_is_launched_next_pass(
        launchers: LauncherFactory, zuul: ZuulClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch created the node, then sending its lock + `building` failed (ZooKeeper
    unreachable for a moment): the pass is retried and launches that node, instead of
    creating another one and leaving the first for the stale-`init` cleanup."""
    launchers()
    original = NodeStore.lock_new_async
    failed: list[str] = []

    def unreachable_once(self: NodeStore, node: Node, state: str,
                         state_time: float) -> PendingLock:
        if not failed:
            failed.append(node.id)
            raise errors.ZkConnectionError("connection lost while sending")
        return original(self, node, state, state_time)

    monkeypatch.setattr(NodeStore, "lock_new_async", unreachable_once)
    body = zuul.wait(zuul.submit(["small"]), timeout=30)
    assert body is not None and body["state"] == "fulfilled"
    assert body["nodes"] == failed  # the very node created first
