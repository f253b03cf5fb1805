"""Pure parts of waiting and client set-up, without a cluster.

Aspects: watch event decoding from chunked and plain streams (split lines, trailing line),
ERROR events (410 → Gone, others → TemporaryError), the shared cache's wait (result,
deadline on an injected clock, cancel), body-logging suppression, kubeconfig path rules.
"""

from __future__ import annotations

import io
import logging
import threading
from typing import Any, Iterator

import pytest

from nodepool_k8s.clock import ManualClock
from nodepool_k8s.driver.kubernetes import client as kclient
from nodepool_k8s.driver.kubernetes.errors import Gone
from nodepool_k8s.driver.kubernetes.waiter import ObjectWatch, iter_events
from nodepool_k8s.exceptions import LaunchError, TemporaryError


class _Chunked:
    chunked = True

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def stream(self, amt: Any, decode_content: bool = True) -> Iterator[bytes]:
        yield from self._chunks


class _Plain:
    chunked = False

    def __init__(self, data: bytes) -> None:
        self._io = io.BytesIO(data)

    def read1(self, amt: int) -> bytes:
        return self._io.read(7)  # deliberately small reads


EVENTS = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n\n' \
         b'{"type":"DELETED","object":{"metadata":{"name":"a"}}}'


def test_iter_events_chunked_and_plain() -> None:
    chunked = _Chunked([EVENTS[:10], EVENTS[10:60], EVENTS[60:]])
    assert [e["type"] for e in iter_events(chunked)] == ["ADDED", "DELETED"]
    assert [e["type"] for e in iter_events(_Plain(EVENTS))] == ["ADDED", "DELETED"]


def _watch(clock: ManualClock | None = None) -> ObjectWatch:
    # No client is needed for applying events and waiting on the cache.
    return ObjectWatch("pods", None, lambda **kw: None, "x=y",  # type: ignore[arg-type]
                       clock or ManualClock(), tick=0.01)


def test_error_events() -> None:
    watch = _watch()
    with pytest.raises(Gone):
        watch._apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "1")
    with pytest.raises(TemporaryError):
        watch._apply({"type": "ERROR", "object": {"code": 500}}, "1")


def test_bookmark_moves_version_only() -> None:
    watch = _watch()
    version = watch._apply({"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": "42"}}}, "1")
    assert version == "42" and watch.get("", "") is None


def test_wait_is_woken_by_events() -> None:
    watch = _watch()
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(watch.wait(
        "ns", "p", lambda obj: obj, deadline=2000.0, cancel=threading.Event(), what="p")))
    thread.start()
    obj = {"metadata": {"namespace": "ns", "name": "p", "resourceVersion": "3"}}
    watch._apply({"type": "ADDED", "object": obj}, "2")
    thread.join(5)
    assert results == [obj]


def test_wait_deadline_uses_the_clock() -> None:
    clock = ManualClock()
    watch = _watch(clock)
    errors: list[LaunchError] = []

    def run() -> None:
        try:
            watch.wait("ns", "p", lambda obj: obj, deadline=clock.monotonic() + 30,
                       cancel=threading.Event(), what="p")
        except LaunchError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(0.1)
    assert thread.is_alive()
    clock.advance(30)
    thread.join(5)
    assert errors and errors[0].reason == "BootTimeout"


def test_wait_cancel() -> None:
    watch = _watch()
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LaunchError) as info:
        watch.wait("ns", "p", lambda obj: obj, deadline=2000.0, cancel=cancel, what="p")
    assert info.value.reason == "Cancelled"


def test_response_bodies_are_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    kclient._silence_body_logging()
    kclient._silence_body_logging()  # idempotent
    rest = logging.getLogger("kubernetes.client.rest")
    assert sum(isinstance(f, kclient._NoBodies) for f in rest.filters) == 1
    with caplog.at_level(logging.DEBUG, logger="kubernetes.client.rest"):
        rest.debug("response body: %s", '{"data":{"token":"c2VjcmV0"}}')
        rest.debug("something else")
    assert "c2VjcmV0" not in caplog.text and "something else" in caplog.text


def test_kubeconfig_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/a:{tmp_path}/b")
    assert kclient.kubeconfig_paths(None) == [f"{tmp_path}/a", f"{tmp_path}/b"]
    assert kclient.kubeconfig_paths("/x") == ["/x"]
    monkeypatch.delenv("KUBECONFIG")
    assert kclient.kubeconfig_paths(None)[0].endswith(".kube/config")


def test_explicit_missing_kubeconfig_is_an_error(tmp_path: Any) -> None:
    with pytest.raises(TemporaryError, match="not found"):
        kclient.load_configuration(None, str(tmp_path / "missing"), 8)
