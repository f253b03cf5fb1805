"""Pure parts of waiting and client set-up, without a cluster.

Aspects: watch event decoding from chunked and plain streams (split lines, trailing line),
ERROR events (410 → Gone, others → TemporaryError), the shared cache's wait (result,
deadline on an injected clock, cancel), body-logging suppression, kubeconfig path rules.
"""

from __future__ import annotations

import io
import logging
import threading
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from nodepool_k8s.runtime.cancel import CancelEvent
from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, ManualClock
from nodepool_k8s.driver.kubernetes import client as kclient
from nodepool_k8s.driver.kubernetes import waiter
from nodepool_k8s.driver.kubernetes.errors import Gone
from nodepool_k8s.driver.kubernetes import slim
from nodepool_k8s.driver.kubernetes.waiter import ObjectWatch, iter_events, wait_namespace_deleted
from nodepool_k8s.core.errors import LaunchCancelled, LaunchError, NotFound, TemporaryError
from tests.helpers import Signal


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
                       clock or ManualClock(), tick=0.01, slim=slim.pod)


def test_error_events() -> None:
    watch = _watch()
    with pytest.raises(Gone):
        watch._apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}}, "1")
    with pytest.raises(TemporaryError):
        watch._apply({"type": "ERROR", "object": {"code": 500}}, "1")


@pytest.mark.parametrize("event", [
    {"type": "ADDED", "object": "pod"}, {"type": "MODIFIED", "object": ["pod"]},
    {"type": "ADDED"}, {"type": "ERROR", "object": "boom"}, ["ADDED", {}], "ADDED", 7,
], ids=repr)
def test_an_event_without_an_object_ends_the_watch(event: Any) -> None:
    # An ADDED "pod" was cached as a pod (the capacity tracker and every other reader of
    # the cache then met a string), an ERROR "boom" or a list raised AttributeError.
    watch = _watch()
    with pytest.raises(TemporaryError):
        watch._apply(event, "1")
    assert watch.objects() == []


def test_a_list_answer_of_odd_shape_caches_only_objects(make_k8s_provider: Any,
                                                        sim: Any, changes: Signal) -> None:
    provider = make_k8s_provider(sim)
    client = provider._client
    odd = ["pod", 7, None, ["x"], {"metadata": {"name": "p", "namespace": "n"}}]
    sim.rewrite_next("list", "pods", lambda body: {**body, "items": odd})
    watch = ObjectWatch("pods", client, client.core.list_pod_for_all_namespaces,
                        provider.selector, SYSTEM_CLOCK, watch_timeout=5, slim=slim.pod)
    changes.listen(watch)
    watch.start()
    try:
        changes.until(lambda: watch.synced, message="the list")
        assert watch.objects() == [slim.pod({"metadata": {"name": "p", "namespace": "n"}})]
    finally:
        watch.stop()


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
    assert results == [slim.pod(obj)]


def test_cancel_event_wakes_a_waiter_without_a_tick() -> None:
    # No tick and a deadline 1000 s away: only the cancel event's subscription can wake it.
    watch = ObjectWatch("pods", None, lambda **kw: None, "x=y",  # type: ignore[arg-type]
                        ManualClock(), slim=slim.pod)
    cancel = CancelEvent()
    errors: list[BaseException] = []
    waiting = threading.Event()

    def check(obj: Any) -> Any:
        waiting.set()
        return None

    def run() -> None:
        try:
            watch.wait("ns", "p", check, deadline=2000.0, cancel=cancel, what="p")
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    assert waiting.wait(5)
    cancel.set()
    thread.join(30)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], LaunchCancelled)
    assert errors[0].reason == "Cancelled"
    assert not cancel._subscribers  # the waiter unsubscribed


def test_a_time_dependent_check_is_run_again_without_events() -> None:
    # No tick, no events, a deadline 1000 s away: only recheck_in brings the check back.
    watch = ObjectWatch("pods", None, lambda **kw: None, "x=y",  # type: ignore[arg-type]
                        ManualClock(), slim=slim.pod)
    grace_over = threading.Event()
    checked = threading.Event()
    results: list[Any] = []

    def check(obj: Any) -> Any:
        checked.set()
        return "gave up" if grace_over.is_set() else None

    thread = threading.Thread(target=lambda: results.append(watch.wait(
        "ns", "p", check, deadline=2000.0, cancel=CancelEvent(), what="p",
        recheck_in=lambda: 0.01)))
    thread.start()
    assert checked.wait(5)
    grace_over.set()
    thread.join(30)
    assert not thread.is_alive() and results == ["gave up"]


