"""Pure verdicts on watched objects: is the token there, is the pod up, has it failed?

Owns: reading a TokenRequest answer (`token_from_request`) and judging a pod
(`PodCheck`), both over plain JSON dicts as the watch delivers them. No I/O; time comes from
the injected clock. A verdict is a value (ready), None (keep waiting) or a raised
LaunchError whose `reason` names the cause, so the launch fails at the first sign of a
failure instead of at the boot timeout:

    ErrImagePull / ImagePullBackOff / InvalidImageName / CreateContainerConfigError /
    CreateContainerError        a container (or init container) waiting for that reason
    Unschedulable               PodScheduled=False/Unschedulable for longer than the grace
    PodFailed                   phase Failed or Succeeded (the sleeper must never exit)
    PodDeleted                  the pod vanished after it had been seen
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nodepool_k8s.core import records
from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.config.schema import UNSCHEDULABLE_GRACE
from nodepool_k8s.core.errors import LaunchError

# Waiting reasons that do not heal by themselves within a boot timeout (or do so only
# after a registry/config fix that no retry of ours brings about).
FATAL_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "ErrImageNeverPull",
})
# Unscheduled pods are often only waiting for the autoscaler; give them this long (the
# provider passes its `unschedulable-grace`; this is the configuration's own default).
DEFAULT_UNSCHEDULABLE_GRACE = UNSCHEDULABLE_GRACE


# A bound service-account token is a JWT of a kilobyte or two. It travels in the node's
# ZooKeeper record, which its readers refuse beyond `records.MAX_RECORD_BYTES` (and
# ZooKeeper itself beyond 1 MiB): a longer one would make the node unreadable to us.
MAX_TOKEN_CHARS = 64 * 1024


@dataclass(frozen=True)
class Token:
    token: str  # plain bearer token (never logged)
    expires: float | None  # epoch seconds (the answer's status.expirationTimestamp)


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def token_from_request(answer: dict[str, Any]) -> Token:
    """The token of a TokenRequest answer (`status.token`, `status.expirationTimestamp`)."""
    status = answer.get("status")
    status = status if isinstance(status, dict) else {}
    token = status.get("token")
    if not token or not isinstance(token, str):
        raise LaunchError("the TokenRequest answer carries no token", reason="BadToken")
    if len(token) > MAX_TOKEN_CHARS:
        raise LaunchError(f"the TokenRequest answer carries a token of {len(token)} "
                          f"characters, more than {MAX_TOKEN_CHARS}", reason="BadToken")
    return Token(token=token, expires=_epoch(status.get("expirationTimestamp")))


# How much of a text the pod carries (a waiting message, a reason) goes into an error.
TEXT_LIMIT = 500


def _obj(value: Any) -> dict[str, Any]:
    """`value` if it is an object, else {}: a pod is data from outside, of any shape."""
    return value if isinstance(value, dict) else {}


def _objects(value: Any) -> list[dict[str, Any]]:
    """The objects in `value` if it is a list (anything else in it skipped), else []."""
    return [item for item in value if isinstance(item, dict)] \
        if isinstance(value, list) else []


def _text(value: Any) -> str:
    return records.clip(str(value), TEXT_LIMIT) if value else ""


def _container_statuses(status: dict[str, Any]) -> list[dict[str, Any]]:
    return _objects(status.get("initContainerStatuses")) + _objects(
        status.get("containerStatuses"))


class PodCheck:
    """Judges successive versions of one pod; remembers when it was first unschedulable."""

    def __init__(self, name: str, clock: Clock,
                 unschedulable_grace: float = DEFAULT_UNSCHEDULABLE_GRACE) -> None:
        self.name = name
        self._clock = clock
        self._grace = unschedulable_grace
        self._unschedulable_since: float | None = None
        self._seen = False

    def __call__(self, pod: dict[str, Any] | None) -> dict[str, Any] | None:
        if pod is None:
            if self._seen:
                raise LaunchError(f"pod {self.name} was deleted while starting",
                                  reason="PodDeleted")
            return None
        self._seen = True
        status = _obj(pod.get("status"))
        phase = status.get("phase")
        if phase == "Running":
            return pod
        if phase in ("Failed", "Succeeded"):
            detail = _text(status.get("reason") or status.get("message"))
            raise LaunchError(f"pod {self.name} ended with phase {phase} {detail}".rstrip(),
                              reason="PodFailed")
        for container in _container_statuses(status):
            waiting = _obj(_obj(container.get("state")).get("waiting"))
            reason = waiting.get("reason")
            if isinstance(reason, str) and reason in FATAL_WAITING_REASONS:
                message = _text(waiting.get("message"))
                raise LaunchError(f"pod {self.name} container "
                                  f"{_text(container.get('name'))}: {reason} {message}"
                                  .rstrip(), reason=reason)
        self._check_scheduling(status)
        return None

    def recheck_in(self) -> float | None:
        """Seconds until an unschedulable pod's grace ends (None: not unschedulable): the
        waiter checks again then, as no event may come."""
        if self._unschedulable_since is None:
            return None
        return self._unschedulable_since + self._grace - self._clock.monotonic()

    def _check_scheduling(self, status: dict[str, Any]) -> None:
        unschedulable = None
        for condition in _objects(status.get("conditions")):
            if (condition.get("type") == "PodScheduled" and condition.get("status") == "False"
                    and condition.get("reason") == "Unschedulable"):
                unschedulable = condition
        if unschedulable is None:
            self._unschedulable_since = None
            return
        now = self._clock.monotonic()
        if self._unschedulable_since is None:
            self._unschedulable_since = now
        if now - self._unschedulable_since >= self._grace:
            raise LaunchError(f"pod {self.name} unschedulable for {self._grace:g}s: "
                              f"{_text(unschedulable.get('message'))}".rstrip(),
                              reason="Unschedulable")
