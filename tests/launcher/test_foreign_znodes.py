"""Znodes another ZooKeeper client put in the launcher's way, with ACLs that deny us what
the protocol would have us do: one unreadable node or unwritable request is skipped,
logged once with its path, and left alone, while every other request is served."""

from __future__ import annotations

import json
import logging

import pytest
from kazoo.client import KazooClient
from kazoo.security import ACL, Id, Permissions, make_digest_acl

from nodepool_k8s.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.launchers import LauncherFactory

# A znode only some other identity may use at all, and one anybody may only read.
OTHERS_ONLY = [make_digest_acl("someone", "else", all=True)]
READ_ONLY = [ACL(Permissions.READ, Id("world", "anyone"))]
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
