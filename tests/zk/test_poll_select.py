"""`_kazoo_ext`: `poll_select` (our kazoo handler's select) answers like kazoo's; the
version check and self-test pass on the installed kazoo and stop the client on another."""

from __future__ import annotations

import select
import socket
from types import SimpleNamespace

import pytest

from nodepool_k8s.zk._kazoo_ext import poll_select


class _RecordingPoll:
    """A `select.poll()` object whose waits are recorded (in milliseconds, as poll takes)."""

    def __init__(self, waits: list[int | None]) -> None:
        self._poll = select.poll()
        self._waits = waits

    def register(self, fd: int, mask: int) -> None:
        self._poll.register(fd, mask)

    def poll(self, timeout: int | None = None) -> list[tuple[int, int]]:
        self._waits.append(timeout)
        return self._poll.poll(timeout)


def test_readable_writable_and_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodepool_k8s.zk import _kazoo_ext
    waits: list[int | None] = []
    monkeypatch.setattr(_kazoo_ext, "select", SimpleNamespace(
        poll=lambda: _RecordingPoll(waits),
        **{name: getattr(select, name) for name in dir(select) if name.startswith("POLL")}))
    monkeypatch.setattr(_kazoo_ext._pollers, "cache", {}, raising=False)  # none reused
    a, b = socket.socketpair()
    try:
        assert poll_select([a], [], [], 0) == ([], [], [])
        assert poll_select([a], [a], [], 0) == ([], [a], [])
        # Nothing ready: the timeout is waited for, in whole milliseconds (rounded up).
        assert poll_select([a], [], [], 0.05) == ([], [], [])
        assert poll_select([a], [], [], 0.0001) == ([], [], [])
        assert waits == [0, 0, 50, 1]
        b.send(b"x")
        # Readable wins over writable for one descriptor, as in kazoo's selector_select.
        assert poll_select([a, b], [a], [], 0) == ([a], [], [])
        assert poll_select([], [b], [], None) == ([], [b], [])
        b.close()
        a.recv(1)
        assert poll_select([a], [], [], 1) == ([a], [], [])  # hung up: readable
    finally:
        a.close()
        b.close()


def test_bad_arguments() -> None:
    a, b = socket.socketpair()
    a.close()
    b.close()
    with pytest.raises(ValueError):
        poll_select([], [], [], -1)
    with pytest.raises((TypeError, ValueError)):
        poll_select([a], [], [], 0)


# -- the rest of _kazoo_ext: the version check and the self-test ---------------------------

def test_self_test_passes_on_the_installed_kazoo() -> None:
    from nodepool_k8s.zk import _kazoo_ext
    assert _kazoo_ext.problems() == []
    _kazoo_ext.check()


def test_unsupported_kazoo_fails_with_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from nodepool_k8s.core.errors import PermanentError
    from nodepool_k8s.zk import _kazoo_ext
    from nodepool_k8s.zk.client import ZkClient, ZkSettings
    monkeypatch.setattr(_kazoo_ext, "installed_version", lambda: "2.12.1")
    monkeypatch.setattr(_kazoo_ext, "_result", [])  # forget the passed check of this process
    with pytest.raises(_kazoo_ext.KazooIncompatible) as info:
        ZkClient(ZkSettings(hosts="127.0.0.1:1")).start()
    assert isinstance(info.value, PermanentError)
    assert "kazoo 2.12.1" in str(info.value) and ">=2.10,<2.12" in str(info.value)


KAZOO_INTERNALS = ("kazoo.protocol.paths", "kazoo.protocol.serialization",
                   "kazoo.protocol.connection", "kazoo.handlers.utils", "._call(",
                   "_prefix_root", ".operations.append", "SequentialThreadingHandler")


def test_only_kazoo_ext_touches_kazoo_internals() -> None:
    """import-linter squashes external packages to `kazoo`, so this rule is checked here:
    no production module but zk/_kazoo_ext.py names one of kazoo's internals."""
    import pathlib

    import nodepool_k8s
    root = pathlib.Path(nodepool_k8s.__file__).parent
    offenders = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative == "zk/_kazoo_ext.py" or relative.startswith(("testing/", "simulator/")):
            continue
        text = path.read_text()
        offenders += [f"{relative}: {name}" for name in KAZOO_INTERNALS if name in text]
    assert offenders == []
