"""The shape of a configuration file, and the sole home of its defaults.

Owns: the voluptuous schemas for the main file, the secure file, both provider drivers, pools
and both label forms; the default values every other module resolves from (`build` reads them,
`doc/configuration.md` documents them); and the translation of voluptuous errors into
`providers[0].pools[1].labels[2].cpu: expected number, got 'two'` lines.

How it fails: `validate(data)` / `validate_secure(data)` return the list of problems (empty when
the data fits) and never raise; every problem is collected, not only the first. The schemas
check types and ranges only; cross-field rules live in `checks`.

NB: voluptuous stops a list at its first bad item, so lists here go through `list_of`, which
collects the errors of every item. Unknown keys are reported by `mapping` with a "did you
mean" hint instead of voluptuous' bare "extra keys not allowed".
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Any, Callable, Iterable, Mapping

from voluptuous import (
    ALLOW_EXTRA, Invalid, Marker, MultipleInvalid, Optional, Required, Schema,
)

Validator = Callable[[Any], Any]

# -- defaults (the only place they are written down) ---------------------------------------------

ZK_PORT = 2181  # NB: Nodepool's code said 2281 while its docs said 2181; we follow the docs.
ZK_TIMEOUT = 10.0
# kazoo sends the session timeout in ms as a 32-bit integer (at most 24.8 days: more fails
# every connection attempt); the server clamps it to its maxSessionTimeout anyway.
MAX_ZK_TIMEOUT = 86400.0
WEBAPP_PORT = 8005
WEBAPP_LISTEN_ADDRESS = "127.0.0.1"
WEBAPP_THREADS = 8
WEBAPP_TIMEOUT = 10
WEBAPP_SEND_TIMEOUT = 60
WEBAPP_MAX_HEADER_SIZE = 16384
# Open connections the web app keeps; past it the oldest idle or half-sent one is closed.
WEBAPP_MAX_CONNECTIONS = 1000
MIN_READY = 0
MAX_READY_AGE = 0.0  # 0 = ready nodes never expire
MAX_HOLD_AGE = 0.0  # 0 = held nodes never expire (stored as infinity)
MAX_CONCURRENCY = 0  # 0 or negative = unlimited
PRIORITY = 100
LAUNCH_RETRIES = 3
BOOT_TIMEOUT = 300.0
LEAK_GRACE = 60.0
# Circuit breaker for a failing label (pool keys, provider defaults): trips after this many
# consecutive non-transient launch failures (0: never), suspends the label for
# `breaker-backoff` seconds, doubling per trip up to `breaker-backoff-max`.
BREAKER_THRESHOLD = 3
BREAKER_BACKOFF = 60.0
BREAKER_BACKOFF_MAX = 3600.0
API_RETRIES = 5
API_BACKOFF = (0.2, 0.5, 1.0, 2.0, 4.0)
API_TIMEOUT = 30.0
# Kubernetes driver: one API request of a launch or a deletion may take this long to
# connect and this long between answer bytes (within `api-timeout` for the whole answer and
# within the launch's boot-timeout for all of its calls and retries together): an API
# server that accepts connections and never answers costs a launch seconds, not minutes.
API_CONNECT_TIMEOUT = 5.0
API_READ_TIMEOUT = 10.0
# A pool that holds a request it cannot serve now (its API server unusable, the pool
# paused or drained, the cluster refusing for quota) hands it back (a decline another pool
# takes) once the cause has lasted this many seconds and another pool could serve it; the
# labels it handed back are left to other pools for `recently-failed-ttl` seconds.
HAND_BACK_AFTER = 10.0
RECENTLY_FAILED_TTL = 120.0
# Kubernetes driver: once the API server refuses the launcher's credentials (401), they are
# loaded again at once, then at most once per step of this list (the last step repeats).
CREDENTIALS_BACKOFF = (1.0, 5.0, 15.0, 30.0, 60.0)
# Kubernetes driver: seconds a kubeconfig exec credential plugin may run before it (and
# every process it started) is killed and the load counts as failed.
CREDENTIALS_EXEC_TIMEOUT = 30.0
# Kubernetes driver: the API server is probed (GET /version) this often, in seconds, each
# probe given this long to connect and this long to answer: the pools' ApiReachable
# condition turns False within about interval + timeout of an outage.
API_PROBE_INTERVAL = 5.0
API_PROBE_CONNECT_TIMEOUT = 3.0
API_PROBE_READ_TIMEOUT = 5.0
UNSCHEDULABLE_GRACE = 30.0  # seconds a pod may stay Unschedulable before the attempt fails
DELETE_TIMEOUT = 300.0  # seconds a deletion waits for the namespace to vanish
# Kubernetes driver: a node namespace of ours Terminating this long is stuck (a job's
# finalizer, a pod's huge grace period): the launcher reports it and clears what holds it.
TERMINATING_GRACE = 120.0
# Kubernetes driver: the longest grace period (seconds) a pod left in a stuck node
# namespace gets (a DELETE with gracePeriodSeconds); a job cannot pick its own.
MAX_POD_GRACE = 30
TOKEN_LIFETIME = 86400  # seconds a node's service-account token (TokenRequest) stays valid
MIN_TOKEN_LIFETIME = 600  # the API server refuses shorter TokenRequests (422)
MAX_TOKEN_LIFETIME = 2 ** 32  # ... and longer ones
# installation-id: a Kubernetes label value; absent = derived from the ZooKeeper hosts+chroot.
INSTALLATION_ID_MAX = 63
# Without installation-id, the launcher pins the id it derived at its first start here, and
# uses it from then on (zk/identity.py). Under systemd with StateDirectory=, the directory
# systemd made ($STATE_DIRECTORY, its first entry) replaces the default's.
INSTALLATION_ID_FILE = "/var/lib/nodepool/installation-id"
INSTALLATION_ID_FILE_NAME = "installation-id"
STATE_DIRECTORY_ENV = "STATE_DIRECTORY"
INSTALLATION_ID_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
IMAGE_PULL = "IfNotPresent"
K8S_ANNOTATIONS_MAX = 256 * 1024  # bytes of keys and values the API server allows an object
PYTHON_PATH = "auto"
FAKE_LABEL_TYPE = "namespace"
# Guarded namespaces (kubernetes labels; label -> pool default-label-* -> provider
# default-label-* -> these). A label that uses a setting baseline forbids gets "privileged".
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")
POD_SECURITY = "baseline"
RESOURCE_QUOTA = True
NETWORK_POLICY = False  # needs a CNI that enforces it, and CIDRs of what jobs may reach
ALLOW_EXTERNAL_SERVICES = False
# Secrets in the job's role (namespace labels): off, because a job that may create Secrets
# may create a service-account-token one, a token that never expires (doc/security.md).
ALLOW_JOB_SECRETS = False
# Object counts and PVC storage (MB) the namespace's ResourceQuota allows: room for what a
# CI job deploys, not for filling etcd or the storage backend. `object-quota` changes an
# entry (label, then pool/provider `default-label-object-quota`, per entry).
OBJECT_QUOTA = {"pods": 50, "services": 20, "secrets": 50, "configmaps": 50,
                "persistentvolumeclaims": 10, "storage": 10000}
# Scheduling (kubernetes pod labels): tolerations and node requirements, as Kubernetes
# accepts them (see checks._scheduling for the operator/values rules).
TOLERATION_OPERATORS = ("Equal", "Exists")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
REQUIREMENT_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# Label keys whose pool and provider defaults are `default-label-<key>` (first found wins).
SCHEDULING_KEYS = ("tolerations", "node-requirements", "preferred-node-requirements")
# Fleet control (pool keys): maintenance windows and the drift replacement budget.
MAINTENANCE_ACTIONS = ("pause", "drain")
MAINTENANCE_ACTION = "pause"
TIMEZONE = "UTC"
DRIFT_MAX_NODES = 1  # drifted spares replaced at once when no budget is configured
# Disruption of spare nodes (ready, unallocated, unlocked) by the launcher itself, by reason:
# drift (built from an older configuration), expiry (past `max-age`), surplus (beyond the
# min-ready target) and drain (the pool is drained). A pool's `disruption-budgets` limit how
# many of its nodes may be being deleted at once for each reason; a reason no budget names
# gets its default below (None: unlimited: a drain is the operator's explicit order).
DISRUPTION_REASONS = ("drift", "expiry", "surplus", "drain")
DISRUPTION_DEFAULTS: dict[str, int | None] = {"drift": DRIFT_MAX_NODES, "expiry": 1,
                                              "surplus": 1, "drain": None}
# Seconds a label must stay over its min-ready target before its surplus spares are
# removed (0: surplus spares are never removed).
SURPLUS_DELAY = 300.0
MAX_AGE = 0.0  # seconds after creation a spare is replaced; 0 = no maximum age
# OpenTelemetry tracing (`tracing`): off unless asked for; spans go over OTLP to `endpoint`.
# A plaintext endpoint (`http://...`) needs `insecure: true`.
TRACING_ENABLED = False
TRACING_PROTOCOLS = ("http/protobuf", "grpc")
TRACING_PROTOCOL = "http/protobuf"
TRACING_SERVICE_NAME = "nodepool-launcher"
TRACING_INSECURE = False
TRACING_TIMEOUT = 10.0  # seconds one export may take

# Private registries (kubernetes pod labels; label, then pool/provider
# `default-label-image-pull-secrets`, first found wins): Secrets the operator names
# ({name, namespace}, the namespace always explicit), copied into the node's namespace and
# named in the pod's imagePullSecrets. At most this many per label; only these types, and
# at most this many bytes of data (keys plus decoded values) per Secret, are copied.
MAX_IMAGE_PULL_SECRETS = 8
PULL_SECRET_TYPES = ("kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg")
MAX_PULL_SECRET_BYTES = 64 * 1024
# Label keys whose pool and provider defaults are `default-label-<key>`.
GUARD_KEYS = ("pod-security", "resource-quota", "network-policy", "egress-allow",
              "allow-external-services", "allow-job-secrets", "object-quota")
# Pool or provider permissions for pod settings that reach past the pod's own sandbox.
PERMISSION_KEYS = ("allow-privileged", "allow-host-path", "allow-host-namespaces",
                   "allow-verbatim-spec")
JOB_ROLE_MODES = ("role", "cluster-role")
JOB_ROLE = "role"
FAKE_LAUNCH_DELAY = 0.0
FAKE_FAIL = False
CAPACITY_NODES = False  # capacity awareness reads the cluster's nodes only when asked to
# `zookeeper-acl`: on unless turned off; a grant without `permissions` gets every one.
ZK_ACL_ENABLED = True
ZK_GRANT_PERMISSIONS = ("all",)
# The installation id of objects built without a configuration file (tests, tools); a
# loaded configuration always resolves its own (see `build.installation_id`).
DEFAULT_INSTALLATION_ID = "default"

DRIVERS = ("fake", "kubernetes")
LABEL_TYPES = ("namespace", "pod")
IMAGE_PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# Keys Nodepool's image builder reads from a shared nodepool.yaml; accepted and ignored.
BUILDER_KEYS = ("diskimages", "elements-dir", "images-dir", "build-log-dir",
                "build-log-retention")
# Secure-file keys that override the main file.
SECURE_KEYS = ("zookeeper-servers", "zookeeper-tls", "zookeeper-auth", "zookeeper-acl")
# ZooKeeper ACL permissions by name (`all` is every one of them).
ZK_PERMISSIONS = ("read", "write", "create", "delete", "admin", "all")
# Schemes a `zookeeper-acl` grant may name (`world` would undo the ACL; `auth` is implied).
ZK_ACL_SCHEMES = ("digest", "x509", "sasl", "ip")
# Nodepool's secure file may also carry diskimage env-vars; accepted and ignored.
SECURE_IGNORED_KEYS = ("diskimages",)
# tenant-resource-limits key -> resource name as stored in a node's `resources`.
TENANT_LIMIT_KEYS = {"max-servers": "instances", "max-cores": "cores", "max-ram": "ram",
                     "max-volumes": "volumes", "max-volume-gb": "volume-gb"}

# -- error text ----------------------------------------------------------------------------------

_SIMPLE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")  # \Z: $ would let "key\n" through


def _got(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_error(expected: str, value: Any) -> Invalid:
    hint = ""
    if expected == "str" and isinstance(value, (bool, int, float)):
        hint = " (quote numbers and booleans in YAML to make them strings)"
    return Invalid(f"expected {expected}, got {_got(value)}{hint}")


def format_path(path: Iterable[Any]) -> str:
    """`['providers', 0, 'pools']` -> `providers[0].pools`; odd keys as `["app.k8s.io/x"]`."""
    out = ""
    for part in path:
        if isinstance(part, Marker):  # voluptuous puts Required('x') itself in the path
            part = part.schema
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _SIMPLE_KEY.match(part):
            out += f".{part}" if out else part
        else:
            # JSON-quoted so a key holding a newline cannot split the one-line message.
            out += f"[{_got(part)}]" if not isinstance(part, str) else \
                f"[{json.dumps(part, ensure_ascii=False)}]"
    return out


def _message(error: Invalid) -> str:
    msg = str(error.msg)
    if msg == "required key not provided":
        return "required key is missing"
    return msg


def format_errors(errors: Iterable[Invalid]) -> list[str]:
    """One `place: message` line per error, in the order found, without repeats."""
    lines: list[str] = []
    for error in errors:
        place = format_path(error.path)
        line = f"{place}: {_message(error)}" if place else _message(error)
        if line not in lines:
            lines.append(line)
    return lines


# -- validators ----------------------------------------------------------------------------------


def integer(minimum: int | None = None, maximum: int | None = None) -> Validator:
    def check(value: Any) -> int:
        # NB: bool is an int subclass; `max-servers: yes` must not read as 1.
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error("int", value)
        if minimum is not None and value < minimum:
            raise Invalid(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise Invalid(f"must be at most {maximum}, got {value}")
        return int(value)
    return check


def number(minimum: float | None = None, positive: bool = False,
           maximum: float | None = None) -> Validator:
    """An int or float (returned as float); `positive` excludes zero."""
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error("number", value)
        if value != value:  # NaN compares unequal to itself
            raise Invalid("must be a number, got NaN")
        if value in (math.inf, -math.inf):
            # `.inf` would reach Kubernetes as the quantity "Infinity", or a wait/timeout
            # that raises OverflowError on every use.
            raise Invalid(f"must be a finite number, got {value}")
        if positive and value <= 0:
            raise Invalid(f"must be greater than 0, got {value}")
        if minimum is not None and value < minimum:
            raise Invalid(f"must be at least {minimum:g}, got {value}")
        if maximum is not None and value > maximum:
            raise Invalid(f"must be at most {maximum:g}, got {value}")
        return float(value)
    return check


def string(allow_empty: bool = False) -> Validator:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise _type_error("str", value)
        if not allow_empty and not value.strip():
            raise Invalid("must not be empty")
        return value
    return check


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _type_error("bool (true or false)", value)
    return value


def one_of(*choices: str) -> Validator:
    def check(value: Any) -> str:
        if value not in choices:
            raise Invalid(f"expected one of {', '.join(choices)}; got {_got(value)}")
        return str(value)
    return check


def anything(value: Any) -> Any:
    return value


def list_of(item: Validator, min_items: int = 0, allow_none: bool = False) -> Validator:
    """A list whose every item is validated; errors of all items are collected."""
    def check(value: Any) -> list[Any]:
        if value is None and allow_none:
            return []
        if not isinstance(value, list):
            raise _type_error("list", value)
        if len(value) < min_items:
            raise Invalid(f"must have at least {min_items} item{'s' if min_items > 1 else ''}")
        out: list[Any] = []
        errors: list[Invalid] = []
        for index, entry in enumerate(value):
            try:
                out.append(item(entry))
            except Invalid as exc:
                exc.prepend([index])
                errors.extend(exc.errors if isinstance(exc, MultipleInvalid) else [exc])
        if errors:
            raise MultipleInvalid(errors)
        return out
    return check


def dict_of(key: Validator, val: Validator, expected: str = "mapping") -> Validator:
    """A mapping with validated keys and values; for open-ended maps (labels, resources)."""
    def check(value: Any) -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise _type_error(expected, value)
        errors: list[Invalid] = []
        out: dict[Any, Any] = {}
        for k, v in value.items():
            try:
                out[key(k)] = val(v)
            except Invalid as exc:
                exc.prepend([k])
                errors.extend(exc.errors if isinstance(exc, MultipleInvalid) else [exc])
        if errors:
            raise MultipleInvalid(errors)
        return out
    return check


def _key_name(marker: Any) -> str:
    return str(getattr(marker, "schema", marker))


def mapping(fields: Mapping[Any, Validator], extra: Validator | None = None,
            unknown_hint: str = "") -> Validator:
    """A mapping with known keys; unknown keys are errors (or go through `extra`)."""
    schema = Schema(dict(fields), extra=ALLOW_EXTRA)
    known = [_key_name(k) for k in fields]

    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _type_error("mapping", value)
        errors: list[Invalid] = []
        out: dict[str, Any] = {}
        try:
            out = schema(value)
        except MultipleInvalid as exc:
            errors.extend(exc.errors)
        for key in value:
            if key in known:
                continue
            if extra is not None:
                try:
                    out[key] = extra(value[key])
                except Invalid as exc:
                    exc.prepend([key])
                    errors.extend(exc.errors if isinstance(exc, MultipleInvalid) else [exc])
                continue
            errors.append(Invalid(unknown_key_message(key, known, unknown_hint), path=[key]))
        if errors:
            raise MultipleInvalid(errors)
        return {k: v for k, v in out.items() if k in known or extra is not None}
    return check


def unknown_key_message(key: Any, known: Iterable[str], hint: str = "") -> str:
    message = "unknown key"
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message + (f"; {hint}" if hint else "")


def open_mapping(required: Mapping[str, Validator]) -> Validator:
    """A verbatim Kubernetes object (volume, mount, env entry): a few keys checked, rest kept."""
    schema = Schema({Required(k): v for k, v in required.items()}, extra=ALLOW_EXTRA)

    def check(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _type_error("mapping", value)
        out: dict[str, Any] = schema(value)
        return out
    return check


# -- building blocks -----------------------------------------------------------------------------

_any_mapping = dict_of(string(), anything)
_str_map = dict_of(string(), string(allow_empty=True))
_int_map = dict_of(string(), integer(minimum=0))
# Durations are handed to waits, sleeps and socket timeouts, which raise OverflowError
# for anything near 2**63 ns; about 31 years is plenty.
MAX_SECONDS = 10 ** 9
_seconds = number(minimum=0, maximum=MAX_SECONDS)
_timeout = number(positive=True, maximum=MAX_SECONDS)
_cpu = number(minimum=0)
_mib = integer(minimum=0)


def _token_lifetime(value: Any) -> int:
    seconds = int(integer()(value))
    if seconds < MIN_TOKEN_LIFETIME:
        raise Invalid(f"must be at least {MIN_TOKEN_LIFETIME} seconds (the Kubernetes API"
                      f" refuses shorter TokenRequests), got {seconds}")
    if seconds > MAX_TOKEN_LIFETIME:
        raise Invalid(f"must be at most {MAX_TOKEN_LIFETIME} seconds (2^32, the longest"
                      f" TokenRequest the Kubernetes API accepts), got {seconds}")
    return seconds


_ZK_SERVER = mapping({
    Required("host"): string(),
    Optional("port"): integer(1, 65535),
    Optional("chroot"): string(),
})
_ZK_TLS = mapping({
    Required("cert"): string(),
    Required("key"): string(),
    Required("ca"): string(),
})
_ZK_AUTH = mapping({
    Optional("scheme"): one_of("digest"),
    Required("username"): string(),
    Required("password"): string(),
})
_ZK_GRANT = mapping({
    Required("scheme"): one_of(*ZK_ACL_SCHEMES),
    Optional("id"): string(),
    Optional("username"): string(),
    Optional("password"): string(),
    Optional("permissions"): list_of(one_of(*ZK_PERMISSIONS), min_items=1),
})
_ZK_ACL = mapping({
    Optional("enabled"): boolean,
    Optional("grants"): list_of(_ZK_GRANT, allow_none=True),
})
_ZK_KEYS: dict[Any, Validator] = {
    Optional("zookeeper-servers"): list_of(_ZK_SERVER, min_items=1),
    Optional("zookeeper-tls"): _ZK_TLS,
    Optional("zookeeper-auth"): _ZK_AUTH,
    Optional("zookeeper-acl"): _ZK_ACL,
}
_LABEL = mapping({
    Required("name"): string(),
    Optional("min-ready"): integer(minimum=-1),
    Optional("max-ready-age"): _seconds,
    Optional("max-age"): _seconds,
})
_WEBAPP = mapping({
    Optional("port"): integer(0, 65535),
    Optional("listen_address"): string(),
    Optional("threads"): integer(1, 256),
    Optional("timeout"): integer(1, 3600),
    Optional("send-timeout"): integer(1, 3600),
    Optional("max-header-size"): integer(1024, 1024 * 1024),
    Optional("max-connections"): integer(16, 65536),
    Optional("allow-origin"): string(),
})
_TRACING = mapping({
    Optional("enabled"): boolean,
    Optional("endpoint"): string(),
    Optional("protocol"): one_of(*TRACING_PROTOCOLS),
    Optional("service-name"): string(),
    Optional("insecure"): boolean,
    Optional("timeout"): number(positive=True, maximum=3600),
})
_TENANT = mapping(
    {Required("tenant-name"): string(),
     **{Optional(k): integer(minimum=0) for k in TENANT_LIMIT_KEYS}},
    # Any other key is a custom resource limit, used as-is.
    extra=integer(minimum=0),
)

# Label keys shared by both drivers; cpu/memory/storage feed quota for every label type.
_LABEL_COMMON: dict[Any, Validator] = {
    Required("name"): string(),
    Optional("cpu"): _cpu,
    Optional("memory"): _mib,
    Optional("storage"): _mib,
    Optional("extra-resources"): _int_map,
    Optional("boot-timeout"): _timeout,
    # Pool-level min-ready: spare ready nodes of this label kept in this very pool.
    Optional("min-ready"): integer(minimum=0),
    Optional("max-age"): _seconds,
}
_BREAKER: dict[Any, Validator] = {
    Optional("breaker-threshold"): integer(minimum=0),
    Optional("breaker-backoff"): _timeout,
    Optional("breaker-backoff-max"): _timeout,
}
# Kubernetes provider: read real capacity from the cluster (off by default).
_CAPACITY = mapping({
    Optional("resource-quota"): string(),
    Optional("nodes"): boolean,
})
_ENV = open_mapping({"name": string()})
_VOLUME = open_mapping({"name": string()})
_MOUNT = open_mapping({"name": string(), "mountPath": string()})


def _requirement_value(value: Any) -> str:
    """Kubernetes wants strings; an unquoted YAML number (`values: [4]`) is taken as one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return str(string()(value))


