"""Command-line values that are wrong are usage errors before anything is contacted, and
the help says what the options do.

Aspects: `--lock-timeout` refuses NaN, infinity, negatives and overflowing values; node ids
must be ASCII digits (short ones are zero-padded, long ones kept); `--json` names a web app
endpoint only where one answers the same keys; `list --detail` names every detail column.
"""

from __future__ import annotations

import pytest

from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.views import listing


@pytest.mark.parametrize("command", ["delete", "hold"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1e308", "soon"])
def test_bad_lock_timeout_is_a_usage_error(command: str, value: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        # No such config file: getting past argument parsing would fail differently (1).
        main(["-c", "/nonexistent/nodepool.yaml", command, "3", f"--lock-timeout={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--lock-timeout" in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["delete", "hold"])
@pytest.mark.parametrize("value", ["abc", "../0000000001", "0000000001/lock", "-3", "",
                                   "１２", "3.0", "0x10"])
def test_node_id_must_be_digits(command: str, value: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["-c", "/nonexistent/nodepool.yaml", command, "--", value])
    assert exit_info.value.code == 2
    assert "node id is digits only" in capsys.readouterr().err


def test_node_id_normalisation() -> None:
    assert common.node_id("3") == "0000000003"
    assert common.node_id(" 0000000042 ") == "0000000042"
    assert common.node_id("12345678901") == "12345678901"
    with pytest.raises(ValueError):
        common.node_id("４２")  # digits, but not ASCII ones


def test_lock_timeout_accepts_zero_and_fractions() -> None:
    assert common.seconds_arg("0") == 0.0
    assert common.seconds_arg("2.5") == 2.5


def _help(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", [["pause", "x"], ["drain", "x"], ["resume", "x"],
                                     ["pool-state"], ["show", "3"], ["info", "p"]])
def test_json_help_promises_no_endpoint_that_does_not_exist(
        command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """These commands have no web app endpoint: their --json said "the web app's keys"."""
    text = _help(capsys, command[0])
    assert "--json print the records as JSON instead of a table" in text
    assert "web app" not in text


@pytest.mark.parametrize("command, endpoint", [
    ("list", "/node-list"), ("request-list", "/request-list"), ("label-list", "/label-list"),
    ("pool-list", "/pool-list"), ("events", "/events")])
def test_json_help_names_the_endpoint_with_the_same_keys(
        command: str, endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert f"(the same keys as the web app's {endpoint})" in _help(capsys, command)


def test_list_detail_help_names_every_detail_column(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "list")
    extra = [header for header, _ in listing.NODE_DETAIL_COLUMNS[len(listing.NODE_COLUMNS):]]
    assert "Drifted" in extra
    assert [h for h in extra if h not in text] == []
