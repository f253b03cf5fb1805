"""The CLI on an operator's bad day, and Nodepool's habits: a configuration with errors
elsewhere, a wrong chroot, the unit's environment file, several ids to delete, `-l`."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.runtime import envfile
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.zk import paths
from tests.cli.conftest import CONFIG, SCRIPT, Cli, config_text, foreign_node, node_data
from tests.helpers import ZkConnection

TYPO = CONFIG.replace("        max-servers: 20\n",
                      "        max-servers: 20\n        boot-timout: 5\n")


@pytest.fixture
def typo_config(zk: ZkConnection, tmp_path: Path) -> Path:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk, TYPO))
    return path


def test_read_and_mark_commands_work_with_errors_elsewhere(
        typo_config: Path, capsys: pytest.CaptureFixture[str],
        kazoo_client: KazooClient) -> None:
    node_id = foreign_node(kazoo_client)
    cli = Cli(typo_config, capsys)
    for command in (["list"], ["request-list"], ["pool-list"], ["label-list"],
                    ["info", "elsewhere"], ["events"]):
        result = cli(*command)
        assert result.code == 0, (command, result.err)
        assert "boot-timout" in result.err and "using only its ZooKeeper settings" in result.err
        assert result.err.count("warning:") == 1, result.err
    assert cli("hold", node_id).code == 0
    assert node_data(kazoo_client, node_id)["state"] == "hold"  # type: ignore[index]
    assert cli("delete", node_id).code == 0
    assert node_data(kazoo_client, node_id)["state"] == "deleting"  # type: ignore[index]


def test_commands_that_need_the_pools_refuse_a_broken_configuration(
        typo_config: Path, capsys: pytest.CaptureFixture[str],
        kazoo_client: KazooClient) -> None:
    cli = Cli(typo_config, capsys)
    for command in (["pause", "fake"], ["drain", "fake/main"], ["resume", "fake"],
                    ["pool-state"], ["config-validate"]):
        result = cli(*command)
        assert result.code == 1, command
        assert "boot-timout" in result.err, (command, result.err)
    node_id = foreign_node(kazoo_client)
    now = cli("delete", "--now", node_id)
    assert now.code == 1 and "--now needs a valid configuration" in now.err
    assert "boot-timout" in now.err
    assert node_data(kazoo_client, node_id)["state"] == "ready"  # type: ignore[index]


def test_a_broken_zookeeper_section_is_still_refused(zk: ZkConnection, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk, TYPO).replace("zookeeper-timeout: 5", "zookeeper-timeout: x"))
    result = Cli(path, capsys)("list")
    assert (result.code, result.out) == (1, "")
    assert "zookeeper-timeout" in result.err


def test_a_root_without_nodepool_data_warns(zk: ZkConnection, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            kazoo_client: KazooClient) -> None:
    wrong = ZkConnection(host=zk.host, port=zk.port, chroot=zk.chroot + "-typo")
    path = tmp_path / "wrong-chroot.yaml"
    path.write_text(config_text(wrong))
    empty = Cli(path, capsys)("list")
    assert empty.code == 0 and "holds no Nodepool data (no /nodepool)" in empty.err
    assert "check the chroot" in empty.err and wrong.chroot in empty.err
    kazoo_client.ensure_path(paths.NODES)  # the right chroot: no warning
    right = tmp_path / "right.yaml"
    right.write_text(config_text(zk))
    assert Cli(right, capsys)("list").err == ""


def test_delete_takes_several_ids_and_goes_on_after_a_failure(
        cli: Cli, kazoo_client: KazooClient) -> None:
    first, second = foreign_node(kazoo_client), foreign_node(kazoo_client)
    result = cli("delete", first, "999999", second)
    assert result.code == 1
    assert "0000999999" in result.err and "not found" in result.err
    for node_id in (first, second):
        assert node_data(kazoo_client, node_id)["state"] == "deleting"  # type: ignore[index]
        assert node_id in result.out
    again = cli("delete", first, second)
    assert again.code == 0, again.err


def test_the_environment_file_supplies_substitutions(zk: ZkConnection, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODEPOOL_TEST_ZK_HOST", raising=False)
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk).replace(f"host: {zk.host}",
                                            "host: '%(NODEPOOL_TEST_ZK_HOST)s'"))
    env_file = tmp_path / "nodepool-launcher"
    env_file.write_text(f"# the unit's environment\nNODEPOOL_TEST_ZK_HOST=\"{zk.host}\"\n"
                        "STATSD_HOST=ignored\n")
    cli = Cli(path, capsys)
    without = cli("list")
    assert without.code == 1 and "NODEPOOL_TEST_ZK_HOST" in without.err
    assert cli("--env-file", str(env_file), "list", "--json").code == 0
    monkeypatch.setenv("NODEPOOL_ENV_FILE", str(env_file))
    result = cli("list", "--json")
    assert result.code == 0 and json.loads(result.out) == []
    assert "NODEPOOL_TEST_ZK_HOST" not in os.environ  # nothing leaks into the process


def test_environment_file_syntax() -> None:
    text = textwrap.dedent("""\
        # comment
        ; comment too

        A=1
        export B = two words
        C="quoted \\"x\\" \\\\ y"
        D='single'
        """)
    assert envfile.parse(text) == {"A": "1", "B": "two words", "C": 'quoted "x" \\ y',
                                   "D": "single"}
    with pytest.raises(ConfigError, match="line 1: expected KEY=VALUE"):
        envfile.parse("not an assignment\n", "f")
    with pytest.raises(ConfigError, match="line 1"):
        envfile.parse("1A=x\n", "f")


def test_unreadable_environment_file(cli: Cli, tmp_path: Path) -> None:
    result = cli("--env-file", str(tmp_path / "missing"), "list")
    assert (result.code, result.out) == (1, "")
    assert result.err.startswith("nodepool: ") and "cannot read the environment file" in result.err
    binary = tmp_path / "binary"
    binary.write_bytes(b"A=\xff\n")
    assert "not UTF-8" in cli("--env-file", str(binary), "list").err


def test_logconfig_option(config_file: Path, tmp_path: Path) -> None:
    # In a process of its own: a logging configuration replaces the process's logging
    # (dictConfig disables every existing logger), which must not leak into other tests.
    log_file = tmp_path / "cli.log"
    logging_yaml = tmp_path / "logging.yaml"
    logging_yaml.write_text(textwrap.dedent(f"""\
        version: 1
        handlers:
          file: {{class: logging.FileHandler, filename: {log_file}}}
        root: {{level: DEBUG, handlers: [file]}}
        """))
    done = _nodepool("-c", str(config_file), "-l", str(logging_yaml), "--debug", "list")
    assert done.returncode == 0, done.stderr
    assert log_file.exists() and log_file.read_text()  # the debug lines went to the file
    missing = _nodepool("-c", str(config_file), "-l", str(tmp_path / "nope.yaml"), "list")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.startswith("nodepool: ")


def _nodepool(*args: str) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: run `bash tools/test-setup.sh`")
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})


def test_version_formats_agree(capsys: pytest.CaptureFixture[str]) -> None:
    from nodepool_k8s.cmd import launcher

    with pytest.raises(SystemExit):
        main(["--version"])
    cli_version = capsys.readouterr().out.split()
    with pytest.raises(SystemExit):
        launcher.build_parser().parse_args(["--version"])
    launcher_version = capsys.readouterr().out.split()
    assert cli_version[0] == "nodepool" and launcher_version[0] == "nodepool-launcher"
    assert cli_version[1:] == launcher_version[1:] and len(cli_version) == 2


def test_drain_wait_follows_the_pool_until_it_is_empty(cli: Cli,
                                                       kazoo_client: KazooClient) -> None:
    body = {"state": "in-use", "provider": "fake", "pool": "main", "type": ["small"],
            "external_id": "main-1", "state_time": 1.0}
    in_use = kazoo_client.create(f"{paths.NODES}/", json.dumps(body).encode(),
                                 sequence=True).rsplit("/", 1)[1]
    waited = cli("drain", "fake/main", "--wait", "--timeout", "1.5")
    assert waited.code == 1
    assert "fake/main: drained (spare 0, deleting 0, in use 1)" in waited.err
    assert "not empty after 1.5s; the drain stays in force" in waited.err
    kazoo_client.delete(f"{paths.NODES}/{in_use}")  # Zuul released it, a launcher deleted it
    done = cli("drain", "fake/main", "--wait")
    assert done.code == 0, done.err
    assert "fake/main: empty (spare 0, deleting 0, in use 0)" in done.err
    assert cli("resume", "fake/main").code == 0
