"""Command-line values that are wrong are usage errors before anything is contacted.

Aspects: `--lock-timeout` refuses NaN, infinity, negatives and overflowing values; node ids
must be ASCII digits (short ones are zero-padded, long ones kept).
"""

from __future__ import annotations

import pytest

from nodepool_k8s.cmd import common
from nodepool_k8s.cmd.nodepoolcmd import main


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
