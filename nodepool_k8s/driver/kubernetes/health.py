"""Whether one provider's API server can be used now, and following its CA when it rotates.

Owns: `ApiHealth`, the provider's `ProviderHealth` (the pools' `ApiReachable` condition:
`Reachable`, `Unreachable`, `TLSUntrusted`, `Unauthorized`), kept current by a cheap probe
and by the outcome of every real call; `ApiProbe`, the thread that probes (GET /version,
with the provider's own short connect and read timeouts, every `api-probe-interval`
seconds, sleeping to the next deadline); and `TrustFollower`, which notices that the files
the client's trust came from (the kubeconfig files, the CA file) changed on disk and then
puts a rotated CA in place on the live client, without a reload (SIGHUP).

Why: with the API server down, or presenting a certificate of a CA the launcher does not
trust, every launch failed while the pools' status stayed green. The probe finds out within
an interval and a timeout; a real call that fails on TLS, or gives up on a server nobody
answers for, says so at once; any answered call or probe says the server is back.

What the trust follower changes, and what not: only the CA bundle, and only when the fresh
load keeps TLS verification on, the same server, the same `tls-server-name` and proxy, and
still names a CA bundle of its own (not the system's CAs instead of the cluster's). The
old CA is not trusted any more once the new one is in place (the connection pool is built
again, so no pooled connection keeps the old trust). A kubeconfig that now names another
server, switches verification off or another server name is not followed (that would
loosen or move trust behind the operator's back): one WARNING per change, and a reload
(SIGHUP) replaces the provider as before.

How it fails: nothing here raises into a caller. A probe that fails is the condition's
news; a fresh load that fails keeps the current trust (logged once per change of the
files); a listener that raises is logged. Transitions are logged (WARNING when the server
becomes unusable, INFO when it is back) and heard by the provider's listeners (the pool
workers publish the condition and record an event).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from typing import Callable

from kubernetes import client as k8s
from kubernetes.client import rest

from nodepool_k8s.core.errors import NodepoolError, PermanentError
from nodepool_k8s.driver.base import ProviderHealth
from nodepool_k8s.driver.kubernetes.credentials import TRUST_FIELDS, Credentials, Loader
from nodepool_k8s.driver.kubernetes.errors import TlsUntrusted, Unauthorized, Unreachable
from nodepool_k8s.runtime.clock import Clock

log = logging.getLogger(__name__)

REACHABLE, UNREACHABLE, TLS_UNTRUSTED, UNAUTHORIZED = (
    "Reachable", "Unreachable", "TLSUntrusted", "Unauthorized")
# How much of an error message the condition keeps.
MESSAGE_LIMIT = 300


def failure_reason(error: NodepoolError) -> str | None:
    """The `ApiReachable` reason a failed request stands for (None: the server answered)."""
    if isinstance(error, TlsUntrusted):
        return TLS_UNTRUSTED
    if isinstance(error, Unreachable):
        return UNREACHABLE
    if isinstance(error, Unauthorized):
        return UNAUTHORIZED
    return None


class ApiHealth:
    """The provider's view of its API server, from probes and real calls (thread-safe)."""

    def __init__(self, provider: str, clock: Clock,
                 on_change: Callable[[], None] | None = None) -> None:
        self.provider = provider
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._state = ProviderHealth(None, "Unknown", "not probed yet")

    def current(self) -> ProviderHealth:
        with self._lock:
            return self._state

    def answered(self, note: str = "") -> None:
        """The server answered a request (any answer but a 401 that reloading did not
        cure): reachable, trusted, the credentials accepted."""
        state = self._state  # the common case without the lock: already healthy
        if state.healthy and state.reason == REACHABLE and not note:
            return
        self._set(True, REACHABLE, note or "the API server answers")

    def failed(self, error: NodepoolError) -> None:
        """A request failed; marks the server unusable when that is what the error says."""
        reason = failure_reason(error)
        if reason is None:
            return
        self._set(False, reason, str(error)[:MESSAGE_LIMIT])

    def _set(self, healthy: bool, reason: str, message: str) -> None:
        with self._lock:
            old = self._state
            moved = (old.healthy, old.reason) != (healthy, reason)
            since = self._clock.time() if moved else old.since
            self._state = ProviderHealth(healthy, reason, message, since)
        if not moved:
            return
        if healthy:
            log.info("Provider %s: the API server answers again%s", self.provider,
                     f" (was {old.reason})" if old.healthy is False else "")
        else:
            log.warning("Provider %s: the API server cannot be used (%s): %s",
                        self.provider, reason, message)
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception:  # noqa: BLE001 - a listener must not break a request
                log.exception("API health listener failed")


Fingerprint = tuple[tuple[str, int, int], ...]


