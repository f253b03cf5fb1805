"""Bad operator input and bad records never end in a traceback.

Aspects: `nodepool events --node` takes the same node ids as show/delete/hold (digits,
leading zeros optional) and anything else is a usage error (exit 2) before ZooKeeper is
contacted; `nodepool pool-state` (and pause/drain/resume, which print the same rows) leaves
out a malformed pool-state entry with a one-line warning naming its znode, shows the good
ones, and exits 0.
"""

from __future__ import annotations

import json

import pytest
from kazoo.client import KazooClient

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.zk import pool_state
from tests.cli.conftest import Cli


@pytest.mark.parametrize("value", ["abc", "../1", "0000000001/lock", "-3", "", "3.0", "１２"])
def test_events_node_must_be_digits(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        # No such config file: getting past argument parsing would fail differently (1).
        main(["-c", "/nonexistent/nodepool.yaml", "events", f"--node={value}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "node id is digits only" in err and "Traceback" not in err


def test_events_node_accepts_short_ids(cli: Cli) -> None:
    for value in ("3", "0000000003", " 3 "):
        result = cli("events", "--node", value, "--json")
        assert (result.code, result.json(), result.err) == (0, [], "")


BAD_ENTRIES = {
    "fake%2Fmain": b'{"action": "pause", "time": "yesterday"}',  # was ValueError
    "fake": b'{"action": "drain", "time": 1e300}',  # was OverflowError
    "other": b'{"action": "pause", "reason": 5}',
}


def test_pool_state_skips_malformed_entries_with_a_warning(
        cli: Cli, kazoo_client: KazooClient) -> None:
    for name, data in BAD_ENTRIES.items():
        kazoo_client.create(f"{pool_state.ROOT}/{name}", data, makepath=True)

    result = cli("pool-state", "--json")
    assert result.code == 0, result.err
    [row] = result.json()
    assert (row["provider"], row["pool"], row["state"]) == ("fake", "main", "active")
    warnings = result.err.splitlines()
    assert len(warnings) == len(BAD_ENTRIES), result.err
    assert "Traceback" not in result.err
    for name in BAD_ENTRIES:
        [line] = [w for w in warnings if f"{pool_state.ROOT}/{name}:" in w]
        assert line.startswith("warning: ignoring malformed pool-state entry")
    assert any("time must be" in w and "'yesterday'" in w for w in warnings)
    assert any("reason must be a string" in w for w in warnings)

    # A good entry next to the bad ones is shown; pausing again replaces a bad one.
    paused = cli("pause", "fake/main", "--reason", "upgrade", "--json")
    assert paused.code == 0, paused.err
    [row] = paused.json()
    assert (row["state"], row["reason"]) == ("paused", "upgrade")
    assert len(paused.err.splitlines()) == len(BAD_ENTRIES) - 1
    data, _ = kazoo_client.get(f"{pool_state.ROOT}/fake%2Fmain")
    assert json.loads(data)["action"] == "pause"
    table = cli("pool-state")
    assert table.code == 0 and "paused" in table.out and "upgrade" in table.out
