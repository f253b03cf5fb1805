"""Pure verdicts and error mapping.

Aspects: token extraction (missing data, decoding), pod verdicts (running, fatal waiting
reasons, failed phases, unschedulable grace on an injected clock, deletion), the status code
→ error type table with Retry-After, and the retry policy's delays.
"""

from __future__ import annotations

import ssl

import pytest

import urllib3
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.runtime.clock import ManualClock
from nodepool_k8s.driver.kubernetes import errors
from nodepool_k8s.driver.kubernetes.client import RetryPolicy
from nodepool_k8s.driver.kubernetes.readiness import PodCheck, Token, token_from_request
from nodepool_k8s.core.errors import (LaunchError, NotFound, PermanentError, QuotaExceeded,
                                      TemporaryError)


# -- token -------------------------------------------------------------------------------------

def test_token_and_expiry_come_from_the_token_request_answer() -> None:
    token = token_from_request({"status": {"token": "bound-token",
                                           "expirationTimestamp": "2030-01-02T03:04:05Z"}})
    assert token == Token(token="bound-token", expires=1893553445.0)


def test_token_request_answer_without_token_fails() -> None:
    for answer in ({}, {"status": {}}, {"status": {"token": ""}}):
        with pytest.raises(LaunchError) as info:
            token_from_request(answer)
        assert info.value.reason == "BadToken"


def test_token_without_expiry_is_kept() -> None:
    assert token_from_request({"status": {"token": "t"}}).expires is None


# -- pod ---------------------------------------------------------------------------------------

def _pod(phase: str = "Pending", waiting: str | None = None,
         conditions: list[dict] | None = None, init: bool = False) -> dict:
    status: dict = {"phase": phase, "conditions": conditions or []}
    if waiting:
        key = "initContainerStatuses" if init else "containerStatuses"
        status[key] = [{"name": "c", "state": {"waiting": {"reason": waiting,
                                                           "message": "details"}}}]
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "node-1"}, "status": status}


def test_pod_running_is_ready() -> None:
    check = PodCheck("ns/p", ManualClock())
    assert check(None) is None
    assert check(_pod("Pending")) is None
    pod = _pod("Running")
    assert check(pod) is pod


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                    "CreateContainerConfigError"])
@pytest.mark.parametrize("init", [False, True])
def test_fatal_waiting_reasons_fail_at_once(reason: str, init: bool) -> None:
    with pytest.raises(LaunchError) as info:
        PodCheck("ns/p", ManualClock())(_pod(waiting=reason, init=init))
    assert info.value.reason == reason
    assert "details" in str(info.value)


def test_container_creating_keeps_waiting() -> None:
    assert PodCheck("ns/p", ManualClock())(_pod(waiting="ContainerCreating")) is None


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_finished_pod_fails(phase: str) -> None:
    with pytest.raises(LaunchError) as info:
        PodCheck("ns/p", ManualClock())(_pod(phase))
    assert info.value.reason == "PodFailed"


def test_unschedulable_fails_only_after_grace() -> None:
    clock = ManualClock()
    check = PodCheck("ns/p", clock, unschedulable_grace=30)
    pod = _pod(conditions=[{"type": "PodScheduled", "status": "False",
                            "reason": "Unschedulable", "message": "0/3 nodes"}])
    assert check(pod) is None
    clock.advance(29)
    assert check(pod) is None
    clock.advance(1)
    with pytest.raises(LaunchError) as info:
        check(pod)
    assert info.value.reason == "Unschedulable"
    assert "0/3 nodes" in str(info.value)


def test_unschedulable_grace_restarts_when_scheduling_recovers() -> None:
    clock = ManualClock()
    check = PodCheck("ns/p", clock, unschedulable_grace=10)
    stuck = _pod(conditions=[{"type": "PodScheduled", "status": "False",
                              "reason": "Unschedulable"}])
    assert check(stuck) is None
    clock.advance(8)
    assert check(_pod()) is None
    clock.advance(8)
    assert check(stuck) is None


@pytest.mark.parametrize("status", [
    "Running", ["Running"], {"phase": ["Running"]}, {"containerStatuses": {"name": "c"}},
    {"containerStatuses": 5}, {"containerStatuses": ["c", None, 7]},
    {"containerStatuses": [{"state": "waiting"}]},
    {"initContainerStatuses": [{"state": {"waiting": "ErrImagePull"}}]},
    {"containerStatuses": [{"state": {"waiting": {"reason": ["ErrImagePull"]}}}]},
    {"containerStatuses": [{"state": {"waiting": {"reason": {"ErrImagePull": 1}}}}]},
    {"conditions": "PodScheduled"}, {"conditions": 5}, {"conditions": [None, "x"]},
], ids=lambda status: repr(status)[:40])
def test_a_pod_status_of_odd_shape_keeps_waiting(status: object) -> None:
    # Each of these raised AttributeError/TypeError out of the launch (a traceback and
    # reason Unknown) instead of waiting for a readable version or the boot timeout.
    check = PodCheck("ns/p", ManualClock())
    assert check({"metadata": {"name": "p"}, "status": status}) is None
    assert check({"metadata": {"name": "p"}, "status": {"phase": "Running"}})