def fingerprint(paths: list[str]) -> Fingerprint:
    """(path, mtime in ns, size) of each existing file of `paths` (a missing one: -1s)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append((path, -1, -1))
            continue
        out.append((path, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _digest(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


class TrustFollower:
    """Puts a CA rotated on disk in place on the live client (see the module docstring).

    `sources()` names the files the client's configuration was loaded from (the kubeconfig
    files; the CA file of the live configuration is watched besides)."""

    def __init__(self, provider: str, credentials: Credentials, api_client: k8s.ApiClient,
                 load: Loader, sources: Callable[[], list[str]]) -> None:
        self.provider = provider
        self._credentials = credentials
        self._api_client = api_client
        self._load = load
        self._sources = sources
        self._lock = threading.Lock()  # one look at a time
        live = credentials.configuration
        self._ca_digest = _digest(live.ssl_ca_cert)
        self._seen = self._fingerprint()

    def _fingerprint(self) -> Fingerprint:
        paths = list(self._sources())
        ca = self._credentials.configuration.ssl_ca_cert
        if ca and ca not in paths:
            paths.append(str(ca))
        return fingerprint(paths)

    def check(self) -> bool:
        """Look at the files; if they changed, load them and follow a rotated CA. True when
        a new CA was put in place (a request that failed on TLS may be sent again)."""
        with self._lock:
            now = self._fingerprint()
            if now == self._seen:
                return False
            self._seen = now
            try:
                fresh, _ = self._load()
            except NodepoolError as exc:
                log.warning("Provider %s: the kubeconfig changed but cannot be loaded (%s);"
                            " keeping the current trust", self.provider, exc)
                return False
            return self._follow(fresh)

    def _follow(self, fresh: k8s.Configuration) -> bool:
        live = self._credentials.configuration
        changed = [name for name in TRUST_FIELDS
                   if getattr(live, name, None) != getattr(fresh, name, None)]
        digest = _digest(fresh.ssl_ca_cert)
        if not changed and digest == self._ca_digest:
            return False  # the credentials may have changed: a 401 has them loaded
        if set(changed) - {"ssl_ca_cert"} or not fresh.verify_ssl or not live.verify_ssl \
                or (live.ssl_ca_cert and not fresh.ssl_ca_cert):
            # Moved, loosened, or from the cluster's own CA to the system's many.
            log.warning("Provider %s: the kubeconfig now names another %s: not followed by"
                        " a running provider; a reload (SIGHUP) switches to it",
                        self.provider, ", ".join(changed) or "trust")
            return False
        with self._credentials.reload_lock:
            old = self._api_client.rest_client
            live.ssl_ca_cert = fresh.ssl_ca_cert
            self._api_client.rest_client = rest.RESTClientObject(live)
            # Idle connections close now, busy ones (a watch) when they are released.
            old.pool_manager.clear()
        self._ca_digest = digest
        log.warning("Provider %s: the cluster CA on disk changed: trusting the new CA"
                    " bundle %s from now on (the old one no more)", self.provider,
                    fresh.ssl_ca_cert)
        return True


class ApiProbe:
    """Probes the API server every `interval` seconds on a thread of its own, and looks at
    the trust files first (`check_trust`: `TrustFollower.check`)."""

    def __init__(self, provider: str, probe: Callable[[], None],
                 check_trust: Callable[[], bool], health: ApiHealth, clock: Clock,
                 interval: float) -> None:
        self.provider = provider
        self._probe = probe
        self._check_trust = check_trust
        self._health = health
        self._clock = clock
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"api-probe-{provider}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        # A probe in flight against a dead server may take its whole timeouts: the thread
        # (a daemon, holding nothing) finishes it alone rather than hold up a stop.
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(1.0)

    def probe_once(self) -> None:
        """One look: the trust files, then GET /version (the outcome lands in `health`)."""
        try:
            self._check_trust()
        except Exception:  # noqa: BLE001 - the probe must go on
            log.exception("Provider %s: looking at the kubeconfig failed", self.provider)
        try:
            self._probe()
        except PermanentError as exc:
            # Answered, though not with 200 (a 403 for /version, say): the server is there
            # and took the credentials; real calls tell the rest.
            self._health.answered(f"the API server answers the probe with an error:"
                                  f" {str(exc)[:MESSAGE_LIMIT]}")
        except NodepoolError as exc:
            if failure_reason(exc) is None:
                # A 5xx (from a load balancer with nothing behind it, an API server without
                # its storage), a TLS handshake that is no verification failure, an answer
                # that never ended: not usable either.
                exc = Unreachable(str(exc))
            self._health.failed(exc)
        except Exception:  # noqa: BLE001 - the probe must go on
            log.exception("Provider %s: the API probe failed unexpectedly", self.provider)
        else:
            self._health.answered()

    def _run(self) -> None:
        while not self._stop.is_set():
            due = self._clock.monotonic() + self._interval
            self.probe_once()
            wait = min(max(due - self._clock.monotonic(), 0.0), self._interval)
            self._stop.wait(wait)