def test_cancel_event_calls_late_subscribers_at_once() -> None:
    cancel = CancelEvent()
    cancel.set()
    called: list[int] = []
    unsubscribe = cancel.subscribe(lambda: called.append(1))
    unsubscribe()
    unsubscribe()  # idempotent
    assert called == [1] and cancel.is_set()


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


# -- confirming a namespace deletion through the shared namespace watch -------------------------

def _ns(name: str, uid: str, owner: str | None = "p", terminating: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid, "resourceVersion": "5",
                            "labels": {"nodepool_provider_name": owner} if owner else {}}
    if terminating:
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    return {"kind": "Namespace", "metadata": meta}


class _Reads:
    """A stand-in KubeClient whose only call is reading a namespace (counted)."""

    def __init__(self, answer: dict[str, Any] | None) -> None:
        self.answer = answer
        self.reads = 0
        self.read = Signal()  # told after each read is counted
        self.core = self

    def read_namespace(self, name: str) -> None:  # pragma: no cover - only passed along
        raise AssertionError("call() is faked")

    def call(self, what: str, fn: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        self.reads += 1
        self.read()
        if self.answer is None:
            raise NotFound(what)
        return self.answer


def _ns_watch(synced: bool = True) -> ObjectWatch:
    watch = ObjectWatch("namespaces", None, lambda **kw: None,  # type: ignore[arg-type]
                        "nodepool_provider_name=p", ManualClock(), tick=0.01, tombstones=2,
                        owned=lambda o: o["metadata"]["labels"].get(
                            "nodepool_provider_name") == "p", slim=slim.namespace)
    if synced:
        watch._synced.set()
    return watch


def _confirm(watch: ObjectWatch, client: _Reads, uid: str | None = "u1",
             ask_after: float = 0.05) -> None:
    clock = watch._clock
    wait_namespace_deleted(watch, client, "ns", uid,  # type: ignore[arg-type]
                           clock.monotonic() + 1, clock, ask_after=ask_after)


def _in_thread(fn: Any) -> tuple[threading.Thread, list[BaseException | None]]:
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def test_deletion_confirmed_by_the_deleted_event_without_reads() -> None:
    watch, client = _ns_watch(), _Reads(None)
    watch._apply({"type": "ADDED", "object": _ns("ns", "u1")}, "")
    thread, outcome = _in_thread(lambda: _confirm(watch, client, ask_after=30))
    thread.join(0.1)  # given the chance, it must not finish: the namespace is still there
    assert thread.is_alive() and outcome == []
    watch._apply({"type": "DELETED", "object": _ns("ns", "u1", terminating=True)}, "")
    thread.join(5)
    assert outcome == [None] and client.reads == 0


def test_deletion_seen_before_the_waiter_registered_needs_no_read() -> None:
    watch, client = _ns_watch(), _Reads(_ns("ns", "u1"))
    watch._apply({"type": "ADDED", "object": _ns("ns", "u1")}, "")
    watch._apply({"type": "DELETED", "object": _ns("ns", "u1")}, "")
    _confirm(watch, client, ask_after=30)
    assert client.reads == 0


def test_a_newer_namespace_of_the_same_name_means_ours_is_gone() -> None:
    watch, client = _ns_watch(), _Reads(None)
    watch._apply({"type": "ADDED", "object": _ns("ns", "u2")}, "")
    _confirm(watch, client, uid="u1", ask_after=30)
    assert client.reads == 0


def test_a_watch_that_never_saw_it_reads_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Not synced (e.g. the launcher just started): one read; 404 is gone.
    watch, client = _ns_watch(synced=False), _Reads(None)
    _confirm(watch, client)
    assert client.reads == 1
    # Synced but the namespace is unknown to it: trusted for `ask_after`, then one read.
    # (`ask_after` is on the module's monotonic clock, which the test holds and moves.)
    now = [500.0]
    monkeypatch.setattr(waiter, "time", SimpleNamespace(monotonic=lambda: now[0]))
    watch, client = _ns_watch(), _Reads(None)
    thread, outcome = _in_thread(lambda: _confirm(watch, client, ask_after=2.0))
    thread.join(0.1)  # given the chance, it must neither read nor finish
    assert thread.is_alive() and outcome == [] and client.reads == 0
    now[0] += 1.0  # half of `ask_after`: still trusted
    thread.join(0.1)
    assert thread.is_alive() and outcome == [] and client.reads == 0
    now[0] += 1.0
    thread.join(5)
    assert outcome == [None] and client.reads == 1


def test_after_the_read_the_watch_answers() -> None:
    watch, client = _ns_watch(), _Reads(_ns("ns", "u1", terminating=True))
    thread, outcome = _in_thread(lambda: _confirm(watch, client, ask_after=0.0))
    client.read.until(lambda: client.reads == 1, message="the one read")
    thread.join(0.1)  # given the chance, it must neither finish nor read again
    assert thread.is_alive() and outcome == [] and client.reads == 1
    watch._apply({"type": "ADDED", "object": _ns("ns", "u1", terminating=True)}, "")
    watch._apply({"type": "DELETED", "object": _ns("ns", "u1", terminating=True)}, "")
    thread.join(5)
    assert outcome == [None] and client.reads == 1


def test_leaving_the_selector_is_not_deletion() -> None:
    # A DELETED event for an object that lost our label: read, then watch it by name.
    watch, client = _ns_watch(), _Reads(None)
    watch._apply({"type": "ADDED", "object": _ns("ns", "u1")}, "")
    watch._apply({"type": "DELETED", "object": _ns("ns", "u1", owner=None)}, "")
    assert watch.tombstone("", "ns") == ("u1", False)
    _confirm(watch, client)
    assert client.reads == 1


def test_timeout_is_a_temporary_error() -> None:
    watch, client = _ns_watch(), _Reads(None)
    watch._apply({"type": "ADDED", "object": _ns("ns", "u1")}, "")
    clock = watch._clock  # the provider gives the watch and the waiter the same clock
    assert isinstance(clock, ManualClock)
    thread, outcome = _in_thread(lambda: wait_namespace_deleted(
        watch, client, "ns", "u1", clock.monotonic() + 10, clock))  # type: ignore[arg-type]
    thread.join(0.05)  # not before its deadline
    assert thread.is_alive()
    clock.advance(11)
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], TemporaryError)
    assert "deletion timeout" in str(outcome[0]) and client.reads == 0