_TOLERATION = mapping({
    Optional("key"): string(),
    Optional("operator"): one_of(*TOLERATION_OPERATORS),
    Optional("value"): string(allow_empty=True),
    Optional("effect"): one_of(*TAINT_EFFECTS),
    Optional("tolerationSeconds"): integer(),
})
_REQUIREMENT_FIELDS: dict[Any, Validator] = {
    Required("key"): string(),
    Required("operator"): one_of(*REQUIREMENT_OPERATORS),
    Optional("values"): list_of(_requirement_value),
}
_REQUIREMENT = mapping(_REQUIREMENT_FIELDS)
_PREFERRED = mapping({**_REQUIREMENT_FIELDS, Required("weight"): integer(1, 100)})
_SCHEDULING: dict[str, Validator] = {
    "tolerations": list_of(_TOLERATION),
    "node-requirements": list_of(_REQUIREMENT),
    "preferred-node-requirements": list_of(_PREFERRED),
}

_GUARDS: dict[str, Validator] = {
    "pod-security": one_of(*POD_SECURITY_LEVELS),
    "resource-quota": boolean,
    "network-policy": boolean,
    "egress-allow": list_of(string()),
    "allow-external-services": boolean,
    "allow-job-secrets": boolean,
    "object-quota": mapping({Optional(k): integer(minimum=0) for k in OBJECT_QUOTA}),
}
_PULL_SECRET = mapping({
    Required("name"): string(),
    Required("namespace"): string(),
})
_PULL_SECRETS = list_of(_PULL_SECRET)
# Pool and provider keys of the kubernetes driver only.
_KUBERNETES_DEFAULTS: dict[Any, Validator] = {
    Optional("default-label-image-pull-secrets"): _PULL_SECRETS,
    **{Optional(f"default-label-{k}"): v for k, v in _GUARDS.items()},
    **{Optional(f"default-label-{k}"): v for k, v in _SCHEDULING.items()},
    **{Optional(k): boolean for k in PERMISSION_KEYS},
}
_KUBERNETES_PROVIDER_ONLY: dict[Any, Validator] = {
    Optional("capacity"): _CAPACITY,
    Optional("credentials-backoff"): list_of(_seconds, min_items=1),
    Optional("credentials-exec-timeout"): _timeout,
    Optional("api-probe-interval"): _timeout,
    Optional("api-probe-connect-timeout"): _timeout,
    Optional("api-probe-read-timeout"): _timeout,
}

