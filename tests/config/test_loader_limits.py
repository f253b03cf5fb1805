"""Configuration files that would exhaust memory or the stack are refused, quickly.

Aspects: a "billion laughs" alias bomb, a document that contains itself or nests too deep
(through aliases) is a `ConfigError` naming the file, in well under a second; `-c` naming
something that is not a regular file (`/dev/zero`, a FIFO) or a file over the size limit is
refused without being read; a document with many (but not too many) alias expansions and
the usual anchors still loads; `nodepool config-validate` prints one line and exits 1.
"""

from __future__ import annotations

import os
import textwrap
import threading
import time
from pathlib import Path

import pytest

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.config import loader
from nodepool_k8s.config.loader import load_config, load_config_text
from nodepool_k8s.exceptions import ConfigError
from tests.config.common import FIXTURES

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def _bomb(levels: int = 9, width: int = 9) -> str:
    """`levels` anchors, each a list of `width` aliases of the one before: width**levels."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _refused(text: str) -> ConfigError:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config_text(text, path="f.yaml", env={})
    assert time.monotonic() - start < 1.0
    assert info.value.path == "f.yaml" and len(info.value.problems) == 1
    return info.value


def test_alias_bomb_is_refused_at_once() -> None:
    assert len(_bomb()) < 1024
    error = _refused(_bomb())
    assert error.problems == [
        f"config expands to more than {loader.MAX_VALUES} values (YAML aliases?)"]


def test_many_small_expansions_add_up() -> None:
    # No single anchor is big: the total of the document is what is bounded.
    anchor = "big: &big [" + ", ".join(["x"] * 999) + "]\n"
    refs = "uses: [" + ", ".join(["*big"] * (loader.MAX_VALUES // 1000 + 1)) + "]\n"
    assert "expands to more than" in _refused(anchor + refs).problems[0]


def test_moderate_alias_use_is_not_refused() -> None:
    # 9**4 = 6561 values through aliases: past the limit check, the schema judges the key.
    text = MINIMAL + "extra:\n" + textwrap.indent(_bomb(levels=4), "  ")
    assert _refused(text).problems == ["extra: unknown key"]


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: [1, *a]}"])
def test_document_containing_itself_is_refused(text: str) -> None:
    assert "contains itself" in _refused(text).problems[0]  # was a RecursionError


def test_nesting_through_aliases_is_refused() -> None:
    # Each anchor is 50 levels (under the parser's own limit); aliases stack them to 150.
    nest = "[" * 50 + "{}" + "]" * 50
    text = (f"a: &a {nest}\nb: &b {nest.replace('{}', '*a')}\n"
            f"c: {nest.replace('{}', '*b')}\n")
    assert _refused(text).problems == [f"config nests more than {loader.MAX_DEPTH} levels deep"]


def test_dev_zero_is_not_read() -> None:
    start = time.monotonic()
    with pytest.raises(ConfigError) as info:
        load_config("/dev/zero", env={})  # was a MemoryError after reading for seconds
    assert time.monotonic() - start < 1.0
    assert str(info.value) == "/dev/zero: cannot read the file: not a regular file"


def test_secure_file_must_be_regular(tmp_path: Path) -> None:
    main_file = tmp_path / "nodepool.yaml"
    main_file.write_text(MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_config(str(main_file), "/dev/zero", env={})
    assert info.value.problems == ["cannot read the file: not a regular file"]


def test_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "nodepool.yaml"
    os.mkfifo(fifo)

    def writer() -> None:
        # Feeds a reader that blocks in open() (the old behaviour) a valid configuration,
        # so that a regression fails the test instead of hanging the run.
        try:
            with open(fifo, "w") as handle:
                handle.write(MINIMAL)
        except BrokenPipeError:  # the reader closed it unread, as it should
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError) as info:
            load_config(str(fifo), env={})
        assert time.monotonic() - start < 1.0
        assert info.value.problems == ["cannot read the file: not a regular file"]
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer finish
        thread.join(5)


def test_oversized_file_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(MINIMAL)
    with open(path, "a") as handle:
        handle.truncate(loader.MAX_FILE_BYTES + 1)  # sparse: no 4 MiB written
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert info.value.problems == [
        f"cannot read the file: it has more than {loader.MAX_FILE_BYTES} bytes"
        f" ({loader.MAX_FILE_BYTES + 1}), too many for a configuration"]


def test_file_at_the_size_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "nodepool.yaml"
    padding = loader.MAX_FILE_BYTES - len(MINIMAL.encode())
    path.write_text(MINIMAL + "#" * (padding - 1) + "\n")
    assert path.stat().st_size == loader.MAX_FILE_BYTES
    assert list(load_config(str(path), env={}).labels) == ["small"]


@pytest.mark.parametrize("kind", ["bomb", "dev-zero"])
def test_config_validate_prints_one_line(kind: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = "/dev/zero"
    if kind == "bomb":
        path = str(tmp_path / "nodepool.yaml")
        Path(path).write_text(_bomb())
    start = time.monotonic()
    assert main(["-c", path, "config-validate"]) == 1
    assert time.monotonic() - start < 1.0
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"{path}: ")
    assert "Traceback" not in err and "Error" not in err