def test_pod_texts_in_errors_are_clipped() -> None:
    check = PodCheck("ns/p", ManualClock())
    pod = _pod(waiting="ErrImagePull")
    pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] = "m" * (1 << 20)
    with pytest.raises(LaunchError) as info:
        check(pod)
    assert info.value.reason == "ErrImagePull" and len(str(info.value)) < 1000


def test_pod_vanishing_after_being_seen_fails() -> None:
    check = PodCheck("ns/p", ManualClock())
    check(_pod())
    with pytest.raises(LaunchError) as info:
        check(None)
    assert info.value.reason == "PodDeleted"


# -- error mapping -----------------------------------------------------------------------------

class _Resp:
    def __init__(self, status: int, message: str, headers: dict | None = None) -> None:
        self.status = status
        self.reason = "Reason"
        self.data = ('{"kind":"Status","message":%s}' % repr(message).replace("'", '"')).encode()
        self._headers = headers or {}

    def getheaders(self) -> dict:
        return self._headers


def _api(status: int, message: str = "m", headers: dict | None = None) -> ApiException:
    return ApiException(http_resp=_Resp(status, message, headers))


@pytest.mark.parametrize("status,message,expected", [
    (404, "not found", NotFound),
    (409, "already exists", errors.Conflict),
    (410, "too old", errors.Gone),
    (403, 'pods "x" is forbidden: exceeded quota: q, requested: cpu=2', QuotaExceeded),
    (403, 'pods "x" is forbidden: error looking up service account ns/default: '
          'serviceaccount "default" not found', TemporaryError),
    (403, "forbidden: cannot create pods", errors.Forbidden),
    (401, "Unauthorized", errors.Unauthorized),
    (422, "invalid", errors.Invalid),
    (400, "bad", errors.Invalid),
    (429, "slow down", TemporaryError),
    (500, "boom", TemporaryError),
    (503, "unavailable", TemporaryError),
    (418, "teapot", PermanentError),
])
def test_status_mapping(status: int, message: str, expected: type) -> None:
    error = errors.map_api_error(_api(status, message), "create pod ns/x")
    assert type(error) is expected
    assert str(error).startswith("create pod ns/x: ")


def test_retryability() -> None:
    assert errors.is_retryable(errors.map_api_error(_api(500), "x"))
    assert errors.is_retryable(errors.map_api_error(_api(429), "x"))
    assert not errors.is_retryable(errors.map_api_error(_api(403, "exceeded quota"), "x"))
    assert not errors.is_retryable(errors.map_api_error(_api(404), "x"))
    assert not errors.is_retryable(errors.map_api_error(_api(410), "x"))


def test_a_huge_status_message_is_clipped_before_it_is_matched() -> None:
    # A webhook's or a proxy's 403 of "serviceaccount" repeated to 1 MiB: matching the
    # service-account pattern on it took minutes (quadratic), and every log line about
    # the call carried the whole megabyte.
    error = errors.map_api_error(_api(403, "serviceaccount" * 75000), "create pod x")
    assert isinstance(error, errors.Forbidden) and len(str(error)) < 1200


def test_retry_after_becomes_delay() -> None:
    error = errors.map_api_error(_api(429, headers={"Retry-After": "3"}), "x")
    assert isinstance(error, TemporaryError) and error.delay == 3.0


def test_transport_errors_are_temporary() -> None:
    """Every transport error is temporary; nobody answering and a certificate that does not
    verify are told apart (the ApiReachable condition names them)."""
    refused = urllib3.exceptions.NewConnectionError(
        None, "Connection refused")  # type: ignore[arg-type]
    untrusted = urllib3.exceptions.SSLError(ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"))
    for exc, kind in ((urllib3.exceptions.MaxRetryError(None, "/", "refused"), TemporaryError),
                      (urllib3.exceptions.MaxRetryError(None, "/", refused),
                       errors.Unreachable),
                      (urllib3.exceptions.ReadTimeoutError(None, "/", "timed out"),
                       errors.Unreachable),
                      (ConnectionResetError("reset"), errors.Unreachable),
                      (urllib3.exceptions.MaxRetryError(None, "/", untrusted),
                       errors.TlsUntrusted),
                      (ApiException(status=0, reason="SSLError"), TemporaryError),
                      (ApiException(status=0, reason="SSLError CERTIFICATE_VERIFY_FAILED"),
                       errors.TlsUntrusted)):
        mapped = errors.map_api_error(exc, "x")
        assert type(mapped) is kind, (exc, mapped)
        assert isinstance(mapped, TemporaryError) and errors.is_retryable(mapped)


def test_retry_policy_delays_honour_retry_after() -> None:
    policy = RetryPolicy(retries=3, backoff=(0.1, 0.5), timeout=1)
    assert policy.delay(0, TemporaryError("x")) == 0.1
    assert policy.delay(5, TemporaryError("x")) == 0.5
    assert policy.delay(0, TemporaryError("x", delay=2)) == 2
    assert policy.delay(0, TemporaryError("x", delay=1000)) == 60.0