# One schema holds both forms; `checks` enforces that `spec` excludes the form A keys and
# that `type: namespace` labels set no pod-only key, with an error per offending key.
KUBERNETES_LABEL = mapping({
    **_LABEL_COMMON,
    Required("type"): one_of(*LABEL_TYPES),
    Optional("image"): string(),
    Optional("image-pull"): one_of(*IMAGE_PULL_POLICIES),
    Optional("python-path"): string(),
    Optional("shell-type"): string(),
    Optional("cpu-limit"): _cpu,
    Optional("memory-limit"): _mib,
    Optional("storage-limit"): _mib,
    Optional("gpu"): number(positive=True),
    Optional("gpu-resource"): string(),
    Optional("env"): list_of(_ENV),
    Optional("node-selector"): _str_map,
    Optional("privileged"): boolean,
    Optional("scheduler-name"): string(),
    Optional("volumes"): list_of(_VOLUME),
    Optional("volume-mounts"): list_of(_MOUNT),
    Optional("labels"): _str_map,
    Optional("dynamic-labels"): _str_map,
    Optional("annotations"): _str_map,
    Optional("spec"): _any_mapping,
    Optional("image-pull-secrets"): _PULL_SECRETS,
    **{Optional(k): v for k, v in _GUARDS.items()},
    **{Optional(k): v for k, v in _SCHEDULING.items()},
})
FAKE_LABEL = mapping({
    **_LABEL_COMMON,
    Optional("type"): one_of(*LABEL_TYPES),
    Optional("launch-delay"): _seconds,
    Optional("fail"): boolean,
})


