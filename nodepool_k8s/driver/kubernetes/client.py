"""One provider's connection to its cluster, and every API call made through it.

Owns: building the official client (kubeconfig context, or the pod's service account when
there is no kubeconfig; every exec credential plugin bounded by `credentials-exec-timeout`
through `exec_limit`), keeping its logging from dumping bodies (service-account tokens
travel in them), and `KubeClient.call`: one API call with typed errors and retries configured
by the provider's `api_retries`/`api_backoff`/`api_timeout`. Responses are decoded to plain
dicts (`_preload_content=False`), never to client model objects. Every request has
the provider's short connect and read timeouts (`api-connect-timeout`, `api-read-timeout`);
a launch passes its `Budget` (its cancel event and its deadline) so that its calls, their
retries and the waits between them together end by the launch's deadline. Every HTTP
request goes out through `MeteredApiClient.request`, which reports its verb, resource and
status code to the provider's `on_api_call` listener (the launcher's metrics), or, for the
hot requests of a launch and a deletion, through an `Endpoint` (`KubeClient.api`), which
reports the same. Every request, `call`'s and
a watch's (`stream`), goes through the client's live credentials (`credentials`): a 401 has
them loaded again (rate-limited) and the request sent once more.

How it fails: `connect` raises TemporaryError when no credentials can be loaded. `call`
raises the mapped error (see `errors`) at once for permanent failures and quota refusals,
and after the configured retries for temporary ones; each retry is logged "#i/n will retry",
the last failure "#n/n giving up". A cancelled wait between retries raises the last error;
within a launch's `Budget`, a retry that would pass its deadline is not made (the last
error is raised) and a call with no time left raises BootTimeout without sending anything.
A 401 that loading the credentials again did not cure raises `errors.Unauthorized` (a
`ProviderUnavailable`, naming the provider and its context) without the API retries.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote, urlsplit

import urllib3.exceptions
from kubernetes import client as k8s
from kubernetes.client.exceptions import (ApiException, ForbiddenException, NotFoundException,
                                          ServiceException, UnauthorizedException)
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

from nodepool_k8s.runtime.clock import SYSTEM_CLOCK, Clock
from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import ProviderConfig
from nodepool_k8s.driver.kubernetes.credentials import Credentials, LiveConfiguration, Loader
from nodepool_k8s.driver.kubernetes.errors import (Conflict, TlsUntrusted, Unauthorized,
                                                   is_retryable, map_api_error)
from nodepool_k8s.driver.kubernetes.health import ApiHealth, TrustFollower
from nodepool_k8s.core.errors import (BootTimeout, LaunchError, NodepoolError, PermanentError,
                                      TemporaryError)
from nodepool_k8s.driver.base import API_NO_ANSWER as NO_ANSWER
from nodepool_k8s.driver.base import ApiCallListener

log = logging.getLogger(__name__)
T = TypeVar("T")

# A Retry-After longer than this is capped: the caller's own deadline matters more.
MAX_RETRY_AFTER = 60.0
# A cluster CA bundle travels (base64) in every node record; a few certificates are a few
# KB. Beyond this the record would pass the size its readers accept.
MAX_CA_BYTES = 128 * 1024
DEFAULT_KUBECONFIG = "~/.kube/config"
# Where a pod's service account is mounted (its `token` and `ca.crt`), for in-cluster use.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The script every exec credential plugin runs under (run by path: it must not import this
# package, and starts in a few tens of milliseconds with `python -I`).
EXEC_LIMIT = str(Path(__file__).with_name("exec_limit.py"))


class _NoBodies(logging.Filter):
    """Drop the classic client's "response body: ..." debug records (they carry tokens)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("response body")


