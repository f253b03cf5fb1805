"""`nodepool config-validate`, called in-process and as the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodepool_k8s.cmd.nodepoolcmd import (DEFAULT_CONFIG, DEFAULT_SECURE, build_parser, main,
                                          resolve_files)
from tests.config.common import FIXTURES, SAMPLE

BROKEN = str(FIXTURES / "broken.yaml")
SCRIPT = Path(sys.executable).with_name("nodepool")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: run `bash tools/test-setup.sh` to install the"
                    " console scripts")
    env = {"PATH": "/usr/bin:/bin"}
    if os.environ.get("PYTHONPATH"):
        # The code under test, not whichever checkout the console script was installed from.
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env=env)


# The sample has kubernetes providers and no ZooKeeper ACL (that needs certificates or a
# password, which belong in the secure file): it warns about that and nothing else.
SAMPLE_WARNING = f"{SAMPLE}: zookeeper-acl: warning: off: node records of kubernetes"


def test_sample_validates_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-c", str(SAMPLE), "config-validate"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(SAMPLE_WARNING), err


def test_sample_validates_as_a_subprocess() -> None:
    result = _run("-c", str(SAMPLE), "config-validate")
    assert (result.returncode, result.stdout) == (0, "")
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(SAMPLE_WARNING), result.stderr


def test_broken_file_exits_1_naming_every_place(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", BROKEN, "config-validate"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{BROKEN}: zookeeper-servers[0].port: expected int, got 'twenty'",
        f"{BROKEN}: providers[0].pools[0].labels[0].cpu: expected number, got 'two'",
        f"{BROKEN}: providers[0].pools[1].labels[0].imagee: unknown key (did you mean"
        " 'image'?)",
    ]


def test_broken_file_as_a_subprocess() -> None:
    result = _run("-c", BROKEN, "config-validate")
    assert result.returncode == 1 and result.stdout == ""
    assert f"{BROKEN}: providers[0].pools[0].labels[0].cpu: expected number, got 'two'" in (
        result.stderr.splitlines())


def test_warnings_go_to_stderr_with_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(FIXTURES / "warnings.yaml")
    assert main(["-c", path, "config-validate"]) == 0
    assert capsys.readouterr().err == (
        f"{path}: labels[1].min-ready: warning: 1 ready nodes wanted, but no enabled pool"
        " serves label 'orphan'\n")


def test_secure_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["-c", str(FIXTURES / "minimal.yaml"), "-s", str(FIXTURES / "secure.yaml"),
                 "config-validate"]) == 0
    bad = tmp_path / "secure.yaml"
    bad.write_text("webapp: {port: 1}\n")
    assert main(["-c", str(FIXTURES / "minimal.yaml"), "--secure", str(bad),
                 "config-validate"]) == 1
    assert capsys.readouterr().err.startswith(f"{bad}: webapp: unknown key")


def test_missing_file_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    from nodepool_k8s.config import loader
    monkeypatch.setattr(loader, "READ_RETRY_DELAY", 0.0)
    missing = tmp_path / "none.yaml"
    assert main(["-c", str(missing), "config-validate"]) == 1
    assert capsys.readouterr().err == f"{missing}: cannot read the file: it does not exist\n"


def test_env_substitution_through_the_cli(capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(FIXTURES / "env.yaml")
    monkeypatch.delenv("NODEPOOL_ZK_HOST", raising=False)
    assert main(["-c", path, "config-validate"]) == 1
    assert "environment variable NODEPOOL_ZK_HOST is not set (line 3)" in capsys.readouterr().err
    for name, value in {"NODEPOOL_ZK_HOST": "zk", "NODEPOOL_ZK_PORT": "2181",
                        "NODEPOOL_ZK_CHROOT": "np"}.items():
        monkeypatch.setenv(name, value)
    assert main(["-c", path, "config-validate"]) == 0


def test_global_options_and_defaults(tmp_path: Path) -> None:
    args = build_parser().parse_args(["config-validate"])
    resolve_files(args, {})
    assert (args.config, args.debug) == (DEFAULT_CONFIG, False)
    assert args.secure == (DEFAULT_SECURE if os.path.exists(DEFAULT_SECURE) else None)
    assert DEFAULT_CONFIG == "/etc/nodepool/nodepool.yaml"
    # The unit's files come from the environment too; options win over it.
    args = build_parser().parse_args(["config-validate"])
    resolve_files(args, {"NODEPOOL_CONFIG": "c.yaml", "NODEPOOL_SECURE": "s.conf"})
    assert (args.config, args.secure) == ("c.yaml", "s.conf")
    args = build_parser().parse_args(["-c", "a", "-s", "b", "--debug", "config-validate"])
    assert (args.config, args.secure, args.debug) == ("a", "b", True)


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("nodepool ")


def test_config_option_after_the_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    # `nodepool config-validate -c FILE` is the documented form; `nodepool -c FILE ...` too.
    assert main(["config-validate", "-c", str(SAMPLE)]) == 0
    assert main(["config-validate", "-c", BROKEN]) == 1
    assert "cpu" in capsys.readouterr().err
