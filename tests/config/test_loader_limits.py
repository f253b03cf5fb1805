"""Configuration files that would exhaust memory or the stack are refused, not expanded.

Aspects: a "billion laughs" alias bomb, a document that contains itself or nests too deep
(through aliases) is a `ConfigError` naming the file, raised before anything walks the
expansion (the check measures each anchored collection once, so its work follows the file,
not the expansion); `-c` naming something that is not a regular file (`/dev/zero`, a FIFO)
or a file over the size limit is refused without being read; a document with many (but not
too many) alias expansions and the usual anchors still loads; `nodepool config-validate`
prints one line naming the refusal and exits 1. (How fast this is, is for benchmarks.)
"""

from __future__ import annotations

import os
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from nodepool_k8s.cmd.nodepoolcmd import main
from nodepool_k8s.config import loader
from nodepool_k8s.config.loader import load_config, load_config_text
from nodepool_k8s.core.errors import ConfigError
from tests.config.common import FIXTURES

MINIMAL = (FIXTURES / "minimal.yaml").read_text()


def _bomb(levels: int = 9, width: int = 9) -> str:
    """`levels` anchors, each a list of `width` aliases of the one before: width**levels."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _refused(monkeypatch: pytest.MonkeyPatch, text: str, resolved: bool = False) -> ConfigError:
    """The ConfigError for `text`. Unless `resolved` (the schema's refusal of a document that
    passed the expansion check), nothing walked the document: `resolve`, the first step
    that copies every value an alias stands for, was never reached."""
    walked: list[object] = []
    real_resolve = loader.resolve

    def resolve(data: Any, *args: Any, **kwargs: Any) -> Any:
        walked.append(data)
        return real_resolve(data, *args, **kwargs)

    monkeypatch.setattr(loader, "resolve", resolve)
    with pytest.raises(ConfigError) as info:
        load_config_text(text, path="f.yaml", env={})
    assert info.value.path == "f.yaml" and len(info.value.problems) == 1
    assert bool(walked) == resolved, info.value.problems
    return info.value


def _reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files the loader reads from, as it reads (opening one is not reading it)."""
    reads: list[str] = []

    class Handle:
        def __init__(self, handle: Any, name: str) -> None:
            self._handle, self._name = handle, name

        def __enter__(self) -> "Handle":
            return self

        def __exit__(self, *exc: object) -> None:
            self._handle.close()

        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("read"):
                reads.append(self._name)
            return getattr(self._handle, attr)

    def spy_open(file: Any, *args: Any, **kwargs: Any) -> Handle:
        return Handle(open(file, *args, **kwargs), str(file))

    monkeypatch.setattr(loader, "open", spy_open, raising=False)
    return reads


class _CountedList(list[Any]):
    """A sequence that counts in `iterations` how often it is iterated."""

    def __init__(self, items: list[Any], iterations: dict[int, int]) -> None:
        super().__init__(items)
        self.iterations = iterations

    def __iter__(self) -> Any:
        self.iterations[id(self)] = self.iterations.get(id(self), 0) + 1
        return super().__iter__()


def test_alias_bomb_is_refused_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert len(_bomb()) < 1024
    error = _refused(monkeypatch, _bomb())
    assert error.problems == [
        f"config expands to more than {loader.MAX_VALUES} values (YAML aliases?)"]


def test_expansion_check_measures_each_collection_once() -> None:
    # The bomb as the YAML loader builds it (every alias is the anchored object itself),
    # with lists that count their iterations: measuring by identity walks each of the ten
    # lists once on the way down and once to add it up, however often it is referenced.
    # A check that walked the expansion would iterate a1 9**8 times before refusing.
    iterations: dict[int, int] = {}
    levels = [_CountedList(["lol"] * 9, iterations)]
    for _ in range(9):
        levels.append(_CountedList([levels[-1]] * 9, iterations))
    with pytest.raises(ConfigError) as info:
        loader._check_expansion({f"a{n}": level for n, level in enumerate(levels)}, "f.yaml")
    assert info.value.problems == [
        f"config expands to more than {loader.MAX_VALUES} values (YAML aliases?)"]
    assert iterations and max(iterations.values()) <= 2, iterations


