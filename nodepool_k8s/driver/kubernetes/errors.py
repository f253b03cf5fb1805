"""Translation of Kubernetes API failures into nodepool_k8s's typed errors.

Owns: `map_api_error`, the single place that looks at HTTP status codes, Status bodies and
urllib3 exceptions, plus the few driver-local error types the shared taxonomy lacks
(`Conflict`, `Forbidden`, `Invalid`, `Unauthorized`, `Gone`). Every error this package
raises to its callers is a `nodepool_k8s.core.errors` type; the official client's exceptions
are kept as `__cause__` only. Messages never include response bodies verbatim beyond the
Status `message` (a Status never carries a token).

Mapping:
    404 -> NotFound                       409 -> Conflict (PermanentError)
    410 -> Gone (watch resource version expired; callers re-list)
    403 "exceeded quota" -> QuotaExceeded  403 missing default service account -> TemporaryError
    403 other -> Forbidden                 401 -> Unauthorized (ProviderUnavailable)
    400/422 -> Invalid
    429, 5xx, other urllib3/socket errors -> TemporaryError
    certificate verification failed (urllib3, or status 0) -> TlsUntrusted (TemporaryError)
    connection refused/reset, connect or read timeout, name not resolved -> Unreachable
Retry-After (seconds) becomes `TemporaryError.delay`.

`reason_code` gives each of these errors its reason code (`core.conditions.REASONS`), the
bounded value written into node conditions, events and stats when a launch fails on it.

A 401 says nothing about the object or the label: the server refused the launcher's own
credentials. `Unauthorized` is therefore a `ProviderUnavailable` (the core keeps requests
waiting and counts no failure), and `KubeClient.call` does not repeat it with the API
backoff: `credentials.Credentials` decides when loading the credentials again may help.
A 403 stays `Forbidden`: the credentials were accepted and lack a permission.

`Unreachable` and `TlsUntrusted` are told apart from other transport errors so that the
provider's `ApiReachable` condition (`health`) can say which: nobody answers, or the server
answers with a certificate the launcher does not trust (its CA was rotated, say). Both stay
`TemporaryError`s, retried and reported as `ApiError` on a node like any other.
"""

from __future__ import annotations

import json
import re
import ssl
from typing import Any

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from nodepool_k8s.core.errors import (NodepoolError, NotFound, PermanentError, ProviderUnavailable,
                                      QuotaExceeded, TemporaryError)
from nodepool_k8s.core.records import clip


class Conflict(PermanentError):
    """409: the object already exists (or a write raced another writer)."""


class Forbidden(PermanentError):
    """403 for a reason other than quota: the launcher lacks a permission."""


class Unauthorized(ProviderUnavailable):
    """401: the API server refused the launcher's credentials (expired, rotated, revoked)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="Unauthorized")


class Invalid(PermanentError):
    """400/422: the API server rejected the body; retrying the same body cannot help."""


class Unreachable(TemporaryError):
    """Nobody answered: the connection was refused or reset, it or the answer timed out, or
    the server's name did not resolve."""


class TlsUntrusted(TemporaryError):
    """The API server's certificate did not verify against the CA the launcher trusts (or
    does not name the server)."""


class Gone(TemporaryError):
    """410: a watch's resource version is too old; the caller must list again."""


# Admission of a pod into a namespace that is seconds old can race the service-account
# controller ("error looking up service account ns/default"); that heals by itself.
_MISSING_DEFAULT_SA = re.compile(r"service ?account.*not found|no API token found", re.I)


# How much of a Status message is kept. Admission webhooks and proxies write these: a
# megabyte one went into every log line about the call, and the service-account pattern
# below takes quadratic time on it (a 1 MiB message held a launch for minutes).
MESSAGE_LIMIT = 1000


def status_message(exc: ApiException) -> str:
    """The `message` of the Status body when there is one, else the HTTP reason."""
    body: Any = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            return body[:500]
        if isinstance(parsed, dict) and parsed.get("message"):
            return clip(str(parsed["message"]), MESSAGE_LIMIT)
    return clip(str(exc.reason or ""), MESSAGE_LIMIT)


def retry_after(exc: ApiException) -> float | None:
    """Seconds from a Retry-After header (the API server only sends the integer form)."""
    headers = exc.headers or {}
    value = None
    for key in headers:
        if str(key).lower() == "retry-after":
            value = headers[key]
            break
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except (TypeError, ValueError):
        return None


