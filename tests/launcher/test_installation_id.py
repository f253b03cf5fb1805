"""The installation id that marks this installation's cloud objects.

Aspects: without `installation-id` in the file, the first launcher records the id derived
from the ZooKeeper hosts in ZooKeeper, and later launchers and the CLI use the recorded one
even when the host list changed (a derived id would change with it and every delete of an
existing namespace would be refused); an id set in the file wins; an unusable recorded
value is ignored with a warning.
"""

from __future__ import annotations

import argparse
import logging
import textwrap
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.cmd import common
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.stats import RecordingBackend, Stats
from nodepool_k8s.zk.identity import INSTALLATION_ID_PATH
from tests.helpers import ZkConnection
from tests.launchers import BASIC, TEST_SETTINGS, LauncherFactory


def _launcher(text: str) -> Launcher:
    return Launcher(load_config_text(text), settings=TEST_SETTINGS,
                    stats=Stats(RecordingBackend()))


def _other_hosts(zk: ZkConnection) -> str:
    """The same server under another name: a different derived id."""
    yaml = zk.config_yaml()
    assert f"host: {zk.host}" in yaml and zk.host == "127.0.0.1"
    return yaml.replace("host: 127.0.0.1", "host: localhost") + textwrap.dedent(BASIC)


def test_recorded_id_survives_a_host_list_change(launchers: LauncherFactory,
                                                 zk: ZkConnection,
                                                 kazoo_client: KazooClient) -> None:
    first = launchers()
    derived = load_config_text(zk.config_yaml() + textwrap.dedent(BASIC)).installation_id
    assert first.config.installation_id == derived
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0].decode() == derived
    assert load_config_text(_other_hosts(zk)).installation_id != derived
    second = _launcher(_other_hosts(zk))
    try:
        assert second.start()
        assert second.config.installation_id == derived
        assert {p.installation_id for p in second.config.providers.values()} == {derived}
    finally:
        second.stop()


def test_cli_session_uses_the_recorded_id(launchers: LauncherFactory, zk: ZkConnection,
                                          tmp_path: Path) -> None:
    first = launchers()
    path = tmp_path / "nodepool.yaml"
    path.write_text(_other_hosts(zk))
    with common.session(argparse.Namespace(config=str(path), secure=None)) as s:
        assert s.config.installation_id == first.config.installation_id
        assert s.config.providers["fake"].installation_id == first.config.installation_id


def test_id_in_the_file_wins(launchers: LauncherFactory, kazoo_client: KazooClient) -> None:
    launchers()  # records the derived id
    explicit = launchers("installation-id: staging-east\n" + textwrap.dedent(BASIC))
    assert explicit.config.installation_id == "staging-east"
    assert explicit.config.providers["fake"].installation_id == "staging-east"
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0].decode() != "staging-east"


def test_unusable_recorded_id_is_ignored(launchers: LauncherFactory, zk: ZkConnection,
                                         kazoo_client: KazooClient,
                                         caplog: pytest.LogCaptureFixture) -> None:
    kazoo_client.create(INSTALLATION_ID_PATH, b"not a label value!" * 10, makepath=True)
    caplog.set_level(logging.WARNING)
    launcher = launchers()
    derived = load_config_text(zk.config_yaml() + textwrap.dedent(BASIC)).installation_id
    assert launcher.config.installation_id == derived
    assert any(INSTALLATION_ID_PATH in r.getMessage() for r in caplog.records)
