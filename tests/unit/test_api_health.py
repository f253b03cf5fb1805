"""`health.ApiHealth` and `health.ApiProbe` without a server: what a probe's outcome does to
the provider's `ApiReachable` state (a plain callable stands in for the GET /version).

Aspects: the state starts Unknown; a probe that raises `Unreachable` or `TlsUntrusted`
turns it False with that reason and the error as message, and the listener hears each
transition once (not a repeat); a 5xx or another failure of the probe counts as
unreachable, a 403 as reachable; any answer turns it True again; a failure of a real call
that says nothing about reaching the server (a 404, a 500) leaves it alone; `since` moves
only on a transition.
"""

from __future__ import annotations

from nodepool_k8s.core.errors import NodepoolError, NotFound, PermanentError, TemporaryError
from nodepool_k8s.driver.kubernetes import errors
from nodepool_k8s.driver.kubernetes.health import ApiHealth, ApiProbe
from nodepool_k8s.runtime.clock import ManualClock


def test_probe_outcomes_drive_the_state() -> None:
    clock = ManualClock(1000.0)
    heard: list[tuple[bool | None, str]] = []
    health = ApiHealth("p", clock, on_change=lambda: heard.append(
        (health.current().healthy, health.current().reason)))
    outcome: list[NodepoolError | None] = [None]

    def probe() -> None:
        if outcome[0] is not None:
            raise outcome[0]

    # The trust files never change here (no kubeconfig involved).
    prober = ApiProbe("p", probe, lambda: False, health, clock, interval=5.0)
    assert health.current().healthy is None and health.current().reason == "Unknown"

    prober.probe_once()
    assert (health.current().healthy, health.current().reason) == (True, "Reachable")
    assert health.current().since == 1000.0

    clock.advance(10)
    outcome[0] = errors.Unreachable("probe: Connection refused")
    prober.probe_once()
    prober.probe_once()  # no news: heard once
    state = health.current()
    assert (state.healthy, state.reason, state.since) == (False, "Unreachable", 1010.0)
    assert state.message == "probe: Connection refused"
    assert state.condition() == {"status": "False", "reason": "Unreachable",
                                 "message": "probe: Connection refused"}

    clock.advance(10)
    outcome[0] = errors.TlsUntrusted("probe: CERTIFICATE_VERIFY_FAILED")
    prober.probe_once()
    assert health.current().reason == "TLSUntrusted"

    clock.advance(10)
    outcome[0] = TemporaryError("probe: 503 the storage is not ready")  # not usable either
    prober.probe_once()
    assert (health.current().reason, health.current().message) \
        == ("Unreachable", "probe: 503 the storage is not ready")

    clock.advance(10)
    outcome[0] = errors.Forbidden("probe: 403 forbidden")  # answered: the server is there
    prober.probe_once()
    assert (health.current().healthy, health.current().reason) == (True, "Reachable")
    assert "403" in health.current().message

    health.failed(NotFound("a real call: 404"))  # says nothing about reaching the server
    health.failed(PermanentError("a real call: 400"))
    health.failed(TemporaryError("a real call: 500"))
    assert health.current().healthy is True

    assert heard == [(True, "Reachable"), (False, "Unreachable"), (False, "TLSUntrusted"),
                     (False, "Unreachable"), (True, "Reachable")]