def _silence_body_logging() -> None:
    rest_logger = logging.getLogger("kubernetes.client.rest")
    if not any(isinstance(f, _NoBodies) for f in rest_logger.filters):
        rest_logger.addFilter(_NoBodies())


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently one API call is repeated on a temporary error."""

    retries: int = 5  # repeats after the first attempt
    backoff: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 4.0)  # delay before repeat i (last reused)
    timeout: float = 30.0  # per request, for the whole answer, seconds
    connect_timeout: float = 5.0  # per request, to connect (within `timeout`)
    read_timeout: float = 10.0  # per request, between answer bytes (within `timeout`)

    @classmethod
    def from_config(cls, config: ProviderConfig) -> "RetryPolicy":
        return cls(retries=max(0, int(config.api_retries)),
                   backoff=tuple(config.api_backoff) or (1.0,),
                   timeout=float(config.api_timeout),
                   connect_timeout=float(config.api_connect_timeout),
                   read_timeout=float(config.api_read_timeout))

    def request_timeout(self, left: float | None = None) -> tuple[float, float]:
        """urllib3's (connect, read) timeouts of one request, none above `timeout` nor
        above `left` (what remains of the caller's budget)."""
        cap = self.timeout if left is None else max(0.001, min(self.timeout, left))
        return min(self.connect_timeout, cap), min(self.read_timeout, cap)

    def delay(self, retry: int, error: NodepoolError) -> float:
        base = self.backoff[min(retry, len(self.backoff) - 1)]
        hinted = getattr(error, "delay", None)
        if hinted:
            return max(base, min(float(hinted), MAX_RETRY_AFTER))
        return base


def kubeconfig_paths(explicit: str | None) -> list[str]:
    """The kubeconfig files to try: `explicit`, else $KUBECONFIG (read now, not at import)."""
    raw = explicit or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    return [os.path.expanduser(p) for p in raw.split(os.pathsep) if p]


def _limit_exec_plugins(kubeconfig: Any, seconds: float) -> None:
    """Put `exec_limit` in front of every `exec` user of the merged `kubeconfig` (the
    client's ConfigNode, changed in place): the client waits for a plugin without a limit,
    at the load and whenever its refresh hook renews a token. The plugin keeps its own
    command, arguments, environment and working directory."""
    for entry in kubeconfig.value.get("users") or []:
        user = getattr(entry, "value", entry)
        plugin = (user.get("user") or {}).get("exec") if isinstance(user, dict) else None
        if not isinstance(plugin, dict) or "command" not in plugin:
            continue
        plugin["args"] = ["-I", EXEC_LIMIT, f"{seconds:g}", "--", str(plugin["command"]),
                          *[str(a) for a in plugin.get("args") or []]]
        plugin["command"] = sys.executable


def _load_kubeconfig(config_file: str, context: str | None, exec_timeout: float,
                     configuration: k8s.Configuration) -> str | None:
    """What `kubernetes.config.load_kube_config` does, with the exec plugins limited;
    returns the context used."""
    merged = KubeConfigMerger(config_file).config
    if merged is None:
        raise ConfigException("Invalid kube-config file. No configuration found.")
    _limit_exec_plugins(merged, exec_timeout)
    loader = KubeConfigLoader(config_dict=merged, active_context=context,
                              config_base_path=None)
    loader.load_and_set(configuration)
    current = loader.current_context
    return context or (current.get("name") if isinstance(current, dict) else None)


def load_configuration(context: str | None, kubeconfig: str | None, pool_maxsize: int,
                       service_account: str = SERVICE_ACCOUNT_DIR,
                       exec_timeout: float = S.CREDENTIALS_EXEC_TIMEOUT,
                       ) -> tuple[k8s.Configuration, str | None]:
    """A fresh client Configuration and the context name actually used (None in-cluster).

    Reads the files now, every time: the start and every credentials reload come here, so
    a rewritten kubeconfig (or a rotated in-cluster token) is what the next load sees.
    `service_account`: the directory of the in-cluster `token` and `ca.crt`.
    `exec_timeout`: seconds an exec credential plugin may run (see `exec_limit`)."""
    _silence_body_logging()
    # type.__call__ skips any class-level default copy, so providers never share settings;
    # LiveConfiguration runs the client's credential refresh one thread at a time.
    configuration = type.__call__(LiveConfiguration)
    paths = [p for p in kubeconfig_paths(kubeconfig) if os.path.exists(p)]
    if kubeconfig and not paths:
        # Falling back to in-cluster credentials would hide a typo in an explicit path.
        raise TemporaryError(f"kubeconfig {kubeconfig} not found")
    try:
        if paths:
            used = _load_kubeconfig(os.pathsep.join(paths), context, exec_timeout,
                                    configuration)
        else:
            # What load_incluster_config does, with the directory as a parameter. With
            # try_refresh_token the client re-reads the token file (which the kubelet
            # rotates) once a minute by itself; a 401 before that reloads it here.
            InClusterConfigLoader(
                token_filename=os.path.join(service_account, "token"),
                cert_filename=os.path.join(service_account, "ca.crt"),
                try_refresh_token=True).load_and_set(configuration)
            used = context
    except (ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        raise TemporaryError(f"cannot load Kubernetes credentials "
                             f"(context {context!r}): {exc}") from exc
    configuration.debug = False  # debug would make urllib3/http.client print bodies
    configuration.connection_pool_maxsize = pool_maxsize
    # One request per attempt: `call` is the only place that retries, with the provider's
    # api-retries/api-backoff and a capped Retry-After. urllib3's default (3 retries)
    # repeated every GET and DELETE that timed out, and every 429/503 with Retry-After
    # after sleeping that long uncapped, before `call` even saw it.
    configuration.retries = urllib3.util.Retry(0)
    return configuration, used


Sleeper = Callable[[float], bool]
"""Waits up to the given seconds; returns True when the wait was cut short (cancelled)."""


def _never_cancelled(seconds: float) -> bool:
    threading.Event().wait(seconds)
    return False


class Budget:
    """One launch's budget for all of its API calls: a `Sleeper` cut short by `cancel`,
    and the monotonic `deadline` (on `clock`) that no request, retry or wait between
    retries of `KubeClient.call` may pass."""

    def __init__(self, cancel: threading.Event, deadline: float, clock: Clock) -> None:
        self.cancel = cancel
        self.deadline = deadline
        self.clock = clock

    def __call__(self, seconds: float) -> bool:
        return self.cancel.wait(max(0.0, min(seconds, self.remaining())))

    def remaining(self) -> float:
        return self.deadline - self.clock.monotonic()


# How much of an answer one read may return.
READ_BYTES = 65536


def _read_body(response: Any, deadline: float, what: str, timeout: float) -> bytes:
    """The whole answer, or TemporaryError once `deadline` has passed.

    urllib3's read timeout bounds each read from the socket, not the answer: a server (or a
    proxy) that sent its headers and then one byte every few seconds held a launch, and
    Zuul's request, for ever. Reading what has arrived, piece by piece, lets the call's
    own deadline (`api-timeout`) end it."""
    parts: list[bytes] = []
    while True:
        chunk = response.read1(READ_BYTES)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        if time.monotonic() > deadline:
            raise TemporaryError(f"{what}: the answer took longer than {timeout:g}s")


# Namespace subresources: `/namespaces/NAME/status` is the namespace's, not a resource kind.
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_RESOURCE = re.compile(r"[a-z0-9.-]{1,63}(/[a-z0-9.-]{1,63})?")
# The listener of `MeteredApiClient`: (verb, resource, code).
RequestListener = Callable[[str, str, str], None]


def describe_request(method: str, path: str, query: Any) -> tuple[str, str]:
    """The Kubernetes verb and resource (`plural` or `plural/subresource`) of one request,
    as the API server's authorizer names them; `other` for a path outside the API groups
    (`/version`) or one that does not look like a resource."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        rest = parts[3:]
    else:
        rest = []
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        rest = rest[2:]
    named = len(rest) >= 2
    resource = "/".join(rest[0:1] + rest[2:3])
    if not rest or len(rest) > 3 or not _RESOURCE.fullmatch(resource):
        resource = "other"
    method = method.upper()
    if not rest and method == "GET":
        verb = "get"  # a non-resource URL (`/version`, the health probe's): one read
    elif method == "GET":
        watching = any(str(k) == "watch" and str(v).lower() in ("true", "1")
                       for k, v in (query.items() if isinstance(query, dict) else query or ()))
        verb = "watch" if watch_path or watching else "get" if named else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method,
                                                                         method.lower())
    return verb, resource


class MeteredApiClient(k8s.ApiClient):  # type: ignore[misc]
    """The official ApiClient, reporting every request it sends to `listener`.

    `request` is where every call of the generated API classes goes out (calls, watches,
    `call_api` itself), so counting there counts each HTTP request once, including those
    that got no answer; swapping `rest_client` (a credentials reload) does not bypass it.
    An `Endpoint` sends below `request` and reports through `tell` itself."""

    listener: RequestListener | None = None

    def request(self, method: str, url: str, query_params: Any = None,
                *args: Any, **kwargs: Any) -> Any:
        code = NO_ANSWER
        try:
            response = super().request(method, url, query_params, *args, **kwargs)
            code = str(getattr(response, "status", "") or NO_ANSWER)
            return response
        except ApiException as exc:
            code = str(exc.status) if exc.status else NO_ANSWER
            raise
        finally:
            if self.listener is not None:
                try:
                    host = str(self.configuration.host or "")
                    path = url[len(host):] if url.startswith(host) else urlsplit(url).path
                    verb, resource = describe_request(method, path.partition("?")[0],
                                                      query_params)
                except Exception:  # noqa: BLE001 - counting must not fail a request
                    log.debug("describing an API request failed", exc_info=True)
                else:
                    self.tell(verb, resource, code)

    def tell(self, verb: str, resource: str, code: str) -> None:
        """Report one request sent (its answer's status `code`, or NO_ANSWER)."""
        listener = self.listener
        if listener is None:
            return
        try:
            listener(verb, resource, code)
        except Exception:  # noqa: BLE001 - counting must not fail a request
            log.debug("reporting an API request failed", exc_info=True)


# What the generated API methods send for a JSON request, the same for every call.
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
# The only authentication the generated methods name for every API call.
_AUTH_SETTINGS = ["BearerToken"]
# The errors the client's REST layer raises for an answer outside 2xx (others: ApiException).
_STATUS_ERRORS: dict[int, type[ApiException]] = {
    401: UnauthorizedException, 403: ForbiddenException, 404: NotFoundException}


def _urllib3_timeout(value: Any) -> urllib3.Timeout | None:
    """The client REST layer's reading of `_request_timeout`: a number bounds the whole
    request, a pair is (connect, read)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value:
        return urllib3.Timeout(total=value)
    if isinstance(value, tuple) and len(value) == 2:
        return urllib3.Timeout(connect=value[0], read=value[1])
    return None


class Endpoint:
    """One API operation (`method` on a path `template` such as
    `/api/v1/namespaces/{namespace}/roles`), sent through the client's live REST layer.

    What a generated method (`CoreV1Api.create_namespaced_role` and the like) and the layers
    under it do per call, checking keyword arguments, choosing headers, walking the body to
    sanitise it, formatting parameters, parsing the URL again to find its connection pool
    (together about a third of a call's CPU), is done once here. What matters is kept, per
    request: the client's default headers and its bearer token (read, and refreshed, through
    the configuration), the live `rest_client`'s connection pool (a new one after a
    credentials reload or a CA change), its TLS settings and its single attempt (`retries`),
    the timeouts, the REST layer's errors for an answer outside 2xx (`ApiException` and its
    subclasses, as `errors.map_api_error` reads them) and the metering (`MeteredApiClient.
    tell`, with the verb and resource worked out once from the template). Through a proxy,
    or with query parameters, it takes the generated methods' road
    (`MeteredApiClient.request`) instead. Bodies are plain dicts, answers raw
    (`_preload_content=False`), as `KubeClient.call` expects.

    Called like the generated method: the path parameters (`name` before `namespace`, as
    they order them), then the body (positional or `body=`) for a method that sends one;
    other keyword arguments are query parameters, named as the API names them."""

    def __init__(self, api_client: MeteredApiClient, method: str, template: str) -> None:
        self._api_client = api_client
        self.method = method
        self.template = template
        self._params = sorted(re.findall(r"{(\w+)}", template), key=lambda p: p != "name")
        self.__name__ = f"{method} {template}"
        self.verb, self.resource = describe_request(
            method, re.sub(r"{\w+}", "x", template), None)
        # (rest client, host) -> (its pool for the host, the host URL's path prefix)
        self._route: tuple[Any, str, Any, str] | None = None

    def path(self, *values: str) -> str:
        if len(values) != len(self._params):
            raise TypeError(f"{self.__name__} takes {len(self._params)} path parameters")
        path = self.template
        for name, value in zip(self._params, values):
            # As the generated methods quote: every character but unreserved ones.
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
        return path

    def _pool(self, rest_client: Any, host: str) -> tuple[Any, str] | None:
        """The connection pool of `rest_client` for `host` and the host's path prefix;
        None through a proxy (the pool manager then decides per request)."""
        route = self._route
        if route is not None and route[0] is rest_client and route[1] == host:
            return route[2], route[3]
        manager = rest_client.pool_manager
        if isinstance(manager, urllib3.ProxyManager):
            return None
        url = urllib3.util.parse_url(host)
        pool = manager.connection_from_host(url.host, port=url.port, scheme=url.scheme)
        prefix = url.path or ""
        self._route = (rest_client, host, pool, prefix)
        return pool, prefix

    def __call__(self, *args: Any, body: Any = None, _preload_content: bool = False,
                 _request_timeout: Any = None, **query: Any) -> Any:
        count = len(self._params)
        if len(args) > count + 1:
            raise TypeError(f"{self.__name__}: too many arguments")
        if len(args) == count + 1:
            body = args[count]
        path = self.path(*args[:count])
        api_client = self._api_client
        headers = {**api_client.default_headers, **_JSON_HEADERS}
        if api_client.cookie:
            headers["Cookie"] = api_client.cookie
        api_client.update_params_for_auth(headers, [], _AUTH_SETTINGS)
        host = str(api_client.configuration.host)
        route = None if query or _preload_content else self._pool(api_client.rest_client, host)
        if route is None:
            return api_client.request(self.method, host + path, query_params=list(query.items()),
                                      headers=headers, body=body,
                                      _preload_content=_preload_content,
                                      _request_timeout=_request_timeout)
        pool, prefix = route
        code = NO_ANSWER
        try:
            try:
                response = pool.urlopen(
                    self.method, prefix + path,
                    body=None if body is None else json.dumps(body), headers=headers,
                    preload_content=False, timeout=_urllib3_timeout(_request_timeout),
                    redirect=False, assert_same_host=False)
            except urllib3.exceptions.SSLError as exc:
                # As the REST layer words it: an HTTP reason phrase, not a condition reason.
                phrase = f"{type(exc).__name__}\n{exc}"
                raise ApiException(status=0, reason=phrase) from exc
            status = int(response.status)
            code = str(status or NO_ANSWER)
            if not 200 <= status <= 299:
                error = ServiceException if 500 <= status <= 599 \
                    else _STATUS_ERRORS.get(status, ApiException)
                raise error(http_resp=response)
            return response
        finally:
            api_client.tell(self.verb, self.resource, code)


class Endpoints:
    """The operations a launch and a deletion make, each an `Endpoint` of one client."""

    def __init__(self, api_client: MeteredApiClient) -> None:
        def op(method: str, template: str) -> Endpoint:
            return Endpoint(api_client, method, template)
        ns = "/api/v1/namespaces/{namespace}"
        self.create_namespace = op("POST", "/api/v1/namespaces")
        self.read_namespace = op("GET", "/api/v1/namespaces/{name}")
        self.delete_namespace = op("DELETE", "/api/v1/namespaces/{name}")
        self.create_namespaced_resource_quota = op("POST", ns + "/resourcequotas")
        self.create_namespaced_limit_range = op("POST", ns + "/limitranges")
        self.create_namespaced_service_account = op("POST", ns + "/serviceaccounts")
        self.create_namespaced_service_account_token = op(
            "POST", ns + "/serviceaccounts/{name}/token")
        self.create_namespaced_pod = op("POST", ns + "/pods")
        self.create_namespaced_event = op("POST", ns + "/events")
        self.create_namespaced_network_policy = op(
            "POST", "/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")
        rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        self.create_namespaced_role = op("POST", rbac + "/roles")
        self.create_namespaced_role_binding = op("POST", rbac + "/rolebindings")


def _cannot_reload() -> tuple[k8s.Configuration, str | None]:
    raise TemporaryError("this client was not given a way to load its credentials again")


class KubeClient:
    """The API groups we use plus the retrying, error-mapping `call`.

    `load` loads the credentials again as at the start (see `credentials`); `backoff` is the
    provider's `credentials-backoff`, on `clock`; `on_change` hears when the credentials
    become refused or accepted again, and when the API server becomes unusable or usable
    again (`health`); `on_api_call` hears of every HTTP request sent. `sources()` names the
    kubeconfig files the configuration came from (a rotated CA in them is followed, see
    `health.TrustFollower`)."""

    def __init__(self, configuration: k8s.Configuration, context: str | None,
                 retry: RetryPolicy, provider: str = "", load: Loader | None = None,
                 backoff: tuple[float, ...] = (1.0,), clock: Clock = SYSTEM_CLOCK,
                 on_change: Callable[[], None] | None = None,
                 on_api_call: ApiCallListener | None = None,
                 sources: Callable[[], list[str]] | None = None) -> None:
        self.configuration = configuration
        self.context = context
        self.retry = retry
        self.api_client = MeteredApiClient(configuration)
        if on_api_call is not None:
            name = provider or str(context)
            self.api_client.listener = (
                lambda verb, resource, code: on_api_call(name, verb, resource, code))
        self.core = k8s.CoreV1Api(self.api_client)
        self.rbac = k8s.RbacAuthorizationV1Api(self.api_client)
        self.networking = k8s.NetworkingV1Api(self.api_client)
        self.authentication = k8s.AuthenticationV1Api(self.api_client)
        self.version = k8s.VersionApi(self.api_client)
        self.api = Endpoints(self.api_client)
        self.credentials = Credentials(provider or str(context), configuration, context,
                                       load or _cannot_reload, self.api_client, backoff,
                                       clock, on_change)
        self.health = ApiHealth(provider or str(context), clock, on_change)
        self.trust = TrustFollower(provider or str(context), self.credentials,
                                   self.api_client, load or _cannot_reload,
                                   sources or (lambda: []))

    @property
    def host(self) -> str:
        return str(self.configuration.host)

    @property
    def verify_ssl(self) -> bool:
        return bool(self.configuration.verify_ssl)

    def ca_crt(self) -> str | None:
        """Base64 of the CA bundle (PEM) this client trusts, or None (system CAs, no file).

        The kubeconfig loader writes `certificate-authority-data` to a file; in-cluster it is
        the service account's ca.crt. Jobs get the same CA the launcher verified.
        """
        path = self.configuration.ssl_ca_cert
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                pem = f.read(MAX_CA_BYTES + 1)
        except OSError as exc:
            raise TemporaryError(f"cannot read the cluster CA {path}: {exc}") from exc
        if len(pem) > MAX_CA_BYTES:
            # It goes into every node record, which readers refuse beyond 256 KiB.
            raise LaunchError(f"the cluster CA bundle {path} is over {MAX_CA_BYTES} bytes, "
                              "too large to hand to jobs in a node record", reason="BadCA",
                              retryable=False)
        return base64.b64encode(pem).decode("ascii")

    def call(self, what: str, fn: Callable[..., Any], *args: Any,
             sleep: Sleeper | Budget | None = None, created_ok: bool = False,
             **kwargs: Any) -> dict[str, Any]:
        """Run `fn(*args, **kwargs)` and return the decoded JSON body.

        `created_ok`: a 409 after an earlier attempt of this same create failed in transit
        means that attempt reached the server; it counts as success (returns {}).
        `sleep` waits between retries and may be cut short (the launch's cancel event); a
        `Budget` also bounds every attempt and retry by its deadline: a retry that would
        pass it is not made (the last error is raised).
        """
        budget = sleep if isinstance(sleep, Budget) else None
        wait: Sleeper = sleep or _never_cancelled
        fixed = kwargs.pop("_request_timeout", None)
        attempts = self.retry.retries + 1
        # The error is handled inside its `except` (which unbinds it on leaving): kept in a
        # local of this frame, which its own traceback holds, it made a reference cycle per
        # failed call, keeping the answer and its connection's TLS buffers until the
        # collector's next full pass instead of freeing them at once.
        for attempt in range(1, attempts + 1):
            left = budget.remaining() if budget is not None else None
            if left is not None and left <= 0:
                raise BootTimeout(f"{what}: no time left within the launch's deadline")
            timeouts = fixed if fixed is not None else self.retry.request_timeout(left)
            total = self.retry.timeout if left is None else min(self.retry.timeout, left)
            try:
                return self._usable(lambda: self._once(
                    what, fn, args, {**kwargs, "_request_timeout": timeouts}, total))
            except NodepoolError as error:
                if created_ok and attempt > 1 and isinstance(error, Conflict):
                    log.debug("%s: already exists after a retried create; accepting", what)
                    return {}
                delay = self.retry.delay(attempt - 1, error)
                last = attempt == attempts or (
                    budget is not None and delay >= budget.remaining())
                if isinstance(error, TlsUntrusted) or not is_retryable(error) or last:
                    # Given up (a certificate that does not verify stays so): the
                    # provider's ApiReachable condition says why at once.
                    self.health.failed(error)
                if not is_retryable(error) or last:
                    if is_retryable(error):
                        log.warning("%s failed: #%d/%d giving up%s: %s", what, attempt,
                                    attempts, "" if attempt == attempts
                                    else " (the launch's deadline comes first)", error)
                    raise
                log.info("%s failed: #%d/%d will retry in %.1fs: %s", what, attempt, attempts,
                         delay, error)
                if wait(delay):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, what: str, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """One request and its decoded answer within `timeout` (default `api-timeout`);
        any failure as a mapped NodepoolError."""
        timeout = self.retry.timeout if timeout is None else timeout
        try:
            deadline = time.monotonic() + timeout
            response = fn(*args, _preload_content=False, **kwargs)
            try:
                data = _read_body(response, deadline, what, timeout)
            except BaseException:
                response.close()  # a half-read answer must not go back to the pool
                raise
            finally:
                response.release_conn()
            body = json.loads(data) if data else {}
            if not isinstance(body, dict):
                # Every API answer is an object; a list or a string (a proxy's, a broken
                # server's) must not be read as an object missing its fields.
                raise TemporaryError(f"{what}: bad response: a JSON "
                                     f"{type(body).__name__}, not an object")
            return body
        except Exception as exc:  # noqa: BLE001 - mapped right here
            error = map_api_error(exc, what)
            if error is exc:
                raise
            try:
                raise error from exc
            finally:
                del error  # its traceback holds this frame: no cycle through the local

    def _usable(self, send: Callable[[], T]) -> T:
        """`send()` with the credentials' and the trust's second chances
        (`_authenticated`, `_trusted`); an answer marks the server reachable."""
        try:
            result = self._trusted(lambda: self._authenticated(send))
        except PermanentError:
            self.health.answered()  # a 4xx is an answer too
            raise
        self.health.answered()
        return result

    def _trusted(self, send: Callable[[], T]) -> T:
        """`send()`; after a certificate that did not verify, once more if the CA on disk
        changed and was put in place (`health.TrustFollower`)."""
        try:
            return send()
        except TlsUntrusted:
            if not self.trust.check():
                raise
        return send()

    def probe(self, connect_timeout: float, read_timeout: float) -> None:
        """One GET /version with these timeouts, no retries: raises the mapped error."""
        def once() -> dict[str, Any]:
            return self._once("probe the API server (GET /version)", self.version.get_code,
                              (), {"_request_timeout": (connect_timeout, read_timeout)})
        self._trusted(lambda: self._authenticated(once))

    def _authenticated(self, send: Callable[[], T]) -> T:
        """`send()`; after a 401, once more if the credentials could be loaded again.

        A 401 is about the launcher, not the request: repeating it with the API backoff
        cannot help, new credentials can (`credentials.Credentials.rejected` says whether
        there are any, and keeps the reloads to its own backoff)."""
        credentials = self.credentials
        generation = credentials.generation
        try:
            result = send()
        except Unauthorized as error:
            if not credentials.rejected(generation, error):
                raise credentials.refusal(error) from error
            generation = credentials.generation
            try:
                result = send()
            except Unauthorized as again:
                credentials.rejected(generation, again)  # noted; repeated no further
                raise credentials.refusal(again) from again
        credentials.accepted()
        return result

    def stream(self, what: str, fn: Callable[..., Any], *args: Any,
               read_timeout: float, **kwargs: Any) -> Any:
        """Open a watch: the raw urllib3 response (single attempt, sent once more only after
        a 401 for which credentials could be loaded again; the caller loops)."""
        def open_watch() -> Any:
            try:
                return fn(*args, watch=True, _preload_content=False,
                          _request_timeout=(self.retry.request_timeout()[0], read_timeout),
                          **kwargs)
            except Exception as exc:  # noqa: BLE001 - mapped right here
                raise map_api_error(exc, what) from exc
        try:
            return self._usable(open_watch)
        except NodepoolError as error:
            self.health.failed(error)
            raise

    def close(self) -> None:
        try:
            self.api_client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            log.debug("closing the API client failed", exc_info=True)


def connect(config: ProviderConfig, kubeconfig: str | None, pool_maxsize: int,
            clock: Clock = SYSTEM_CLOCK, on_change: Callable[[], None] | None = None,
            service_account: str = SERVICE_ACCOUNT_DIR,
            on_api_call: ApiCallListener | None = None) -> KubeClient:
    """A client for `config`'s context whose credentials are loaded again, from the same
    place, when the API server refuses them (see `credentials`)."""
    def load() -> tuple[k8s.Configuration, str | None]:
        return load_configuration(config.context, kubeconfig, pool_maxsize, service_account,
                                  config.credentials_exec_timeout)

    configuration, used = load()
    if not configuration.verify_ssl:
        # The operator chose insecure-skip-tls-verify: say so once, not on every request.
        log.warning("TLS verification is off for context %s (%s)", used, configuration.host)
        warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)

    def sources() -> list[str]:
        return [p for p in kubeconfig_paths(kubeconfig) if os.path.exists(p)]

    return KubeClient(configuration, used, RetryPolicy.from_config(config), provider=config.name,
                      load=load, backoff=tuple(config.credentials_backoff), clock=clock,
                      on_change=on_change, on_api_call=on_api_call, sources=sources)