def _duration(value: Any) -> Any:
    """Seconds (a number) or a text like "2h"; parsed and range-checked in `checks`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _type_error("seconds or a duration like '2h'", value)
    return value


_MAINTENANCE = mapping({
    Required("schedule"): string(),
    Required("duration"): _duration,
    Optional("action"): one_of(*MAINTENANCE_ACTIONS),
    Optional("timezone"): string(),
})
_DRIFT_BUDGET = mapping({
    Optional("max-nodes"): integer(minimum=0),
    Optional("max-percent"): number(minimum=0, maximum=100),
    Optional("schedule"): string(),
    Optional("duration"): _duration,
    Optional("timezone"): string(),
})


def _budget_nodes(value: Any) -> Any:
    """A node count (`3`) or a share of the pool's nodes (`"20%"`)."""
    wanted = f"expected a node count or a percentage like '20%'; got {_got(value)}"
    if isinstance(value, str):
        try:
            percent = float(value[:-1]) if value.endswith("%") else math.nan
        except ValueError:
            percent = math.nan
        if math.isnan(percent):
            raise Invalid(wanted)
        if not 0 <= percent <= 100:
            raise Invalid(f"a percentage must be between 0% and 100%; got {_got(value)}")
        return value
    return integer(minimum=0)(value)


