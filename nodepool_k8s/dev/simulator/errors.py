"""Kubernetes-style API errors and the `Status` bodies that carry them.

Owns: the `ApiError` exception raised anywhere in the simulator when a request must be refused,
and constructors for the reasons the real API server uses (NotFound, AlreadyExists, Conflict,
Invalid, Forbidden, ...). The HTTP layer turns an `ApiError` into a response whose body is a
`Status` object the official client parses into `ApiException` (status, reason, body).
Nothing here fails; it only builds data.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the API refuses: HTTP `code`, Status `reason`, human `message`, `details`."""

    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict[str, Any]:
        """The `Status` object the real API server would send for this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def success_status(name: str, plural: str, uid: str, group: str = "") -> dict[str, Any]:
    """The `Status` the API returns when deleting kinds that do not echo the deleted object."""
    details: dict[str, Any] = {"name": name, "kind": plural, "uid": uid}
    if group:
        details["group"] = group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}


def _details(name: str, plural: str, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        details["group"] = group
    return details


def _qualified(plural: str, group: str) -> str:
    # The real server names non-core resources as "roles.rbac.authorization.k8s.io".
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(plural, group)} "{name}" not found',
                    _details(name, plural, group))


def no_such_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource",
                    {})


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(409, "AlreadyExists", f'{_qualified(plural, group)} "{name}" already exists',
                    _details(name, plural, group))


def conflict(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": the object has '
        "been modified; please apply your changes to the latest version and try again",
        _details(name, plural, group))


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]],
            group: str = "") -> ApiError:
    """422 Invalid; `causes` are (field, reason, message) triples, e.g. FieldValueRequired."""
    text = ", ".join(f"{field}: {message}" for field, _, message in causes)
    if len(causes) > 1:
        text = f"[{text}]"
    details: dict[str, Any] = {
        "name": name, "kind": kind,
        "causes": [{"reason": reason, "message": message, "field": field}
                   for field, reason, message in causes],
    }
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}', details)


def forbidden(plural: str, name: str, why: str, group: str = "") -> ApiError:
    subject = f'{_qualified(plural, group)} "{name}"' if name else _qualified(plural, group)
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}",
                    _details(name, plural, group))


def namespace_terminating(plural: str, name: str, namespace: str, group: str = "") -> ApiError:
    err = forbidden(plural, name,
                    f"unable to create new content in namespace {namespace} because it is "
                    "being terminated", group)
    assert err.details is not None
    err.details["causes"] = [{"reason": "NamespaceTerminating",
                              "message": f"namespace {namespace} is being terminated",
                              "field": "metadata.namespace"}]
    return err


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def method_not_allowed(message: str = "the server does not allow this method on the "
                       "requested resource") -> ApiError:
    return ApiError(405, "MethodNotAllowed", message, {})


def unsupported_media_type(content_type: str, accepted: str = "application/json") -> ApiError:
    return ApiError(415, "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types "
                    f"include: {accepted} (got {content_type})", {})


def too_many_requests(retry_after: int = 1) -> ApiError:
    return ApiError(429, "TooManyRequests", "Too many requests, please try again later.",
                    {"retryAfterSeconds": retry_after},
                    headers={"Retry-After": str(retry_after)})


def internal_error(why: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {why}",
                    {"causes": [{"message": why}]})


def expired(message: str) -> ApiError:
    # The real server reports a too-old resourceVersion as 410 with reason "Expired".
    return ApiError(410, "Expired", message)


def for_code(code: int, plural: str, name: str, group: str = "",
             retry_after: int = 1) -> ApiError:
    """A plausible error for an injected failure with HTTP status `code`."""
    if code == 429:
        return too_many_requests(retry_after)
    if code == 404:
        return not_found(plural, name, group)
    if code == 409:
        return conflict(plural, name, group)
    if code == 403:
        return forbidden(plural, name, "injected fault", group)
    if code == 410:
        return expired("injected fault: resource version too old")
    if code == 422:
        return invalid(plural, name, [("metadata", "FieldValueInvalid", "injected fault")],
                       group)
    if code == 401:
        return unauthorized()
    if code == 503:
        return ApiError(503, "ServiceUnavailable", "injected fault: service unavailable", {})
    if code == 504:
        return ApiError(504, "Timeout", "injected fault: timeout", {})
    return internal_error("injected fault")
