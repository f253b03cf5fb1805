"""Launch failures against injected simulator faults.

Aspects: API errors are retried then succeed (and give up as TemporaryError), Retry-After is
honoured, request timeouts are retried; ErrImagePull/ImagePullBackOff fail fast with their
reason; Unschedulable fails after its grace (moved by a ManualClock); quota 403 →
QuotaExceeded; a boot timeout; cancel stops a launch promptly; a failed attempt leaves no
namespace behind; a retry uses a fresh namespace name; a taken name falls back to a random
suffix; tokens never reach the logs.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import threading
import types
from typing import Any, Callable

import pytest

from kubernetes.client.exceptions import ApiException

from nodepool_k8s.runtime.cancel import CancelEvent
from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.core.conditions import LAUNCHED, Condition
from nodepool_k8s.core.errors import LaunchCancelled, LaunchError, QuotaExceeded, TemporaryError
from nodepool_k8s.driver.kubernetes import client as kube_client
from nodepool_k8s.dev.simulator import Simulator
from tests.helpers import Signal
from tests.kubernetes.conftest import FAST, ProviderFactory
from tests.kubernetes.factories import make_label, make_spec

OURS = "nodepool_provider_name=kubespray"
POD = make_label("pod-fedora", image="docker.io/fedora:40", boot_timeout=60)
BAD_POD = make_label("pod-bad", image="registry.example/bad/image:1", boot_timeout=60)
NS = make_label("k8s-namespace", "namespace", boot_timeout=60)
DAY_POD = make_label("pod-fedora", image="docker.io/fedora:40", boot_timeout=86400)


def _no_namespaces_left(sim: Simulator) -> bool:
    return not sim.list("namespaces", label_selector=OURS)


def _launch(provider: Any, label: str, cancel: threading.Event | None = None,
            **kw: Any) -> Any:
    return provider.launch(make_spec(provider.config, label, **kw),
                           cancel or threading.Event())


# -- API errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("verb,resource", [("create", "namespaces"),
                                           ("create", "serviceaccounts/token"),
                                           ("create", "rolebindings"), ("create", "pods")])
def test_api_errors_are_retried(sim: Simulator, make_k8s_provider: ProviderFactory,
                                verb: str, resource: str) -> None:
    provider = make_k8s_provider(sim, POD, api_retries=3)
    sim.fail_next(verb, resource, count=2, code=503)
    result = _launch(provider, "pod-fedora")
    assert result.external_id == "main-0000000000"
    assert sim.counters[f"{verb} {resource}"] == 3  # two refused, the third made it


def test_api_errors_beyond_retries_raise_temporary_and_clean_up(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    provider = make_k8s_provider(sim, POD, api_retries=2)
    sim.fail_next("create", "roles", count=5, code=500)
    updates: list[Condition] = []
    with pytest.raises(TemporaryError) as info:
        provider.launch(make_spec(provider.config, "pod-fedora"), threading.Event(),
                        lambda _, *conditions: updates.extend(conditions))
    assert not isinstance(info.value, QuotaExceeded)
    assert sim.counters["create roles"] == 3  # 1 + api-retries, then given up
    # The namespace was launched; access never got registered (the core records ApiError).
    assert [c.type for c in updates] == [LAUNCHED]
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


@pytest.mark.parametrize("limit,sent", [(4, 1), (0, 0)])
def test_a_failed_fence_ends_its_step_and_no_binding_goes_out(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal,
        limit: int, sent: int) -> None:
    """The quota failing beyond its retries ends the launch's step with its failure, and
    the role binding (which waits for the role) and the token are never asked for. With
    few launches running (`together_launches` 4: this one) the quota, the service account
    and the role go out together (one round trip), so the others were sent as well; with
    more running than the limit (0: any) the step goes one request after the other and
    ends at the quota, before the service account and the role."""
    provider = make_k8s_provider(sim, NS, api_retries=1,
                                 settings=dataclasses.replace(FAST, together_launches=limit))
    sim.fail_next("create", "resourcequotas", count=2, code=500)
    with pytest.raises(TemporaryError, match="resourcequota"):
        _launch(provider, "k8s-namespace")
    assert sim.counters["create resourcequotas"] == 2
    assert sim.counters.get("create serviceaccounts", 0) == sent
    assert sim.counters.get("create roles", 0) == sent
    assert sim.counters.get("create rolebindings", 0) == 0
    assert sim.counters.get("create serviceaccounts/token", 0) == 0
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_failed_api_calls_leave_no_reference_cycle(sim: Simulator,
                                                   make_k8s_provider: ProviderFactory) -> None:
    """A failed call's error, the API's answer it came from and that answer's connection
    are freed once nobody holds the error, by reference counting: a cycle through the
    retry loop's frames kept them (and the connection's TLS buffers) until the collector's
    next full pass, one per failed call."""
    provider = make_k8s_provider(sim, NS, api_retries=2, api_backoff=(0.01,))
    _launch(provider, "k8s-namespace", node_id="0000000001")
    gc.collect()
    gc.disable()  # nothing collected behind the test's back: all garbage is seen below
    try:
        sim.fail_next("create", "serviceaccounts", count=1, code=500)  # retried, then made
        _launch(provider, "k8s-namespace", node_id="0000000002")
        sim.fail_next("create", "roles", count=3, code=500)  # beyond the retries
        try:
            _launch(provider, "k8s-namespace", node_id="0000000003")
        except TemporaryError:
            pass
        else:
            raise AssertionError("the launch should have failed")
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        cyclic = [repr(o)[:80] for o in gc.garbage
                  if isinstance(o, ApiException) or (
                      isinstance(o, types.FrameType)
                      and o.f_code.co_filename == kube_client.__file__)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert sim.counters["create roles"] == 2 + 3  # two launches made it, one gave up
    assert cyclic == []


class _RecordingCancel(threading.Event):
    """A launch's cancel event that records how long each wait on it was asked to take
    (a launch waits on it between retries, so that a cancel cuts the back-off short)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