_DISRUPTION_BUDGET = mapping({
    Required("nodes"): _budget_nodes,
    Optional("reasons"): list_of(one_of(*DISRUPTION_REASONS), min_items=1),
    Optional("schedule"): string(),
    Optional("duration"): _duration,
    Optional("timezone"): string(),
})


def _pool(label: Validator, extra: dict[Any, Validator]) -> Validator:
    return mapping({
        **extra,
        Required("name"): string(),
        Required("labels"): list_of(label),
        Optional("max-servers"): integer(),
        Optional("max-cores"): integer(minimum=0),
        Optional("max-ram"): integer(minimum=0),
        Optional("max-resources"): _int_map,
        Optional("node-attributes"): _any_mapping,
        Optional("priority"): integer(),
        Optional("default-label-cpu"): _cpu,
        Optional("default-label-memory"): _mib,
        Optional("default-label-storage"): _mib,
        Optional("default-label-cpu-limit"): _cpu,
        Optional("default-label-memory-limit"): _mib,
        Optional("default-label-storage-limit"): _mib,
        Optional("default-label-extra-resources"): _int_map,
        Optional("boot-timeout"): _timeout,
        Optional("maintenance"): list_of(_MAINTENANCE, allow_none=True),
        Optional("drift-budget"): _DRIFT_BUDGET,
        Optional("disruption-budgets"): list_of(_DISRUPTION_BUDGET, allow_none=True),
        Optional("surplus-delay"): _seconds,
        Optional("default-label-max-age"): _seconds,
        **_BREAKER,
    })


