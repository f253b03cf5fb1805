"""Fixtures for `nodepool` CLI tests: a config file, an in-process runner, launchers, Zuul.

`cli` runs `nodepool -c <file> ...` in-process (the real `main`) against the test's fresh
ZooKeeper chroot and returns (exit status, stdout, stderr). `launchers` starts real
in-process launchers with the `fake` driver from the same YAML, so the CLI sees state the
launcher wrote; `zuul` is the Zuul-like client (submit/accept/use/release/hold).
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk import paths
from tests.helpers import ZkConnection, wait_for

SCRIPT = Path(sys.executable).with_name("nodepool")

# One provider, two labels; `small` keeps one ready node around (min-ready) for hold tests.
CONFIG = """
labels:
  - name: small
  - name: large
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 20
        labels:
          - name: small
            type: namespace
          - name: large
            type: pod
            cpu: 2
            memory: 1024
"""

MIN_READY = CONFIG.replace("  - name: small\n", "  - name: small\n    min-ready: 1\n", 1)


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def table(self) -> list[list[str]]:
        """The body rows of the (first) table in stdout, as stripped cells."""
        return parse_table(self.out)


def parse_table(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def config_text(zk: ZkConnection, body: str = CONFIG) -> str:
    return zk.config_yaml() + "zookeeper-timeout: 5\n" + textwrap.dedent(body)


class Cli:
    def __init__(self, path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.path = path
        self.capsys = capsys

    def __call__(self, *args: str) -> Result:
        self.capsys.readouterr()  # drop anything printed before
        code = main(["-c", str(self.path), *args])
        out, err = self.capsys.readouterr()
        return Result(code, out, err)


@pytest.fixture
def config_file(zk: ZkConnection, tmp_path: Path) -> Path:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk))
    return path


@pytest.fixture
def cli(config_file: Path, capsys: pytest.CaptureFixture[str],
        kazoo_client: KazooClient) -> Cli:
    # An installation Zuul has used: the Nodepool tree exists (a bare root gets a warning,
    # see test_operator_habits).
    kazoo_client.ensure_path(paths.NODES)
    kazoo_client.ensure_path(paths.REQUESTS)
    return Cli(config_file, capsys)


def lock_contenders(client: KazooClient, node_id: str) -> list[str]:
    try:
        return list(client.get_children(paths.node_lock_path(node_id)))
    except NoNodeError:
        return []


def fake_provider(launcher: Launcher) -> FakeProvider:
    provider = launcher.providers["fake"]
    assert isinstance(provider, FakeProvider)
    return provider


def ready_node(client: KazooClient) -> str:
    """Wait for a spare: a ready, unallocated, unlocked node (the min-ready one of
    `MIN_READY`). Until its min-ready request is finished the node is still allocated to
    it, and the launcher locks it briefly to free it."""
    def find() -> str | None:
        for node_id in sorted(client.get_children(paths.NODES)):
            data = node_data(client, node_id)
            if data is not None and data.get("state") == "ready" \
                    and not data.get("allocated_to") and not lock_contenders(client, node_id):
                return str(node_id)
        return None
    return str(wait_for(find, message="a ready node"))


def foreign_node(client: KazooClient, provider: str = "elsewhere") -> str:
    """A ready node of a provider no launcher here serves (nothing else touches it)."""
    body = {"state": "ready", "provider": provider, "pool": "p", "type": ["small"],
            "external_id": "p-1", "state_time": 1.0}
    path = client.create(f"{paths.NODES}/", json.dumps(body).encode(), sequence=True,
                         makepath=True)
    return paths.basename(path)


def node_data(client: KazooClient, node_id: str) -> dict[str, Any] | None:
    try:
        return dict(json.loads(client.get(paths.node_path(node_id))[0]))
    except (NoNodeError, ValueError):
        return None


def record(client: KazooClient, node_id: str) -> dict[str, Any]:
    """The node's JSON (which must exist)."""
    data = node_data(client, node_id)
    assert data is not None, f"node {node_id} is gone"
    return data


def node_state(client: KazooClient, node_id: str) -> str | None:
    data = node_data(client, node_id)
    return None if data is None else str(data.get("state"))