def map_api_error(exc: BaseException, what: str) -> NodepoolError:
    """Turn an exception from the official client into a nodepool_k8s error about `what`."""
    if isinstance(exc, NodepoolError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{what}: {status} {status_message(exc)}".rstrip()
        if status == 0:
            # The client reports TLS failures as status 0 (reason holds the SSL error).
            if "CERTIFICATE_VERIFY_FAILED" in str(exc.reason):
                return TlsUntrusted(f"{what}: {exc.reason}")
            return TemporaryError(f"{what}: {exc.reason}")
        if status == 404:
            return NotFound(message)
        if status == 409:
            return Conflict(message)
        if status == 410:
            return Gone(message)
        if status == 403:
            text = status_message(exc)
            if "exceeded quota" in text:
                return QuotaExceeded(message, delay=retry_after(exc))
            if _MISSING_DEFAULT_SA.search(text):
                return TemporaryError(message, delay=retry_after(exc))
            return Forbidden(message)
        if status == 401:
            return Unauthorized(message)
        if status in (400, 422):
            return Invalid(message)
        if status == 429 or status >= 500:
            return TemporaryError(message, delay=retry_after(exc))
        return PermanentError(message)
    if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
        # Connection refused/reset, read timeouts, protocol errors: the API may come back.
        message = f"{what}: {type(exc).__name__}: {exc}"
        causes = list(_causes(exc))
        # Named by the cause itself: urllib3's wrapper leads with the URL, which would push
        # the reason out of a condition's message.
        for cause in causes:
            if isinstance(cause, ssl.SSLCertVerificationError):
                # Constructed by hand (as in tests) it may lack the attributes ssl sets.
                detail = getattr(cause, "verify_message", None) or cause
                return TlsUntrusted(f"{what}: [SSL: CERTIFICATE_VERIFY_FAILED] certificate"
                                    f" verify failed: {detail}")
        for cause in causes:
            if isinstance(cause, _UNREACHABLE):
                return Unreachable(f"{what}: {type(cause).__name__}: {cause}")
        return TemporaryError(message)
    if isinstance(exc, ValueError):
        # An unparseable response body (e.g. a proxy's HTML error page).
        return TemporaryError(f"{what}: bad response: {exc}")
    return PermanentError(f"{what}: {type(exc).__name__}: {exc}")


# What nobody answering looks like, below urllib3's MaxRetryError (retries are off: every
# failed attempt arrives wrapped once). urllib3's TimeoutError covers refused connections
# and unresolved names (NewConnectionError) as well as connect and read timeouts.
_UNREACHABLE = (urllib3.exceptions.TimeoutError, urllib3.exceptions.ProtocolError,
                ConnectionError, TimeoutError)


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps: urllib3's `reason`, an exception given as the first
    argument (urllib3's SSLError), then `__cause__`/`__context__`."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out and len(out) < 8:
        out.append(current)
        reason = getattr(current, "reason", None)
        first = current.args[0] if current.args else None
        current = reason if isinstance(reason, BaseException) \
            else first if isinstance(first, BaseException) \
            else (current.__cause__ or current.__context__)
    return out


# Error category -> reason code (`core.conditions.REASONS`), the most specific first.
_REASON_CODES: tuple[tuple[type[NodepoolError], str], ...] = (
    (QuotaExceeded, "QuotaExceeded"),
    (Unauthorized, "Unauthorized"),
    (NotFound, "NotFound"),
    (Conflict, "Conflict"),
    (Forbidden, "Forbidden"),
    (Invalid, "Invalid"),
    (TemporaryError, "ApiError"),
)


def reason_code(error: NodepoolError) -> str:
    """The reason code of a mapped API failure; `Unknown` for an unexpected kind."""
    for kind, code in _REASON_CODES:
        if isinstance(error, kind):
            return code
    return "Unknown"


def is_retryable(error: NodepoolError) -> bool:
    """Whether the API call itself should be repeated with the API backoff (quota refusals
    are not, nor refused credentials: those have their own backoff, see `credentials`)."""
    return isinstance(error, TemporaryError) \
        and not isinstance(error, (QuotaExceeded, Gone, ProviderUnavailable))