def _provider(label: Validator, extra: dict[Any, Validator]) -> Validator:
    return mapping({
        **extra,
        Required("name"): string(),
        Required("driver"): one_of(*DRIVERS),
        Optional("max-concurrency"): integer(),
        Optional("priority"): integer(),
        Optional("context"): string(),
        Optional("launch-retries"): integer(minimum=1),
        Optional("hand-back-after"): _seconds,
        Optional("recently-failed-ttl"): _seconds,
        Optional("max-servers"): integer(),
        Optional("max-cores"): integer(minimum=0),
        Optional("max-ram"): integer(minimum=0),
        Optional("max-resources"): _int_map,
        Required("pools"): list_of(_pool(label, {k: v for k, v in extra.items()
                                                 if _key_name(k) not in ("job-role",
                                                                         "capacity")})),
        Optional("boot-timeout"): _timeout,
        Optional("leak-grace"): _seconds,
        Optional("api-retries"): integer(minimum=0),
        Optional("api-backoff"): list_of(_seconds, min_items=1),
        Optional("api-timeout"): _timeout,
        Optional("api-connect-timeout"): _timeout,
        Optional("api-read-timeout"): _timeout,
        Optional("unschedulable-grace"): _seconds,
        Optional("delete-timeout"): _timeout,
        Optional("terminating-grace"): _seconds,
        Optional("max-pod-grace"): integer(minimum=0, maximum=MAX_SECONDS),
        Optional("token-lifetime"): _token_lifetime,
        **_BREAKER,
    })


