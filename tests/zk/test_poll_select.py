"""`poll_select`, the `poll()`-based select of our kazoo handler, answers like kazoo's."""

from __future__ import annotations

import socket
import time

import pytest

from nodepool_k8s.zk.client import poll_select


def test_readable_writable_and_timeout() -> None:
    a, b = socket.socketpair()
    try:
        assert poll_select([a], [], [], 0) == ([], [], [])
        assert poll_select([a], [a], [], 0) == ([], [a], [])
        started = time.monotonic()
        assert poll_select([a], [], [], 0.05) == ([], [], [])
        assert time.monotonic() - started >= 0.04
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
