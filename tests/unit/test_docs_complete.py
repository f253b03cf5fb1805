"""The operator docs name every command, option and runtime dependency there is.

Aspects: doc/operation.md's command table has a row for every `nodepool` subcommand (and
none for a command that does not exist), each row naming every option of its command; the
`nodepool` usage line names every global option; the `nodepool-launcher` option table names
every option string of the launcher; doc/installation.md's package table names every
`install_requires` entry of setup.cfg (and nothing else). Read from the argparse parsers and
setup.cfg themselves, so a new subcommand, option or dependency fails here until documented.
"""

from __future__ import annotations

import argparse
import configparser
import re
from pathlib import Path

from nodepool_k8s.cmd import launcher as launcher_cmd
from nodepool_k8s.cmd import nodepoolcmd

ROOT = Path(__file__).resolve().parents[2]
OPERATION = ROOT / "doc" / "operation.md"
INSTALLATION = ROOT / "doc" / "installation.md"


def section(path: Path, heading: str) -> str:
    """The text of the section under `heading` (to the next heading of the same level)."""
    text = path.read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start:end if end >= 0 else len(text)]


def first_cells(text: str, header: str) -> list[str]:
    """The first cell of every row of the table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    cells = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells.append(line.split("|")[1].strip())
    return cells


def options(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of `parser` that its help shows (not -h/--help)."""
    return [option for action in parser._actions
            if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
            for option in action.option_strings]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_nodepool_command_and_option_is_in_the_command_table() -> None:
    parser = nodepoolcmd.build_parser()
    cli = section(OPERATION, "## The nodepool CLI")
    rows = {re.match(r"`([a-z-]+)", cell).group(1): cell  # type: ignore[union-attr]
            for cell in first_cells(cli, "command")}
    commands = subcommands(parser)
    assert sorted(rows) == sorted(commands), "commands in doc/operation.md vs the parser"
    missing = [f"{name} {option}" for name, sub in commands.items()
               for option in options(sub) if option not in rows[name]]
    assert not missing, f"options missing from the command table: {missing}"
    usage = re.search(r"```\n(nodepool \[.*)\n```", cli)
    assert usage, "the nodepool usage line"
    named = set(re.findall(r"\[(-[-\w]+)", usage.group(1)))
    unnamed = [a.option_strings for a in parser._actions if a.option_strings
               and not isinstance(a, argparse._HelpAction) and not named & set(a.option_strings)]
    assert not unnamed, f"global options missing from the usage line: {unnamed}"


def test_every_launcher_option_is_in_the_option_table() -> None:
    table = first_cells(section(OPERATION, "## Running under systemd"), "option")
    documented = {option.strip("` ") for cell in table for option in cell.split(",")}
    parser = launcher_cmd.build_parser()
    assert sorted(set(options(parser)) - documented) == []
    assert sorted(documented - set(options(parser))) == []


def test_every_runtime_dependency_is_in_the_installation_docs() -> None:
    setup = configparser.ConfigParser()
    setup.read(ROOT / "setup.cfg")
    required = [re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0]
                for line in setup["options"]["install_requires"].splitlines()
                if line.strip() and not line.strip().startswith("#")]
    assert "kazoo" in required and "prometheus_client" in required
    documented = [cell.strip("`") for cell in first_cells(INSTALLATION.read_text(), "package")]
    assert sorted(required) == sorted(documented)
