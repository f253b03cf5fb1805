"""The installed `nodepool` script, ZooKeeper unreachable, TLS, the secure file and invalid
configurations: one clear line on stderr and exit 1, never a traceback or an endless retry."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.config import loader
from nodepool_k8s.dev.testing.zookeeper import free_port
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.cli.conftest import SCRIPT, Cli, config_text, parse_table
from tests.helpers import ZkConnection, in_use
from tests.launchers import LauncherFactory


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: run `bash tools/test-setup.sh` to install the"
                    " console scripts")
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


def _dead_zookeeper(tmp_path: Path) -> tuple[Path, str]:
    port = free_port()  # nothing listens there
    dead = ZkConnection(host="127.0.0.1", port=port, chroot="/nowhere")
    path = tmp_path / "dead.yaml"
    path.write_text(config_text(dead))
    return path, f"127.0.0.1:{port}/nowhere"


def test_list_and_delete_as_a_subprocess(config_file: Path, launchers: LauncherFactory,
                                         zuul: ZuulClient) -> None:
    launchers()
    nodeset = in_use(zuul, ["small"])
    node_id = nodeset.nodes[0].id

    result = _run("-c", str(config_file), "list")
    assert (result.returncode, result.stderr) == (0, "")
    rows = parse_table(result.stdout)
    assert [(r[0], r[6], r[8]) for r in rows] == [(node_id, "in-use", "locked")]

    result = _run("delete", node_id, "-c", str(config_file), "--lock-timeout", "0.1")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"nodepool delete: node {node_id} is locked by another client"
                             " (in use?); use --force to delete it anyway\n")
    zuul.release(nodeset)


def test_unreachable_zookeeper_as_a_subprocess(tmp_path: Path) -> None:
    path, hosts = _dead_zookeeper(tmp_path)
    # _run's own timeout bounds this: Nodepool would retry forever.
    result = _run("-c", str(path), "list")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"nodepool list: cannot connect to ZooKeeper at {hosts} within 5s\n"


@pytest.mark.parametrize("command", [["list", "--detail"], ["request-list", "--json"],
                                     ["hold", "1"], ["delete", "1", "--now", "--force"],
                                     ["info", "fake"], ["label-list"]])
def test_unreachable_zookeeper_in_process(tmp_path: Path, command: list[str],
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "CONNECT_TIMEOUT", 0.5)
    path, hosts = _dead_zookeeper(tmp_path)
    result = Cli(path, capsys)(*command)
    assert (result.code, result.out) == (1, "")
    assert result.err == (f"nodepool {command[0]}: cannot connect to ZooKeeper at {hosts}"
                          " within 0.5s\n")


@pytest.mark.parametrize("as_program", [True, False])
def test_connection_logs_stay_quiet_for_the_program(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        as_program: bool) -> None:
    """An abandoned connection attempt's kazoo thread may log after the one-line outcome:
    as the program (no argv), kazoo stays quiet until the process exits; called with argv
    (tests, other programs), the levels come back when the command returns."""
    monkeypatch.setattr(common, "CONNECT_TIMEOUT", 0.5)
    path, hosts = _dead_zookeeper(tmp_path)
    argv = ["nodepool", "-c", str(path), "list"]
    kazoo_log, client_log = logging.getLogger("kazoo"), logging.getLogger(
        "nodepool_k8s.zk.client")
    levels = (kazoo_log.level, client_log.level)
    try:
        if as_program:
            monkeypatch.setattr(sys, "argv", argv)
            assert main() == 1
        else:
            assert main(argv[1:]) == 1
        quiet = (logging.CRITICAL, logging.CRITICAL)
        assert (kazoo_log.level, client_log.level) == (quiet if as_program else levels)
        assert capsys.readouterr().err == (f"nodepool list: cannot connect to ZooKeeper at"
                                           f" {hosts} within 0.5s\n")
    finally:
        kazoo_log.setLevel(levels[0])
        client_log.setLevel(levels[1])


def test_invalid_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("zookeeper-servers:\n  - host: zk\n    port: twenty\n")
    result = Cli(path, capsys)("list")
    assert (result.code, result.out) == (1, "")
    assert result.err == (f"nodepool list: {path}: zookeeper-servers[0].port: expected int,"
                          " got 'twenty'\n")
    monkeypatch.setattr(loader, "READ_RETRY_DELAY", 0.0)
    missing = Cli(tmp_path / "none.yaml", capsys)("request-list")
    assert missing.code == 1 and "cannot read the file" in missing.err


def test_secure_file_names_the_zookeeper(zk: ZkConnection, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = _dead_zookeeper(tmp_path)
    secure = tmp_path / "secure.yaml"
    secure.write_text(zk.config_yaml())
    capsys.readouterr()
    assert main(["-c", str(path), "-s", str(secure), "list", "--json"]) == 0
    assert capsys.readouterr().out == "[]\n"


def test_tls(zk_tls: ZkConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tls.yaml"
    path.write_text(config_text(zk_tls))
    result = Cli(path, capsys)("list")
    assert result.code == 0
    assert "holds no Nodepool data" in result.err  # a fresh chroot: nothing launched yet
    assert result.table() == []


def test_closed_stdout_is_not_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from nodepool_k8s.cmd import nodepoolcmd

    def reader_went_away(args: object) -> int:
        raise BrokenPipeError()

    monkeypatch.setattr(nodepoolcmd, "cmd_list", reader_went_away)
    assert main(["list"]) == 1
    assert capsys.readouterr().err == ""