def test_tombstones_are_bounded_and_relists_leave_unconfirmed_ones() -> None:
    watch = _ns_watch()
    for i in range(3):
        watch._apply({"type": "ADDED", "object": _ns(f"n{i}", f"u{i}")}, "")
        watch._apply({"type": "DELETED", "object": _ns(f"n{i}", f"u{i}")}, "")
    assert watch.tombstone("", "n0") is None
    assert watch.tombstone("", "n2") == ("u2", True)
    watch._apply({"type": "ADDED", "object": _ns("n9", "u9")}, "")
    watch._list_fn = lambda **kw: None
    watch._client = type("C", (), {"call": lambda self, *a, **k: {"items": []}})()
    watch._relist()
    assert watch.tombstone("", "n9") == ("u9", False)


class _LogSignal(logging.Handler):
    """Tells `signal` of every record the root logger handles, after the handlers added
    before it (pytest's `caplog` among them) have it."""

    def __init__(self, signal: Signal) -> None:
        super().__init__()
        self._signal = signal

    def emit(self, record: logging.LogRecord) -> None:
        self._signal()


def test_watch_failures_back_off_across_relists(make_sim: Any, make_k8s_provider: Any,
                                                caplog: pytest.LogCaptureFixture,
                                                changes: Signal) -> None:
    """Watch forbidden but list allowed: every round lists fine and then fails. The
    backoff must keep growing across those successful lists (it used to reset after each
    list and relist every 0.2 s forever)."""
    from nodepool_k8s.driver.kubernetes.waiter import restart_delay
    sim = make_sim()
    provider = make_k8s_provider(sim)
    caplog.set_level(logging.DEBUG, logger="nodepool_k8s.driver.kubernetes.waiter")
    # Drop the running pods watch so the next one meets the fault. Only once it is open:
    # a watch still being opened would reach the server unfaulted and run for 30 s.
    pods = provider._pods
    changes.until(lambda: pods._response is not None, message="the pods watch to be open")
    sim.fail_next("watch", "pods", count=1000, code=403)
    with pods._lock:
        response = pods._response
    from nodepool_k8s.driver.kubernetes.waiter import _close
    _close(response)

    def delays() -> list[str]:
        return [r.getMessage() for r in caplog.records if "pods watch failed" in r.getMessage()]
    logged_any = _LogSignal(changes)
    logging.getLogger().addHandler(logged_any)
    try:
        changes.until(lambda: len(delays()) >= 3, 30, message="three failed watch rounds")
    finally:
        logging.getLogger().removeHandler(logged_any)
    logged = delays()[:3]
    for index, line in enumerate(logged):
        assert f"(#{index + 1}), restarting in {restart_delay(index):.1f}s" in line, logged
    assert restart_delay(2) > restart_delay(1) > restart_delay(0)
    # The same failure again is told at WARNING once (then every REPEAT_LOG_INTERVAL):
    # with RBAC cut, a line per round filled the log for as long as it lasted.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING
              and "pods watch failed" in r.getMessage() and "forbidden" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]