def test_retry_after_is_honoured(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS, api_backoff=(0.01,))
    sim.fail_next("create", "serviceaccounts", count=1, code=429)
    cancel = _RecordingCancel()
    _launch(provider, "k8s-namespace", cancel=cancel)
    assert sim.counters["create serviceaccounts"] == 2  # refused once, then made it
    # The one back-off waited the server's Retry-After (the simulator sends 1), not the
    # provider's 0.01 s api-backoff.
    assert cancel.waits == [1.0]


def test_one_request_per_attempt_when_refused_with_retry_after(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # urllib3 under the official client used to repeat a GET or DELETE answered 429 (or
    # 503) with Retry-After three times by itself, sleeping the server's Retry-After uncapped
    # (3600 s held a deletion or a watch's re-list for three hours) before our own policy
    # even saw it: every refusal of a throttling API server became four requests.
    provider = make_k8s_provider(sim, NS, api_retries=1)
    result = _launch(provider, "k8s-namespace")
    sim.set_faults(retry_after=0)  # urllib3 would still have repeated, without sleeping
    sim.fail_next("get", "namespaces", count=2, code=429)
    sim.fail_next("delete", "namespaces", count=2, code=429)
    sim.reset_counters()
    with pytest.raises(TemporaryError):
        provider.ownership_problem("main-0000000099", "0000000099")
    with pytest.raises(TemporaryError):
        provider.delete_and_confirm(result.external_id, node_id="0000000000")
    # 1 + api-retries each, no more.
    assert sim.counters["get namespaces"] == 2
    assert sim.counters["delete namespaces"] == 2


def test_one_request_per_attempt_when_a_read_times_out(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # A GET whose answer never came in time was sent four times per attempt (urllib3's
    # own read retries): with the defaults, 24 requests and 12 minutes for one read.
    # api-timeout well above what an answer takes on a busy machine, the stall well above
    # it: only the stalled reads time out.
    provider = make_k8s_provider(sim, NS, api_timeout=1.5, api_retries=1)
    result = _launch(provider, "k8s-namespace")
    sim.stall_next("get", "namespaces", count=8, seconds=4.0)
    sim.reset_counters()
    with pytest.raises(TemporaryError):  # another node's id: not answered from the watch
        provider.ownership_problem(result.external_id, "0000000099")
    assert sim.counters["get namespaces"] == 2


# -- legal HTTP, odd content -----------------------------------------------------------------

def _with_status(status: Any) -> Any:
    return lambda body: {**body, "status": status}


@pytest.mark.parametrize("rewrite", [
    _with_status("issued"),  # status as a string: was an AttributeError (a traceback)
    _with_status(["token"]),
    _with_status({"token": "t" * (1 << 20), "expirationTimestamp": "2030-01-01T00:00:00Z"}),
], ids=["status-string", "status-list", "token-1MiB"])
def test_an_unusable_token_request_answer_is_a_bad_token(
        sim: Simulator, make_k8s_provider: ProviderFactory, rewrite: Any, changes: Signal) -> None:
    # A 1 MiB token was handed out: it travels in the node's ZooKeeper record, which then
    # exceeds what our own readers accept (256 KiB) or what ZooKeeper stores (1 MiB).
    provider = make_k8s_provider(sim, NS)
    sim.rewrite_next("create", "serviceaccounts/token", rewrite)
    with pytest.raises(LaunchError) as info:
        _launch(provider, "k8s-namespace")
    assert info.value.reason == "BadToken"
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_a_ca_bundle_too_large_for_node_records_fails_the_attempt_cleanly(
        make_sim: Callable[..., Simulator], make_k8s_provider: ProviderFactory,
        changes: Signal) -> None:
    # Before, the node's result was built after the attempt's cleanup scope: an unreadable
    # CA left the namespace to the leak sweeper, and any size went into the node record.
    # A CA of this test's own: the client keeps one file per distinct CA for the process,
    # and this test grows it (k8s_sim's CA is shared by the session).
    sim = make_sim()
    provider = make_k8s_provider(sim, NS)
    client, _ = provider._connected()
    with open(client.configuration.ssl_ca_cert, "ab") as f:
        f.write(b"# padding outside the PEM blocks\n" * 5000)  # > 128 KiB, still valid
    with pytest.raises(LaunchError) as info:
        _launch(provider, "k8s-namespace")
    assert info.value.reason == "BadCA" and not info.value.retryable
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


@pytest.mark.parametrize("expires", ["soon", 12345, {"at": 1}, "0001-01-01T00:00:00Z"])
def test_an_odd_token_expiry_is_only_unknown(sim: Simulator,
                                             make_k8s_provider: ProviderFactory,
                                             expires: Any) -> None:
    provider = make_k8s_provider(sim, NS)
    sim.rewrite_next("create", "serviceaccounts/token", lambda body: {
        **body, "status": {**body["status"], "expirationTimestamp": expires}})
    result = _launch(provider, "k8s-namespace")
    assert result.connection_port["token"]
    assert expires != "0001-01-01T00:00:00Z" or result.extra["token_expires"] < 0


@pytest.mark.parametrize("answer", [[], ["main-0000000000"], '"ok"', 7, None],
                         ids=["empty-list", "list", "string", "number", "null"])
def test_an_answer_that_is_not_an_object_is_a_temporary_error(
        sim: Simulator, make_k8s_provider: ProviderFactory, answer: Any) -> None:
    # Read as an object without our labels, a list answering the GET of a ready node's
    # namespace was a verdict ("not provably ours", remembered for good), and the same
    # answer to its DELETE an AttributeError out of `delete`.
    provider = make_k8s_provider(sim, NS, api_retries=1)
    result = _launch(provider, "k8s-namespace")
    sim.rewrite_next("get", "namespaces", lambda body: answer, count=2)
    with pytest.raises(TemporaryError) as info:  # another node's id: not from the watch
        provider.ownership_problem(result.external_id, "0000000099")
    assert "bad response" in str(info.value)
    assert provider.ownership_problem(result.external_id, "0000000099") is not None
    assert provider.ownership_problem(result.external_id, "0000000000") is None
    sim.rewrite_next("delete", "namespaces", lambda body: answer)
    # The retry meets 404: gone.
    provider.delete_and_confirm(result.external_id, node_id="0000000000")
    assert sim.get("namespaces", result.external_id) is None


def _launch_in_thread(provider: Any, label: str, ended: Signal, **kw: Any) -> list[Any]:
    """Launch on a thread; the list gets its result or exception, then `ended` is told."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(_launch(provider, label, **kw))
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)
        ended()
    threading.Thread(target=run, daemon=True).start()
    return outcome


@pytest.mark.parametrize("status", [
    {"containerStatuses": {"c": 1}}, "Pending",
    {"conditions": [None], "containerStatuses": [{"state": "waiting"}]},
], ids=["statuses-object", "status-string", "items-of-odd-shape"])
def test_a_pod_status_of_odd_shape_is_waited_out(sim: Simulator,
                                                 make_k8s_provider: ProviderFactory,
                                                 status: Any, changes: Signal) -> None:
    # The watch delivers whatever the API serves: a status of the wrong shape made the
    # launch raise AttributeError (a traceback, reason Unknown) instead of waiting for a
    # readable version or, as here, the boot timeout.
    provider = make_k8s_provider(sim, POD)
    sim.set_faults(unschedulable=True)
    outcome = _launch_in_thread(provider, "pod-fedora", changes, boot_timeout=2)
    changes.until(lambda: sim.get("pods", "pod-fedora", "main-0000000000"),
                  message="the pod to be created")
    sim.patch("pods", "pod-fedora", {"status": status}, namespace="main-0000000000")
    changes.until(lambda: outcome, message="the launch to end")
    assert isinstance(outcome[0], LaunchError) and outcome[0].reason == "BootTimeout"


def test_a_node_name_of_odd_shape_is_not_recorded(sim: Simulator,
                                                  make_k8s_provider: ProviderFactory,
                                                  changes: Signal) -> None:
    # host_id goes into the node's ZooKeeper record, whose readers want a string.
    provider = make_k8s_provider(sim, POD)
    sim.set_faults(unschedulable=True)
    outcome = _launch_in_thread(provider, "pod-fedora", changes)
    changes.until(lambda: sim.get("pods", "pod-fedora", "main-0000000000"),
                  message="the pod to be created")
    sim.patch("pods", "pod-fedora", {"spec": {"nodeName": {"name": "n1"}},
                                     "status": {"phase": "Running"}},
              namespace="main-0000000000")
    changes.until(lambda: outcome, message="the launch to end")
    assert outcome[0].host_id is None


def test_timed_out_creates_are_retried_and_their_409_accepted(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    # The simulator applies each create, then answers too late: the retry meets a 409 for
    # the object our own first attempt made, which must count as success.
    provider = make_k8s_provider(sim, NS, api_timeout=1.5, api_retries=1)  # as above
    for kind in ("namespaces", "serviceaccounts", "roles", "rolebindings"):
        sim.stall_next("create", kind, seconds=4.0)
    result = _launch(provider, "k8s-namespace")
    assert result.external_id == "main-0000000000"
    # Each create was sent twice (the first answer came too late); the second met the
    # object the first made (409), accepted as success: one object of each kind exists.
    for kind in ("namespaces", "serviceaccounts", "roles", "rolebindings"):
        assert sim.counters[f"create {kind}"] == 2, kind
    assert len(sim.list("serviceaccounts", "main-0000000000")) == 1


def test_timeouts_beyond_retries_raise_temporary(sim: Simulator,
                                                 make_k8s_provider: ProviderFactory,
                                                 changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS, api_timeout=1.5, api_retries=0)
    sim.stall_next("create", "namespaces", seconds=4.0)
    with pytest.raises(TemporaryError):
        _launch(provider, "k8s-namespace")
    assert _launch(provider, "k8s-namespace", node_id="0000000001").external_id
    # The first attempt's namespace reached the server; a GET proved it this node's (our
    # labels, our installation, node id), so it was deleted.
    changes.until(lambda: sim.get("namespaces", "main-0000000000") is None,
                  message="the first namespace to be removed")


def test_forbidden_is_not_retried(sim: Simulator, make_k8s_provider: ProviderFactory,
                                  changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS)
    sim.fail_next("create", "roles", count=1, code=403)
    with pytest.raises(LaunchError) as info:
        _launch(provider, "k8s-namespace")
    assert info.value.reason == "Forbidden" and not info.value.retryable
    assert sim.counters["create roles"] == 1
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


# -- pod failures ------------------------------------------------------------------------------

@pytest.mark.parametrize("backoff_delay,reasons", [
    (0.0, {"ErrImagePull", "ImagePullBackOff"}), (30.0, {"ErrImagePull"})])
def test_image_pull_failure_fails_fast(make_sim: Any, make_k8s_provider: ProviderFactory,
                                       backoff_delay: float, reasons: set[str],
                                       changes: Signal) -> None:
    sim = make_sim(image_pull_backoff_delay=backoff_delay)
    sim.set_faults(image_pull_fail=("*bad*",))
    # On a clock that never moves the 60 s boot timeout cannot end the launch: only the
    # pull failure can (the join's deadline only keeps a regression from hanging the run).
    provider = make_k8s_provider(sim, BAD_POD, clock=ManualClock())
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            _launch(provider, "pod-bad")
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the launch did not fail on the image pull failure"
    [error] = outcome
    assert isinstance(error, LaunchError) and error.reason in reasons, error
    assert error.retryable
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_unschedulable_fails_after_grace(sim: Simulator,
                                         make_k8s_provider: ProviderFactory,
                                         changes: Signal) -> None:
    clock = ManualClock()
    provider = make_k8s_provider(sim, POD, clock=clock)  # grace 30 s, boot_timeout 60 s
    sim.set_faults(unschedulable=True)
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _launch(provider, "pod-fedora")
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()

    def unschedulable() -> bool:
        pod = sim.get("pods", "pod-fedora", "main-0000000000")
        conditions = ((pod or {}).get("status") or {}).get("conditions") or []
        return any(c.get("reason") == "Unschedulable" for c in conditions)

    changes.until(unschedulable, message="the pod to be unschedulable")
    # Inside the grace period the launch keeps waiting. (The driver starts the grace when it
    # first sees the condition: at the latest at +20 s here.)
    clock.advance(20)
    thread.join(0.3)
    assert thread.is_alive()
    clock.advance(31)  # +51 s: past any grace start, before the 60 s boot timeout
    thread.join(10)
    assert not thread.is_alive()
    error = outcome["error"]
    assert isinstance(error, LaunchError) and error.reason == "Unschedulable"
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_failed_pod_fails_the_attempt(make_sim: Any, make_k8s_provider: ProviderFactory,
                                      changes: Signal) -> None:
    sim = make_sim(start_delay=3600)
    provider = make_k8s_provider(sim, POD)
    cancel = threading.Event()
    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            _launch(provider, "pod-fedora", cancel=cancel)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    changes.until(lambda: sim.get("pods", "pod-fedora", "main-0000000000"),
                  message="the pod to exist")
    sim.patch("pods", "pod-fedora", {"status": {"phase": "Failed", "reason": "Evicted"}},
              namespace="main-0000000000")
    thread.join(10)
    cancel.set()
    error = outcome["error"]
    assert isinstance(error, LaunchError) and error.reason == "PodFailed"
    assert "Evicted" in str(error)


def test_quota_exceeded(sim: Simulator, make_k8s_provider: ProviderFactory,
                        changes: Signal) -> None:
    provider = make_k8s_provider(sim, POD)
    sim.set_faults(quota_exceeded=True)
    with pytest.raises(QuotaExceeded):
        _launch(provider, "pod-fedora")
    assert sim.counters["create pods"] == 1  # not retried
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_boot_timeout(make_sim: Any, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    # The token is requested at once (TokenRequest); what a launch waits for is the pod.
    sim = make_sim(start_delay=3600)
    clock = ManualClock()
    provider = make_k8s_provider(sim, POD, clock=clock)
    outcome: dict[str, BaseException] = {}
    progressed = threading.Event()

    def run() -> None:
        try:
            provider.launch(make_spec(provider.config, "pod-fedora"), threading.Event(),
                            progress=lambda *_: progressed.set())
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert progressed.wait(10)
    clock.advance(61)
    thread.join(10)
    error = outcome["error"]
    assert isinstance(error, LaunchError) and error.reason == "BootTimeout"
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_cancel_stops_launch_promptly(make_sim: Any, make_k8s_provider: ProviderFactory,
                                      changes: Signal) -> None:
    sim = make_sim(start_delay=3600)
    # No wait tick (as in the daemon): the launch's wait ends on an event, a cancel, or
    # after the time left to its boot timeout, a day on a clock that never moves.
    provider = make_k8s_provider(sim, DAY_POD, clock=ManualClock(),
                                 settings=dataclasses.replace(FAST, wait_tick=None))
    cancel = CancelEvent()  # what the core passes: setting it wakes the waiting launch
    outcome: dict[str, BaseException] = {}
    progressed = threading.Event()

    def run() -> None:
        try:
            provider.launch(make_spec(provider.config, "pod-fedora"), cancel,
                            progress=lambda *_: progressed.set())
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert progressed.wait(10)
    changes.until(lambda: sim.get("pods", "pod-fedora", "main-0000000000"),
                  message="the pod to exist")
    cancel.set()
    # Only the cancel waking the launch's wait can end it (the join's deadline only keeps
    # a regression from hanging the run for a day).
    thread.join(60)
    assert not thread.is_alive(), "the cancel did not end the launch"
    error = outcome["error"]
    assert isinstance(error, LaunchCancelled) and error.reason == "Cancelled"
    changes.until(lambda: _no_namespaces_left(sim), message="the namespace to be removed")


def test_cancel_before_start(sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LaunchError) as info:
        _launch(provider, "k8s-namespace", cancel=cancel)
    assert info.value.reason == "Cancelled"
    assert _no_namespaces_left(sim)


# -- naming across attempts --------------------------------------------------------------------

def test_retry_uses_fresh_namespace_name(make_sim: Any,
                                         make_k8s_provider: ProviderFactory) -> None:
    sim = make_sim(namespace_delete_delay=3600)  # the first namespace stays Terminating
    sim.set_faults(image_pull_fail=("*bad*",))
    provider = make_k8s_provider(sim, BAD_POD, POD,
                                 settings=dataclasses.replace(FAST, cleanup_timeout=0.2))
    with pytest.raises(LaunchError):
        _launch(provider, "pod-bad", attempt=1)
    first = sim.get("namespaces", "main-0000000000")
    assert first is None or first["status"]["phase"] == "Terminating"
    result = _launch(provider, "pod-fedora", attempt=2)
    assert result.external_id == "main-0000000000-2"


def test_taken_name_falls_back_to_random_suffix(
        sim: Simulator, make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, NS)
    first = _launch(provider, "k8s-namespace")
    again = _launch(provider, "k8s-namespace")  # same node id and attempt: name is taken
    assert again.external_id != first.external_id
    assert again.external_id.startswith("main-0000000000-")
    # The namespace we did not create is left alone.
    assert sim.get("namespaces", first.external_id) is not None


def test_failed_attempt_leaves_nothing_behind(sim: Simulator,
                                              make_k8s_provider: ProviderFactory) -> None:
    provider = make_k8s_provider(sim, BAD_POD)
    sim.set_faults(image_pull_fail=("*bad*",))
    with pytest.raises(LaunchError):
        _launch(provider, "pod-bad")
    assert _no_namespaces_left(sim)  # confirmed before launch returned
    assert not sim.list("pods", label_selector=OURS)
    assert not sim.list("secrets", label_selector=OURS)


# -- secrets in logs ---------------------------------------------------------------------------

def test_tokens_never_logged(sim: Simulator, make_k8s_provider: ProviderFactory,
                             caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("kubernetes", "urllib3", "nodepool_k8s"):
        caplog.set_level(logging.DEBUG, logger=name)
    provider = make_k8s_provider(sim, NS, POD)
    sim.fail_next("get", "secrets", count=1, code=500)
    ns_result = _launch(provider, "k8s-namespace")
    pod_result = _launch(provider, "pod-fedora", node_id="0000000001")
    logging.getLogger("test").info("result %s %r", pod_result, ns_result)
    provider.delete_and_confirm(ns_result.external_id)
    tokens = [r.connection_port["token"] for r in (ns_result, pod_result)]
    secrets = [s["data"]["token"] for s in sim.list("secrets", label_selector=OURS)]
    text = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert caplog.records  # debug logging really was on
    for secret in tokens + secrets:
        assert secret not in text


def test_cancel_during_api_retries_reports_cancelled(
        sim: Simulator, make_k8s_provider: ProviderFactory, changes: Signal) -> None:
    provider = make_k8s_provider(sim, NS, api_retries=5, api_backoff=(30.0,))
    sim.fail_next("create", "namespaces", count=10, code=503)
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            _launch(provider, "k8s-namespace", cancel=cancel)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    changes.until(lambda: sim.counters.get("create namespaces", 0) >= 1,
                  message="the first create")
    cancel.set()
    thread.join(5)
    assert not thread.is_alive()  # the 30 s backoff was cut short
    [error] = outcome
    assert isinstance(error, LaunchError) and error.reason == "Cancelled"
