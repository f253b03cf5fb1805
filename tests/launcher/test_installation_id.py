"""The installation id that marks this installation's cloud objects.

Aspects: without `installation-id` in the file, the first launcher pins the id derived from
the ZooKeeper hosts in its local state file and records it in ZooKeeper; later starts use
the pinned id even when the host list changed or the znode vanished; an id set in the file
wins over the derived one. ZooKeeper is never a source: a recorded id that differs from the
configured or pinned one stops the start with one line naming the znode, both values and
the repair; with no local state, a recorded id other than the derived one is not adopted.
The CLI's `delete --now` follows the same rules and pins nothing. The znode (and
`/nodepool_k8s`) get the configured ACL even when they already exist.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from nodepool_k8s.cmd import common
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk import paths
from nodepool_k8s.zk.identity import INSTALLATION_ID_PATH, InstallationIdError
from tests.helpers import ZkConnection
from tests.launcher.test_zk_acl import LAUNCHER_ID, SECURE, ZUUL_ID
from tests.launchers import BASIC, TEST_SETTINGS, LauncherFactory


def _launcher(text: str, secure: str | None = None) -> Launcher:
    return Launcher(load_config_text(text, secure_text=secure), settings=TEST_SETTINGS,
                    stats=Stats(RecordingBackend()))


def _other_hosts(zk: ZkConnection) -> str:
    """The same server under another name: a different derived id."""
    yaml = zk.config_yaml()
    assert f"host: {zk.host}" in yaml and zk.host == "127.0.0.1"
    return yaml.replace("host: 127.0.0.1", "host: localhost") + textwrap.dedent(BASIC)


def _derived(zk: ZkConnection) -> str:
    return load_config_text(zk.config_yaml() + textwrap.dedent(BASIC)).installation_id


def _start_fails(text: str) -> InstallationIdError:
    launcher = _launcher(text)
    try:
        with pytest.raises(InstallationIdError) as failed:
            launcher.start()
        assert not launcher.providers and not launcher.pool_workers
    finally:
        launcher.stop()
    return failed.value


def test_first_start_pins_the_derived_id(launchers: LauncherFactory, zk: ZkConnection,
                                         kazoo_client: KazooClient,
                                         _own_state_directory: Path) -> None:
    first = launchers()
    derived = _derived(zk)
    assert first.config.installation_id == derived
    assert (_own_state_directory / "installation-id").read_text() == derived + "\n"
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0].decode() == derived


def test_pinned_id_survives_a_restart_without_the_znode(
        zk: ZkConnection, kazoo_client: KazooClient) -> None:
    first = _launcher(zk.config_yaml() + textwrap.dedent(BASIC))
    try:
        assert first.start()
        pinned = first.config.installation_id
    finally:
        first.stop()
    # ZooKeeper loses the znode (a restore, a client's delete) and the host list changes:
    # neither changes the id, which is recorded again.
    kazoo_client.delete(INSTALLATION_ID_PATH)
    assert load_config_text(_other_hosts(zk)).installation_id != pinned
    second = _launcher(_other_hosts(zk))
    try:
        assert second.start()
        assert second.config.installation_id == pinned
        assert {p.installation_id for p in second.config.providers.values()} == {pinned}
    finally:
        second.stop()
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0].decode() == pinned


def test_rewritten_znode_stops_the_start(zk: ZkConnection, kazoo_client: KazooClient,
                                         _own_state_directory: Path) -> None:
    text = zk.config_yaml() + textwrap.dedent(BASIC)
    first = _launcher(text)
    try:
        assert first.start()
        pinned = first.config.installation_id
    finally:
        first.stop()
    kazoo_client.set(INSTALLATION_ID_PATH, b"other-installation")
    message = str(_start_fails(text))
    assert "\n" not in message
    for part in (INSTALLATION_ID_PATH, "'other-installation'", repr(pinned),
                 str(_own_state_directory / "installation-id"), "set it back"):
        assert part in message, message
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0] == b"other-installation"  # left alone


def test_configured_id_is_checked_against_the_znode(launchers: LauncherFactory,
                                                    zk: ZkConnection,
                                                    kazoo_client: KazooClient) -> None:
    explicit = launchers("installation-id: staging-east\n" + textwrap.dedent(BASIC))
    assert explicit.config.installation_id == "staging-east"
    assert explicit.config.providers["fake"].installation_id == "staging-east"
    assert kazoo_client.get(INSTALLATION_ID_PATH)[0].decode() == "staging-east"
    message = str(_start_fails(zk.config_yaml() + "installation-id: staging-west\n"
                               + textwrap.dedent(BASIC)))
    assert "'staging-east'" in message and "'staging-west'" in message
    assert "installation-id in the configuration" in message


def test_recorded_id_is_not_adopted_without_local_state(zk: ZkConnection,
                                                        kazoo_client: KazooClient,
                                                        _own_state_directory: Path) -> None:
    # An installation that had its id only in ZooKeeper (or a forged one): not adopted.
    kazoo_client.create(INSTALLATION_ID_PATH, b"zk-0123456789ab", makepath=True)
    message = str(_start_fails(zk.config_yaml() + textwrap.dedent(BASIC)))
    state_file = str(_own_state_directory / "installation-id")
    assert "'zk-0123456789ab'" in message and repr(_derived(zk)) in message
    assert f"write it to {state_file}" in message
    assert not Path(state_file).exists()
    # The operator pins it: from then on it is the id.
    Path(state_file).write_text("zk-0123456789ab\n")
    launcher = _launcher(zk.config_yaml() + textwrap.dedent(BASIC))
    try:
        assert launcher.start()
        assert launcher.config.installation_id == "zk-0123456789ab"
    finally:
        launcher.stop()


def test_recorded_derived_id_is_pinned(zk: ZkConnection, kazoo_client: KazooClient,
                                       _own_state_directory: Path) -> None:
    """An installation recorded by an older launcher, its host list unchanged: the recorded
    id is the one this launcher derives itself, so it is pinned without asking."""
    kazoo_client.create(INSTALLATION_ID_PATH, _derived(zk).encode(), makepath=True)
    launcher = _launcher(zk.config_yaml() + textwrap.dedent(BASIC))
    try:
        assert launcher.start()
    finally:
        launcher.stop()
    assert (_own_state_directory / "installation-id").read_text().strip() == _derived(zk)


def test_unusable_state_file_stops_the_start(zk: ZkConnection,
                                             _own_state_directory: Path) -> None:
    (_own_state_directory / "installation-id").write_text("not a label value!\n")
    message = str(_start_fails(zk.config_yaml() + textwrap.dedent(BASIC)))
    assert str(_own_state_directory / "installation-id") in message


def test_reload_cannot_change_the_id(launchers: LauncherFactory, zk: ZkConnection) -> None:
    launcher = launchers("installation-id: staging-east\n" + textwrap.dedent(BASIC))
    with pytest.raises(ConfigError, match="installation-id changed to staging-west"):
        launcher.reload(load_config_text(zk.config_yaml() + "installation-id: staging-west\n"
                                         + textwrap.dedent(BASIC)))
    assert launcher.config.installation_id == "staging-east"


def _cli(zk: ZkConnection, tmp_path: Path, text: str) -> argparse.Namespace:
    path = tmp_path / "nodepool.yaml"
    path.write_text(text)
    return argparse.Namespace(config=str(path), secure=None)


def test_cli_uses_the_pinned_id(launchers: LauncherFactory, zk: ZkConnection,
                                tmp_path: Path, kazoo_client: KazooClient) -> None:
    first = launchers()
    with common.session(_cli(zk, tmp_path, _other_hosts(zk))) as plain:
        s = common.with_identity(plain)
        assert s.config.installation_id == first.config.installation_id
        assert s.config.providers["fake"].installation_id == first.config.installation_id
    kazoo_client.set(INSTALLATION_ID_PATH, b"other-installation")
    with pytest.raises(common.CliError, match="records installation id 'other-installation'"):
        with common.session(_cli(zk, tmp_path, _other_hosts(zk))) as plain:
            common.with_identity(plain)
    # Commands that delete nothing do not need the id.
    with common.session(_cli(zk, tmp_path, _other_hosts(zk))) as s:
        assert s.reader is not None


def test_cli_pins_nothing(zk: ZkConnection, tmp_path: Path, kazoo_client: KazooClient,
                          _own_state_directory: Path) -> None:
    with common.session(_cli(zk, tmp_path, zk.config_yaml() + textwrap.dedent(BASIC))) as plain:
        s = common.with_identity(plain)
        assert s.config.installation_id == _derived(zk)
    assert not (_own_state_directory / "installation-id").exists()
    assert kazoo_client.exists(INSTALLATION_ID_PATH) is None


def test_acl_applied_to_an_existing_znode(zk: ZkConnection, kazoo_client: KazooClient) -> None:
    """The znode recorded before the ACL was configured (open ACL) gets it at the next
    start, and so does `/nodepool_k8s`: a client without the credentials can no longer
    rewrite, or delete and recreate, the recorded id."""
    kazoo_client.create(INSTALLATION_ID_PATH, b"staging-east", makepath=True)
    assert list(kazoo_client.get_acls(INSTALLATION_ID_PATH)[0]) == OPEN_ACL_UNSAFE
    text = zk.config_yaml() + "installation-id: staging-east\n" + textwrap.dedent(BASIC)
    launcher = _launcher(text, SECURE.format(password="s3"))
    try:
        assert launcher.start()
    finally:
        launcher.stop()
    zuul = KazooClient(hosts=zk.hosts, auth_data=[("digest", "zuul:zuul-secret")])
    zuul.start(timeout=15)
    try:
        for path in (paths.OWN_ROOT, INSTALLATION_ID_PATH):
            assert list(zuul.get_acls(path)[0]) == [LAUNCHER_ID, ZUUL_ID], path
    finally:
        zuul.stop()
        zuul.close()
    with pytest.raises(NoAuthError):
        kazoo_client.set(INSTALLATION_ID_PATH, b"other-installation")