def test_event_lines_are_bounded() -> None:
    from nodepool_k8s.driver.kubernetes.waiter import MAX_EVENT_BYTES
    endless = _Chunked([b"{" + b"x" * 65536] * (MAX_EVENT_BYTES // 65536 + 2))
    with pytest.raises(TemporaryError):
        list(iter_events(endless))


def test_many_short_lines_and_big_chunks_are_read_in_bounded_pieces() -> None:
    """A chunk of three million newlines used to be split one line at a time (each split
    copying the rest: a core busy for minutes), and a chunk was taken whole whatever its
    size (a 200 MB chunk, 190 MiB more RSS)."""
    from nodepool_k8s.driver.kubernetes.waiter import READ_BYTES
    asked: list[Any] = []

    class Recording(_Chunked):
        def stream(self, amt: Any, decode_content: bool = True) -> Iterator[bytes]:
            asked.append(amt)
            yield from super().stream(amt, decode_content)

    stream = Recording([b"\n" * 3_000_000 + EVENTS[:30], EVENTS[30:]])
    assert [e["type"] for e in iter_events(stream)] == ["ADDED", "DELETED"]
    assert asked == [READ_BYTES]


class _Ended(_Chunked):
    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class _OneBookmarkThenEnd:
    """A server that lists fine and ends every watch right after one BOOKMARK."""

    def __init__(self) -> None:
        self.watches = 0
        self.stop: threading.Event | None = None

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    def stream(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.watches += 1
        if self.watches > 50 and self.stop is not None:
            self.stop.set()  # hammering: end the test instead of spinning for ever
        return _Ended([b'{"type":"BOOKMARK","object":{"metadata":'
                       b'{"resourceVersion":"2"}}}\n'])


def test_a_watch_that_ends_after_one_event_is_restarted_with_backoff() -> None:
    """Any event used to reset the backoff: a server (or proxy) that sent one bookmark and
    closed was watched again about 23 times a second, for ever, without a log line."""
    from nodepool_k8s.driver.kubernetes.waiter import restart_delay
    client = _OneBookmarkThenEnd()
    watch = ObjectWatch("pods", client, lambda **kw: None,  # type: ignore[arg-type]
                        "x=y", ManualClock(), slim=slim.pod)
    delays: list[float] = []

    class Recording(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if timeout is not None:  # a backoff: recorded, not slept
                delays.append(timeout)
                if len(delays) >= 5:
                    self.set()
            return self.is_set()

    watch._stopped = client.stop = Recording()
    watch._run()  # returns once five backoffs were asked for
    assert delays == [restart_delay(i) for i in range(5)]
    assert client.watches == 5