_PROVIDERS = {
    "kubernetes": _provider(KUBERNETES_LABEL, {**_KUBERNETES_DEFAULTS,
                                               **_KUBERNETES_PROVIDER_ONLY,
                                               Optional("job-role"): one_of(*JOB_ROLE_MODES)}),
    "fake": _provider(FAKE_LABEL, {}),
}


def provider(value: Any) -> dict[str, Any]:
    """Dispatch on `driver`: each driver has its own label schema."""
    if not isinstance(value, dict):
        raise _type_error("mapping", value)
    driver = value.get("driver")
    if "driver" not in value:
        errors = [Invalid("required key is missing", path=["driver"])]
        if "name" not in value:
            errors.insert(0, Invalid("required key is missing", path=["name"]))
        raise MultipleInvalid(errors)
    if driver not in _PROVIDERS:
        raise Invalid(f"expected one of {', '.join(DRIVERS)}; got {_got(driver)}",
                      path=["driver"])
    result: dict[str, Any] = _PROVIDERS[driver](value)
    return result


def _installation_id(value: Any) -> str:
    text = str(string()(value))
    if len(text) > INSTALLATION_ID_MAX or not INSTALLATION_ID_RE.match(text):
        raise Invalid(f"{_got(text)} must be a Kubernetes label value: at most"
                      f" {INSTALLATION_ID_MAX} characters of [A-Za-z0-9_.-], starting and"
                      " ending with a letter or digit")
    return text


