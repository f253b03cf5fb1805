"""Pure verdicts on watched objects: is the token there, is the pod up, has it failed?

Owns: reading a service-account token secret (`token_from_secret`) and judging a pod
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

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from nodepool_k8s.clock import Clock
from nodepool_k8s.config.schema import UNSCHEDULABLE_GRACE
from nodepool_k8s.exceptions import LaunchError

# Waiting reasons that do not heal by themselves within a boot timeout (or do so only
# after a registry/config fix that no retry of ours brings about).
FATAL_WAITING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
    "CreateContainerError", "ErrImageNeverPull",
})
# Unscheduled pods are often only waiting for the autoscaler; give them this long (the
# provider passes its `unschedulable-grace`; this is the configuration's own default).
DEFAULT_UNSCHEDULABLE_GRACE = UNSCHEDULABLE_GRACE


@dataclass(frozen=True)
class Token:
    token: str  # plain (base64-decoded) bearer token
    ca_crt: str  # base64 of the CA PEM, exactly as in the secret


def token_from_secret(secret: dict[str, Any] | None) -> Token | None:
    """The token once the token controller has filled the secret, else None."""
    if not secret:
        return None
    data = secret.get("data") or {}
    raw, ca_crt = data.get("token"), data.get("ca.crt")
    if not raw or not ca_crt:
        return None
    try:
        token = base64.b64decode(raw, validate=True).decode("utf-8")
    except (binascii.Error, ValueError) as exc:
        raise LaunchError(f"service-account token is not base64: {exc}",
                          reason="BadToken") from exc
    return Token(token=token, ca_crt=str(ca_crt))


def _container_statuses(status: dict[str, Any]) -> list[dict[str, Any]]:
    return list(status.get("initContainerStatuses") or []) + list(
        status.get("containerStatuses") or [])


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
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase == "Running":
            return pod
        if phase in ("Failed", "Succeeded"):
            detail = status.get("reason") or status.get("message") or ""
            raise LaunchError(f"pod {self.name} ended with phase {phase} {detail}".rstrip(),
                              reason="PodFailed")
        for container in _container_statuses(status):
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason in FATAL_WAITING_REASONS:
                message = waiting.get("message") or ""
                raise LaunchError(f"pod {self.name} container {container.get('name')}: "
                                  f"{reason} {message}".rstrip(), reason=str(reason))
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
        for condition in status.get("conditions") or []:
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
                              f"{unschedulable.get('message', '')}".rstrip(),
                              reason="Unschedulable")
