"""Fault injection: what can go wrong, and the per-request decision about what does.

Owns: the `Faults` settings dataclass (public API), and `FaultInjector`, which holds the
current settings, a seeded random generator (same seed + same request order = same faults),
the one-shot "fail the next N (verb, resource) requests with code C" rules and the
"quota exceeded for the next N pod creates" budget. Every method is thread-safe; settings
can change at runtime while requests are in flight.

Nothing here touches the network: `decide()` returns a `Decision` and the API layer acts on it.
Controllers ask `image_pull_fails()`, `unschedulable` and `namespace_delete_hang` directly.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, cast


@dataclass(frozen=True)
class Faults:
    """Fault settings. Change them with `Simulator.set_faults(**changes)`.

    `quota_exceeded`: True answers every pod create with a ResourceQuota-style 403;
    an int N > 0 does so for the next N pod creates only (then it counts down to 0).
    `retry_after`: the Retry-After header of injected 429s. Note that urllib3 (under the
    official client) transparently retries a 429 that carries Retry-After, sleeping that long,
    up to 3 times (unless its Configuration sets `retries`, as nodepool_k8s's does); 0 keeps
    the retries but skips the sleeps.
    """

    latency: float = 0.0
    error_rate: float = 0.0
    error_codes: tuple[int, ...] = (500, 429)
    retry_after: int = 1
    timeout_rate: float = 0.0
    timeout_seconds: float = 30.0
    image_pull_fail: tuple[str, ...] = ()
    unschedulable: bool = False
    namespace_delete_hang: bool = False
    # Containers ignore SIGTERM (a shell's `sleep` as PID 1 does): a deleted pod stays for
    # its whole grace period instead of `pod_delete_delay`. Read when a pod is deleted.
    ignore_sigterm: bool = False
    quota_exceeded: bool | int = False
    seed: int = 0


@dataclass
class Decision:
    """What to do to one request: add `latency`, fail with `error_code`, or stall first."""

    latency: float = 0.0
    error_code: int | None = None
    retry_after: int = 1
    stall: float = 0.0
    quota_exceeded: bool = False
    rewrite: Callable[[Any], Any] | None = None  # applied to the answer's decoded body


@dataclass
class _Rule:
    verb: str
    resource: str
    remaining: int
    code: int
    stall: float = 0.0  # > 0: apply the request, then answer this many seconds late
    rewrite: Callable[[Any], Any] | None = None  # apply the request, answer rewrite(body)

    def matches(self, verb: str, resource: str) -> bool:
        return (self.verb in ("*", verb) and self.resource in ("*", resource))


_VERB_ALIASES = {"replace": "update", "read": "get", "post": "create", "put": "update"}


class FaultInjector:
    def __init__(self, faults: Faults | None = None) -> None:
        self._lock = threading.Lock()
        self._faults = faults or Faults()
        self._rng = random.Random(self._faults.seed)
        self._rules: list[_Rule] = []
        self._quota_budget = self._budget_of(self._faults.quota_exceeded)

    @staticmethod
    def _budget_of(value: bool | int) -> int:
        # -1 = always; 0 = never; N = next N pod creates.
        if value is True:
            return -1
        if value is False or value is None:
            return 0
        return max(0, int(value))

    @property
    def faults(self) -> Faults:
        with self._lock:
            return self._faults

    def set(self, **changes: object) -> Faults:
        """Change some settings; unknown names raise TypeError. A new seed reseeds the RNG."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(Faults)}
        if unknown:
            raise TypeError(f"unknown fault settings: {', '.join(sorted(unknown))}")
        if "image_pull_fail" in changes and isinstance(changes["image_pull_fail"], str):
            changes["image_pull_fail"] = (changes["image_pull_fail"],)
        for name in ("image_pull_fail", "error_codes"):
            if name in changes:
                changes[name] = tuple(cast(Iterable[Any], changes[name]))
        with self._lock:
            self._faults = dataclasses.replace(self._faults, **changes)  # type: ignore[arg-type]
            if "seed" in changes:
                self._rng = random.Random(self._faults.seed)
            if "quota_exceeded" in changes:
                self._quota_budget = self._budget_of(self._faults.quota_exceeded)
            return self._faults

    def fail_next(self, verb: str, resource: str, count: int = 1, code: int = 500) -> None:
        """Answer the next `count` requests for (verb, resource) with HTTP `code`.

        verb is a Kubernetes verb (create, get, list, watch, update, patch, delete; "replace"
        is accepted for update); resource a plural such as "pods" or "serviceaccounts/token";
        either may be "*". A 403 on "create pods" reads like a ResourceQuota refusal.
        """
        verb = _VERB_ALIASES.get(verb, verb)
        with self._lock:
            self._rules.append(_Rule(verb, resource, count, code))

    def stall_next(self, verb: str, resource: str, count: int = 1,
                   seconds: float = 30.0) -> None:
        """Apply the next `count` (verb, resource) requests, then answer `seconds` late."""
        verb = _VERB_ALIASES.get(verb, verb)
        with self._lock:
            self._rules.append(_Rule(verb, resource, count, 0, stall=seconds))

    def rewrite_next(self, verb: str, resource: str, rewrite: Callable[[Any], Any],
                     count: int = 1) -> None:
        """Apply the next `count` (verb, resource) requests, then answer with
        `rewrite(body)` (a deep copy of the decoded JSON body) instead of the body: a
        legal HTTP answer whose content is of an odd shape (a list, a huge field, ...)."""
        verb = _VERB_ALIASES.get(verb, verb)
        with self._lock:
            self._rules.append(_Rule(verb, resource, count, 0, rewrite=rewrite))

    def pending_rules(self) -> int:
        with self._lock:
            return sum(rule.remaining for rule in self._rules)

    def clear(self) -> None:
        """Drop one-shot rules and reset all settings to no faults."""
        with self._lock:
            self._faults = Faults()
            self._rng = random.Random(0)
            self._rules.clear()
            self._quota_budget = 0

    def decide(self, verb: str, resource: str) -> Decision:
        with self._lock:
            faults = self._faults
            decision = Decision(latency=faults.latency, retry_after=faults.retry_after)
            for rule in self._rules:
                if rule.remaining > 0 and rule.matches(verb, resource):
                    rule.remaining -= 1
                    if rule.rewrite is not None:
                        decision.rewrite = rule.rewrite
                    elif rule.stall > 0:
                        decision.stall = rule.stall
                    else:
                        decision.error_code = rule.code
                    self._rules = [r for r in self._rules if r.remaining > 0]
                    return decision
            # Draw both numbers every time so the sequence depends only on request order.
            error_draw, timeout_draw = self._rng.random(), self._rng.random()
            if faults.error_rate > 0 and error_draw < faults.error_rate and faults.error_codes:
                decision.error_code = self._rng.choice(list(faults.error_codes))
                return decision
            if faults.timeout_rate > 0 and timeout_draw < faults.timeout_rate:
                decision.stall = faults.timeout_seconds
            if verb == "create" and resource == "pods" and self._quota_budget != 0:
                decision.quota_exceeded = True
                if self._quota_budget > 0:
                    self._quota_budget -= 1
                    if self._quota_budget == 0:
                        self._faults = dataclasses.replace(self._faults, quota_exceeded=False)
            return decision

    def image_pull_fails(self, image: str) -> bool:
        patterns = self.faults.image_pull_fail
        return any(image == p or fnmatch.fnmatchcase(image, p) for p in patterns)
