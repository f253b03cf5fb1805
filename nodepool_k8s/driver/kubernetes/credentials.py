"""One provider's Kubernetes credentials over the launcher's lifetime, after its start.

Owns: what happens when the API server refuses the launcher's credentials (401), or the
operator asks for them to be read again (a configuration reload, SIGHUP): loading them
again exactly as at the start (`client.load_configuration`), putting the new ones in place
on the live client `Configuration` (no new client: the watches and every bound API method
keep working), when such a reload may happen (`ReloadPolicy`, pure), the one ERROR an
operator sees while the refusals go on, and the provider's credentials condition.

Why this exists: credentials do not live as long as a launcher. An exec plugin's token (EKS
`aws eks get-token`, GKE `gke-gcloud-auth-plugin`) lasts 15-60 minutes, the kubelet rotates
an in-cluster service-account token file, an operator rotates a token or a client
certificate in the kubeconfig. The official client already renews an exec token 5 minutes
before its `expirationTimestamp`, and re-reads the in-cluster token file once a minute,
through the `refresh_api_key_hook` its loaders install; that hook is kept, and run by one
thread at a time (`LiveConfiguration`), so that the threads meeting an expired token
together run the plugin once, not once each. What the client cannot know is that the
server refused a token it believes valid (revoked, rotated on disk, expired early, a clock
off): a 401 says so. Then the credentials are loaded again at once, and after that at
most once per step of the provider's `credentials-backoff` while refusals continue; any
accepted request ends the episode.

What a reload changes in place: the bearer token, basic auth, the refresh hook, the client
certificate and key (then the connection pool is rebuilt, so that no pooled connection
goes on presenting the old certificate). What it never changes: the server URL and the
trust (CA bundle, `insecure-skip-tls-verify`, `tls-server-name`). A kubeconfig that now
names another server or trust is not applied to a running provider behind the operator's
back (that would loosen TLS silently): `reload_now` reports it, and the launcher's
configuration reload replaces the provider instead, which logs at start what it trusts.
The one exception is a rotated CA bundle with verification still on, same server and
server name: `health.TrustFollower` puts that in place when the files change on disk.

How it fails: `rejected` and `accepted` never raise. A reload that cannot load (the file is
unreadable or invalid, or the result carries no credential at all, as when an exec plugin
fails: the client then logs the plugin's error and returns a configuration that would send
requests anonymously, which a real cluster answers with 403) keeps the current credentials;
the condition says why. An exec plugin runs under the provider's `credentials-exec-timeout`
(`client.load_configuration`, `exec_limit`): one that hangs is killed and counts as failed,
so a reload, and the requests waiting on the refresh lock, wait for it that long at most.
Only this provider's locks are held meanwhile; the launcher reads each provider's
credentials on a thread of its own, without its own lock.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from kubernetes import client as k8s
from kubernetes.client import rest

from nodepool_k8s.runtime.clock import Clock
from nodepool_k8s.driver.kubernetes.errors import Unauthorized
from nodepool_k8s.core.errors import NodepoolError
from nodepool_k8s.core.pool_records import ConditionRecord

log = logging.getLogger(__name__)

Loader = Callable[[], tuple[k8s.Configuration, str | None]]
"""Loads the credentials as at the start: a fresh Configuration and the context used."""

# Who the client talks to and whom it trusts: never changed on a running provider.
TRUST_FIELDS = ("host", "ssl_ca_cert", "verify_ssl", "tls_server_name", "assert_hostname",
                "proxy")
# Who the client says it is: replaced by a reload.
AUTH_FIELDS = ("api_key", "api_key_prefix", "username", "password", "cert_file", "key_file")
# The ERROR about refused credentials is repeated at most this often (episodes that end and
# begin again, say with a flaky authentication webhook, log at INFO in between).
REPEAT_LOG_INTERVAL = 600.0

ACCEPTED, REJECTED = "Accepted", "Rejected"


class LiveConfiguration(k8s.Configuration):  # type: ignore[misc]
    """The client Configuration of a provider, whose credential refresh one thread runs at
    a time.

    Every request reads the bearer token through `get_api_key_with_prefix`, which first runs
    the `refresh_api_key_hook` the client's loaders install. When an exec token is about to
    expire, the hook runs the plugin (a process, often a second or more): eight launches
    meeting that moment ran eight plugins at once. The hook re-installs itself on every
    call, so it cannot be wrapped; the read is serialised instead, and `Credentials` swaps
    credentials under the same lock. Never copied (the ApiClient keeps a reference), so the
    lock needs no deep-copy support."""

    def __init__(self) -> None:
        super().__init__()
        self.refresh_lock = threading.Lock()

    def get_api_key_with_prefix(self, identifier: str, alias: str | None = None) -> Any:
        with self.refresh_lock:
            return super().get_api_key_with_prefix(identifier, alias)


@dataclass(frozen=True)
class ReloadPolicy:
    """When the credentials may be loaded again while the server keeps refusing them."""

    backoff: tuple[float, ...]

    def wait_after(self, reloads: int) -> float:
        """Seconds to wait after the `reloads`-th reload of an episode (1-based) before the
        next one may happen; the last step repeats."""
        steps = self.backoff or (0.0,)
        return float(steps[min(max(reloads, 1), len(steps)) - 1])


def credential_problem(configuration: k8s.Configuration) -> str | None:
    """Why `configuration` cannot authenticate anybody (None: it carries a credential)."""
    if configuration.api_key or configuration.cert_file or configuration.username:
        return None
    return "the loaded kubeconfig yields no credential (did its exec plugin fail?)"


def trust_change(live: k8s.Configuration, fresh: k8s.Configuration) -> str | None:
    """What of the server or the trust differs between `live` and `fresh` (None: same)."""
    changed = [name for name in TRUST_FIELDS
               if getattr(live, name, None) != getattr(fresh, name, None)]
    if not changed:
        return None
    return "the kubeconfig now names another " + ", ".join(changed)


def _auth_of(configuration: k8s.Configuration) -> tuple[Any, ...]:
    return tuple(repr(getattr(configuration, name, None)) for name in AUTH_FIELDS)


def _stamp(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Credentials:
    """The credentials of one provider's live Configuration, and their episodes of refusal.

    `generation` counts the loads put in place (changed or not): a caller notes it before a
    request, and `rejected(generation, ...)` tells whether credentials were loaded since.
    (Comparing what was loaded with what is live would not do: the client's own hook may
    have renewed the live token meanwhile, and the refused request carried the old one.)"""

    def __init__(self, provider: str, configuration: k8s.Configuration, context: str | None,
                 load: Loader, api_client: k8s.ApiClient, backoff: tuple[float, ...],
                 clock: Clock, on_change: Callable[[], None] | None = None) -> None:
        self.provider = provider
        self.configuration = configuration
        self.context = context
        self._load = load
        self._api_client = api_client
        self._policy = ReloadPolicy(tuple(backoff))
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()  # the episode's state below
        self._reload_lock = threading.Lock()  # one reload at a time
        # Held while the client's refresh hook runs and while credentials are swapped:
        # the hook writes the token of its own loader into the live Configuration.
        self._hook_lock: threading.Lock = getattr(configuration, "refresh_lock", None) \
            or threading.Lock()
        self.generation = 0
        self._since: float | None = None  # wall time of the episode's first refusal
        self._reloads = 0  # reloads in this episode
        self._next_reload = -math.inf  # monotonic time the next reload may happen
        self._refused = False  # the reloads did not help: reported, condition False
        self._problem: str | None = None  # why the last reload could not help
        self._last_error = -math.inf  # monotonic time of the last ERROR

    @property
    def reload_lock(self) -> threading.Lock:
        """Held while anything of the live configuration is replaced (credentials here, a
        rotated CA by `health.TrustFollower`): one change at a time."""
        return self._reload_lock

    @property
    def where(self) -> str:
        return f"context {self.context}" if self.context else "in-cluster service account"

    # -- what requests report --------------------------------------------------------------

    def accepted(self) -> None:
        """A request was answered (not 401): ends an episode of refusals."""
        if self._since is None:  # the common case, without a lock
            return
        with self._lock:
            if self._since is None:
                return
            refused, reloads = self._refused, self._reloads
            self._since, self._reloads, self._next_reload = None, 0, -math.inf
            self._refused, self._problem = False, None
        if refused:
            log.info("Provider %s: the API server accepts the launcher's credentials again "
                     "(%s) after %d reload(s)", self.provider, self.where, reloads)
            self._changed()
        else:
            log.info("Provider %s: the credentials loaded again (%s) are accepted",
                     self.provider, self.where)

    def rejected(self, generation: int, error: NodepoolError) -> bool:
        """A request sent with the credentials of `generation` was refused (401).

        True when credentials were loaded since it was sent (here, or by another thread
        meanwhile): the caller may send the request once more. False when not (the reload
        is not due, or it failed): the caller raises `refusal(error)`."""
        with self._lock:
            if generation != self.generation:
                return True
            first = self._since is None
            if first:
                self._since = self._clock.time()
        with self._reload_lock:
            with self._lock:
                if generation != self.generation:
                    return True  # another thread's reload put new ones in place
                now = self._clock.monotonic()
                due = now >= self._next_reload
                if due:
                    self._reloads += 1
                    self._next_reload = now + self._policy.wait_after(self._reloads)
            if due:
                (log.info if first else log.debug)(
                    "Provider %s: the API server refused the launcher's credentials (%s: "
                    "%s); loading them again", self.provider, self.where, error)
                if self._reload():
                    return True
        self._report(error)
        return False

    def refusal(self, error: NodepoolError) -> Unauthorized:
        """What a refused request raises: names the provider and where its credentials
        come from (a ProviderUnavailable: the core keeps requests waiting)."""
        return Unauthorized(f"provider {self.provider}: the API server refuses the "
                            f"launcher's credentials ({self.where}): {error}")

    # -- loading again ---------------------------------------------------------------------

    def reload_now(self) -> bool:
        """Load the credentials again at once (the operator reloaded the configuration).

        False when the kubeconfig now names another server or trust: a running provider
        does not follow that, it must be replaced. True otherwise (also when loading failed:
        the current credentials stay, with a WARNING)."""
        with self._reload_lock:
            fresh, problem, moved = self._fresh()
            if moved:
                log.info("Provider %s: %s (%s)", self.provider, problem, self.where)
                return False
            if fresh is None:
                log.warning("Provider %s: %s (%s); keeping the current credentials",
                            self.provider, problem, self.where)
                return True
            if self._apply(fresh):
                log.info("Provider %s: credentials loaded again (%s)", self.provider,
                         self.where)
            return True

    def _reload(self) -> bool:
        """Load and put in place (reload lock held); True if that worked."""
        fresh, problem, moved = self._fresh()
        if fresh is not None:
            if not self._apply(fresh):
                # Still worth one more try: the refused request may have carried an older
                # token than what is live now (renewed by the client's hook).
                with self._lock:
                    self._problem = "loading them again gave the same credentials"
            return True
        if moved:
            problem = f"{problem}; a configuration reload (SIGHUP) switches to it"
        with self._lock:
            self._problem = problem
        log.debug("Provider %s: %s (%s)", self.provider, problem, self.where)
        return False

    def _fresh(self) -> tuple[k8s.Configuration | None, str, bool]:
        """Load the credentials as at the start: (the configuration to put in place, or
        None and why not, and whether the kubeconfig now names another server or trust)."""
        try:
            fresh, _ = self._load()
        except NodepoolError as exc:
            return None, f"loading them again failed: {exc}", False
        change = trust_change(self.configuration, fresh)
        if change is not None:
            return None, change, True
        problem = credential_problem(fresh)
        return (None, problem, False) if problem is not None else (fresh, "", False)

    def _apply(self, fresh: k8s.Configuration) -> bool:
        """Put `fresh`'s credentials on the live Configuration; True if they changed.

        The connection pool is rebuilt when a client certificate is in use: a certificate
        file may keep its name and get a new content, and a pooled connection keeps
        presenting the certificate it was opened with."""
        live = self.configuration
        with self._hook_lock:
            before = _auth_of(live)
            # New objects, not updates: another thread may be reading the old ones.
            live.api_key = dict(fresh.api_key)
            live.api_key_prefix = dict(fresh.api_key_prefix)
            live.username, live.password = fresh.username, fresh.password
            live.cert_file, live.key_file = fresh.cert_file, fresh.key_file
            live.refresh_api_key_hook = fresh.refresh_api_key_hook
            changed = _auth_of(live) != before
        if live.cert_file:
            old = self._api_client.rest_client
            self._api_client.rest_client = rest.RESTClientObject(live)
            # Idle connections close now, busy ones (a watch) when they are released.
            old.pool_manager.clear()
            changed = True
        with self._lock:
            self.generation += 1  # after the swap: a request that sees it sends the new ones
        return changed

    # -- what operators see ----------------------------------------------------------------

    def _report(self, error: NodepoolError) -> None:
        """The reloads did not help: say so once per episode (ERROR at most every
        REPEAT_LOG_INTERVAL), and mark the condition."""
        with self._lock:
            if self._refused:
                return
            self._refused = True
            now = self._clock.monotonic()
            loud = now - self._last_error >= REPEAT_LOG_INTERVAL
            if loud:
                self._last_error = now
            problem = self._problem
            steps = self._policy.backoff
        (log.error if loud else log.info)(
            "Provider %s: the API server refuses the launcher's credentials (%s): %s%s. "
            "Launches wait (requests are neither failed nor declined); the credentials are "
            "loaded again every %gs at most until they are accepted: fix the kubeconfig, its "
            "exec plugin or the service account", self.provider, self.where, error,
            f"; {problem}" if problem else "", max(steps) if steps else 0.0)
        self._changed()

    def condition(self) -> ConditionRecord:
        """The provider's `Credentials` condition (status, reason, message)."""
        with self._lock:
            refused, since, problem = self._refused, self._since, self._problem
        if refused and since is not None:
            message = (f"{self.where}: the API server refuses the launcher's credentials "
                       f"(401) since {_stamp(since)}")
            return {"status": "False", "reason": REJECTED,
                    "message": message + (f"; {problem}" if problem else "")}
        return {"status": "True", "reason": ACCEPTED,
                "message": f"{self.where}: the API server accepts the launcher's credentials"}

    def _changed(self) -> None:
        if self._on_change is None:
            return
        try:
            self._on_change()
        except Exception:  # noqa: BLE001 - a listener must not break a request
            log.exception("credentials listener failed")