MAIN = mapping({
    Required("zookeeper-servers"): list_of(_ZK_SERVER, min_items=1),
    Optional("installation-id"): _installation_id,
    Optional("installation-id-file"): string(),
    Optional("zookeeper-tls"): _ZK_TLS,
    Optional("zookeeper-auth"): _ZK_AUTH,
    Optional("zookeeper-acl"): _ZK_ACL,
    Optional("zookeeper-timeout"): number(positive=True, maximum=MAX_ZK_TIMEOUT),
    Optional("labels"): list_of(_LABEL, allow_none=True),
    Optional("providers"): list_of(provider, allow_none=True),
    Optional("max-hold-age"): _seconds,
    Optional("webapp"): _WEBAPP,
    Optional("tracing"): _TRACING,
    Optional("tenant-resource-limits"): list_of(_TENANT, allow_none=True),
    **{Optional(k): anything for k in BUILDER_KEYS},
})
SECURE = mapping(
    {**_ZK_KEYS, **{Optional(k): anything for k in SECURE_IGNORED_KEYS}},
    unknown_hint="the secure file may only set " + ", ".join(SECURE_KEYS[:-1])
    + " and " + SECURE_KEYS[-1],
)


def _run(schema: Validator, data: Any) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(data, dict):
        return {}, [f"expected a mapping at the top of the file, got {type(data).__name__}"]
    try:
        return schema(data), []
    except MultipleInvalid as exc:
        return {}, format_errors(exc.errors)
    except Invalid as exc:
        return {}, format_errors([exc])


def validate(data: Any) -> tuple[dict[str, Any], list[str]]:
    """Check a parsed main file (secure keys already merged in).

    Returns the normalised data (numbers as float where the schema says number, unknown
    builder keys kept) and the problems; the data is only meaningful when there are none.
    """
    return _run(MAIN, data)


def validate_secure(data: Any) -> tuple[dict[str, Any], list[str]]:
    """Check a parsed secure file; same contract as `validate`."""
    return _run(SECURE, data)
