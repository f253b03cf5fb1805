"""An in-memory provider, selectable in a real configuration with `driver: fake`.

Owns: a simulated cloud for engine tests, the demo and benchmarks. A launch "creates" a
resource named like a Kubernetes namespace (`<pool>-<node id>`, `-<attempt>` appended on
retries), reports its external id through `progress` at once, then waits the label's
`launch-delay` (seconds) on the cancel event (never sleep-polling) and succeeds, unless the
label has `fail: true` or an error was injected with `fail_next`. Every call is recorded.

`delete` (a reconcile step, see `driver.base`) refuses (NotOwned) a resource it does not
hold that another provider of the shared cloud holds, or one whose node id differs from the
node being deleted, and any name in `foreign` (tests add e.g. `kube-system` there), as the
Kubernetes driver's ownership check does; a name nobody holds is simply `Gone`.
`ownership_problem` (hand-out, min-ready spares) refuses the same, and a name nobody here
holds unless it is a name made for that node (another in-process launcher's FakeCloud may
hold it).

State is per instance unless a `FakeCloud` is shared (two in-process launchers can then see
the same resources, e.g. for leak tests). Nothing here persists across processes.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config.model import PoolLabel, ProviderConfig
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.driver.base import (CloudResource, Deletion, Gone, LaunchResult, LaunchSpec,
                                      Progress, Underway)
from nodepool_k8s.core.errors import LaunchCancelled, LaunchError, NotOwned
from nodepool_k8s.core.model import Resources

FAKE_API = "https://fake-k8s.invalid:6443"
# A deferred deletion asks to be looked at again after this long (monotonic seconds).
DEFERRED_RECHECK = 60.0


@dataclass
class FakeResource:
    external_id: str
    node_id: str | None
    provider: str
    created: float
    deleting: bool = False


@dataclass
class FakeCloud:
    """The resources of one or more fake providers."""

    resources: dict[str, FakeResource] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The most resources each provider ever had at once (quota tests check it exactly,
    # where sampling ZooKeeper could miss a short-lived excess).
    peak: dict[str, int] = field(default_factory=dict)
    # Names that exist in the cloud but belong to nobody here (e.g. `kube-system`).
    foreign: set[str] = field(default_factory=set)


class FakeProvider:
    """An in-memory provider for tests, the demo and the benchmark.

    Implements `Provider` only: it declares no optional capability (not `ClusterAware`;
    its cloud has no capacity or credentials to watch)."""

    def __init__(self, config: ProviderConfig, clock: Clock = SYSTEM_CLOCK,
                 cloud: FakeCloud | None = None) -> None:
        self.config = config
        self.name = config.name
        self.clock = clock
        self.cloud = cloud or FakeCloud()
        self.calls: list[tuple[str, Any]] = []
        self._failures: dict[str, list[tuple[Exception, str | None]]] = {}
        self._lock = threading.Lock()
        self.started = False
        self.launching = 0
        # Optional hook run inside launch after the resource exists (tests use it to pause).
        self.on_launch: Callable[[LaunchSpec], None] | None = None
        # `defer_deletions`: None = deletions finish at once; else external id -> the
        # notices to send when `finish_deletions` lets them finish.
        self._deferred: dict[str, list[Callable[[], None]]] | None = None
        self._early_notice = False
        # Deferred deletions: external id -> when first asked (monotonic).
        self._going: dict[str, float] = {}
        self._stuck_after: float | None = None

    # -- test controls --------------------------------------------------------------------
    def defer_deletions(self, early_notice: bool = False,
                        stuck_after: float | None = None) -> None:
        """Deletions are answered as underway (a namespace Terminating) until
        `finish_deletions`, which sends their wake-ups. With `early_notice` a deletion
        finishes and sends its wake-up before it is answered (a namespace that went at
        once). With `stuck_after` every call that many seconds (on the provider's clock)
        after the first answer reports the deletion stuck."""
        with self._lock:
            self._deferred, self._early_notice = {}, early_notice
            self._stuck_after = stuck_after

    def finish_deletions(self) -> None:
        """Let every deferred deletion finish, send their notices, stop deferring."""
        with self._lock:
            deferred, self._deferred = self._deferred or {}, None
            self._going.clear()
        with self.cloud.lock:
            for external_id in deferred:
                self.cloud.resources.pop(external_id, None)
        for notices in deferred.values():
            for notice in notices:
                notice()

    def fail_next(self, count: int = 1, exc: Exception | None = None,
                  op: str = "launch", node_id: str | None = None) -> None:
        """The next `count` calls of `op` (launch, delete, list) raise `exc` (only calls
        for node `node_id`, if given: launches of one request run concurrently)."""
        error = exc or LaunchError("injected failure", reason="Injected")
        with self._lock:
            self._failures.setdefault(op, []).extend([(error, node_id)] * count)

    def _injected(self, op: str, node_id: str | None = None) -> Exception | None:
        with self._lock:
            queue = self._failures.get(op) or []
            for index, (error, only) in enumerate(queue):
                if only is None or only == node_id:
                    del queue[index]
                    return error
            return None

    def add_resource(self, external_id: str, node_id: str | None,
                     created: float | None = None) -> None:
        """Make a resource appear as if created by a launcher (e.g. a leak)."""
        with self.cloud.lock:
            self.cloud.resources[external_id] = FakeResource(
                external_id, node_id, self.name,
                self.clock.time() if created is None else created)
            count = sum(1 for r in self.cloud.resources.values() if r.provider == self.name)
            self.cloud.peak[self.name] = max(self.cloud.peak.get(self.name, 0), count)

    def resource_ids(self) -> set[str]:
        with self.cloud.lock:
            return {r.external_id for r in self.cloud.resources.values()
                    if r.provider == self.name}

    def peak_resources(self) -> int:
        """The most resources of this provider that existed at the same moment."""
        with self.cloud.lock:
            return self.cloud.peak.get(self.name, 0)

    def call_names(self) -> list[str]:
        with self._lock:
            return [name for name, _ in self.calls]

    def _record(self, name: str, arg: Any) -> None:
        with self._lock:
            self.calls.append((name, arg))

    # -- Provider -------------------------------------------------------------------------
    def start(self) -> None:
        self._record("start", None)
        self.started = True

    def stop(self) -> None:
        self._record("stop", None)
        self.started = False

    def launch(self, spec: LaunchSpec, cancel: threading.Event,
               progress: Progress | None = None) -> LaunchResult:
        self._record("launch", spec)
        with self._lock:
            self.launching += 1
        try:
            return self._launch(spec, cancel, progress)
        finally:
            with self._lock:
                self.launching -= 1

    def _launch(self, spec: LaunchSpec, cancel: threading.Event,
                progress: Progress | None) -> LaunchResult:
        injected = self._injected("launch", spec.node_id)
        if injected is not None:
            raise injected
        suffix = f"-{spec.attempt}" if spec.attempt > 1 else ""
        external_id = f"{spec.pool.name}-{spec.node_id}{suffix}"
        self.add_resource(external_id, spec.node_id)
        if progress is not None:
            progress(external_id, self._condition(cond.LAUNCHED, "ResourceCreated",
                                                  f"{external_id} created"))
        if self.on_launch is not None:
            self.on_launch(spec)
        label = spec.label
        if cancel.wait(label.fake_launch_delay) if label.fake_launch_delay > 0 \
                else cancel.is_set():
            self._remove(external_id)
            raise LaunchCancelled("launch cancelled")
        if label.fake_fail:
            self._remove(external_id)
            raise LaunchError(f"label {label.name} is configured to fail", reason="FakeFail")
        if progress is not None:
            progress(external_id, self._condition(cond.REGISTERED, "AccessGranted",
                                                  "fake credentials"))
            progress(external_id, self._condition(
                cond.INITIALIZED, "PodRunning" if label.type == "pod" else "NoWorkload",
                "fake pod running on fake-k8s-node" if label.type == "pod" else
                "namespace label: no pod to start"))
        return self._result(external_id, label)

    def _condition(self, type_: str, reason: str, message: str) -> cond.Condition:
        return cond.Condition(type_, cond.TRUE, reason, message, self.clock.time())

    def _result(self, external_id: str, label: PoolLabel) -> LaunchResult:
        connection: dict[str, Any] = {
            "name": external_id, "namespace": external_id, "host": FAKE_API,
            "skiptls": True, "token": "fake-token", "user": "zuul-worker"}
        if label.type == "pod":
            connection["pod"] = label.name
            return LaunchResult(external_id=external_id, connection_type="kubectl",
                                connection_port=connection, interface_ip=label.name,
                                host_id="fake-k8s-node", cloud="fake",
                                python_path=label.python_path, shell_type=label.shell_type,
                                resources=self.quota_for_label(label).as_dict())
        return LaunchResult(external_id=external_id, connection_type="namespace",
                            connection_port=connection, cloud="fake",
                            python_path=label.python_path, shell_type=label.shell_type,
                            resources=self.quota_for_label(label).as_dict())

    def _remove(self, external_id: str) -> None:
        with self.cloud.lock:
            self.cloud.resources.pop(external_id, None)

    def delete(self, external_id: str, node_id: str | None = None,
               wake: Callable[[], None] | None = None, verify: bool = False) -> Deletion:
        """Gone at once, unless a test deferred deletions (`defer_deletions`): then the
        first call marks the resource deleting and every call until `finish_deletions`
        answers `Underway` (stuck past the deferral's `stuck_after`)."""
        self._record("delete", external_id)
        injected = self._injected("delete", node_id)
        if injected is not None:
            raise injected
        now = self.clock.monotonic()
        with self.cloud.lock:
            if external_id in self.cloud.foreign:
                raise NotOwned(f"{external_id} is not ours (foreign)")
            resource = self.cloud.resources.get(external_id)
            if resource is None:
                return Gone()
            if resource.provider != self.name:
                raise NotOwned(f"{external_id} belongs to provider {resource.provider}")
            if node_id is not None and resource.node_id not in (None, node_id):
                raise NotOwned(f"{external_id} belongs to node {resource.node_id}, not"
                               f" {node_id}")
            with self._lock:
                deferred, early = self._deferred, self._early_notice
                if deferred is not None and not early:
                    resource.deleting = True
                    started = self._going.setdefault(external_id, now)
                    wakes = deferred.setdefault(external_id, [])
                    if wake is not None and wake not in wakes:
                        wakes.append(wake)
                    return Underway(now + DEFERRED_RECHECK, f"{external_id} is being deleted",
                                    stuck=self._stuck_report(external_id, started, now))
            del self.cloud.resources[external_id]
        if deferred is not None and wake is not None:
            wake()  # early: the wake-up overtakes the answer
            return Underway(now + DEFERRED_RECHECK, f"{external_id} is being deleted")
        return Gone()

    def _stuck_report(self, external_id: str, started: float, now: float) -> str | None:
        """What holds a deferred deletion, on every call past `stuck_after`: showing it
        once is the caller's part."""
        if self._stuck_after is None or now - started < self._stuck_after:
            return None
        return f"{external_id} deleting for {now - started:.0f}s"

    def ownership_problem(self, external_id: str, node_id: str) -> str | None:
        with self.cloud.lock:
            resource = self.cloud.resources.get(external_id)
            if external_id in self.cloud.foreign:
                return f"{external_id} is not one of our resources"
            if resource is None:
                # Another in-process launcher's own FakeCloud may hold it: a name made for
                # that node (`<pool>-<node id>[-<attempt>]`) passes, as its namespace would
                # on a cluster both launchers share; any other name is refused.
                if re.fullmatch(rf"[a-z0-9-]+-{re.escape(node_id)}(-\d+)?", external_id):
                    return None
                return f"{external_id} is not one of our resources"
            if resource.provider != self.name:
                return f"{external_id} belongs to provider {resource.provider}"
            if resource.node_id not in (None, node_id):
                return f"{external_id} belongs to node {resource.node_id}"
            return None

    def list_resources(self) -> Sequence[CloudResource]:
        self._record("list", None)
        injected = self._injected("list")
        if injected is not None:
            raise injected
        with self.cloud.lock:
            return [CloudResource(external_id=r.external_id, node_id=r.node_id,
                                  provider=r.provider, created=r.created,
                                  deleting=r.deleting)
                    for r in self.cloud.resources.values() if r.provider == self.name]

    def quota_for_label(self, label: PoolLabel) -> Resources:
        return label.quota()

    def cloud_limits(self, label: PoolLabel | None = None) -> Resources:
        return Resources.limits()