def test_many_small_expansions_add_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # No single anchor is big: the total of the document is what is bounded.
    anchor = "big: &big [" + ", ".join(["x"] * 999) + "]\n"
    refs = "uses: [" + ", ".join(["*big"] * (loader.MAX_VALUES // 1000 + 1)) + "]\n"
    assert "expands to more than" in _refused(monkeypatch, anchor + refs).problems[0]


def test_moderate_alias_use_is_not_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # 9**4 = 6561 values through aliases: past the limit check, the schema judges the key.
    text = MINIMAL + "extra:\n" + textwrap.indent(_bomb(levels=4), "  ")
    assert _refused(monkeypatch, text, resolved=True).problems == ["extra: unknown key"]


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: [1, *a]}"])
def test_document_containing_itself_is_refused(monkeypatch: pytest.MonkeyPatch,
                                               text: str) -> None:
    # was a RecursionError
    assert "contains itself" in _refused(monkeypatch, text).problems[0]


def test_nesting_through_aliases_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each anchor is 50 levels (under the parser's own limit); aliases stack them to 150.
    nest = "[" * 50 + "{}" + "]" * 50
    text = (f"a: &a {nest}\nb: &b {nest.replace('{}', '*a')}\n"
            f"c: {nest.replace('{}', '*b')}\n")
    assert _refused(monkeypatch, text).problems == [
        f"config nests more than {loader.MAX_DEPTH} levels deep"]


def test_dev_zero_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _reads(monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_config("/dev/zero", env={})  # was a MemoryError after reading for seconds
    assert str(info.value) == "/dev/zero: cannot read the file: not a regular file"
    assert reads == []


def test_secure_file_must_be_regular(tmp_path: Path) -> None:
    main_file = tmp_path / "nodepool.yaml"
    main_file.write_text(MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_config(str(main_file), "/dev/zero", env={})
    assert info.value.problems == ["cannot read the file: not a regular file"]


def test_fifo_is_refused_without_waiting_for_a_writer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "nodepool.yaml"
    os.mkfifo(fifo)

    def writer() -> None:
        # Feeds a reader that blocks in open() (the old behaviour) a valid configuration,
        # so that a regression fails the test (the file loads) instead of hanging the run.
        try:
            with open(fifo, "w") as handle:
                handle.write(MINIMAL)
        except BrokenPipeError:  # the reader closed it unread, as it should
            pass

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    reads = _reads(monkeypatch)
    try:
        with pytest.raises(ConfigError) as info:
            load_config(str(fifo), env={})
        assert info.value.problems == ["cannot read the file: not a regular file"]
        assert reads == []
    finally:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # lets the writer finish
        thread.join(5)


def test_oversized_file_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(MINIMAL)
    with open(path, "a") as handle:
        handle.truncate(loader.MAX_FILE_BYTES + 1)  # sparse: no 4 MiB written
    reads = _reads(monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert info.value.problems == [
        f"cannot read the file: it has more than {loader.MAX_FILE_BYTES} bytes"
        f" ({loader.MAX_FILE_BYTES + 1}), too many for a configuration"]
    assert reads == []


def test_file_at_the_size_limit_is_read(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nodepool.yaml"
    padding = loader.MAX_FILE_BYTES - len(MINIMAL.encode())
    path.write_text(MINIMAL + "#" * (padding - 1) + "\n")
    assert path.stat().st_size == loader.MAX_FILE_BYTES
    reads = _reads(monkeypatch)
    assert list(load_config(str(path), env={}).labels) == ["small"]
    assert reads == [str(path)]  # (the spy the tests above rely on sees reads)


@pytest.mark.parametrize("kind,refusal", [
    ("bomb", f"config expands to more than {loader.MAX_VALUES} values"),
    ("dev-zero", "cannot read the file: not a regular file")])
def test_config_validate_prints_one_line(kind: str, refusal: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = "/dev/zero"
    if kind == "bomb":
        path = str(tmp_path / "nodepool.yaml")
        Path(path).write_text(_bomb())
    assert main(["-c", path, "config-validate"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"{path}: {refusal}"), err
    assert "Traceback" not in err and "Error" not in err
