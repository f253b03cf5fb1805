"""Semantic checks: the rules a schema cannot express, found at validation time, not at 3 a.m.

Owns: cross-field and cross-section rules (names that must exist or be unique, form A/form B
exclusivity, limits versus requests after defaults, Kubernetes name syntax, `dynamic-labels`
templates, ZooKeeper chroot and TLS files) and the warnings (valid but probably unintended).

How it fails: `check(data)` never raises; it returns `(errors, warnings)`, each a list of
`place: message` lines. Input must already have passed `schema.validate`.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
import string
from typing import Any, Iterable, Mapping

from nodepool_k8s.config import build, cron
from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import PoolConfig, PoolLabel
from nodepool_k8s.config.schema import format_path
from nodepool_k8s.runtime import tracing

Raw = Mapping[str, Any]
Path = tuple[Any, ...]

MAX_POOL_NAME = 40  # "<pool>-<10-digit node id>" must fit a 63-character namespace name
# Anchored with \Z, not $: $ also matches before a trailing newline ("pod\n").
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_LABEL_VALUE_RULE = ("at most 63 letters, digits, '-', '_' or '.', starting and ending with a"
                     " letter or digit")
_CHROOT = re.compile(r"^(/[^/\s]+)+\Z")
_FIELD_NAME = re.compile(r"^([^.\[]*)((?:\.[^.\[]+|\[[^\]]+\])*)$")
_ACCESSOR = re.compile(r"\.([^.\[]+)|\[([^\]]+)\]")

# Labels the driver sets on every namespace and pod (its ownership labels,
# `driver.kubernetes.manifests.ownership_labels`); a label config must not set them: they
# would be overridden anyway, and a configuration that seems to set them is misleading.
RESERVED_LABELS = ("nodepool_node_id", "nodepool_provider_name", "nodepool_installation_id",
                   "nodepool_pool_name", "nodepool_node_label")
REQUEST_FIELDS = ("id", "labels", "requestor", "requestor_data", "relative_priority",
                  "event_id", "created_time", "tenant_name")
# What a verbatim-spec (form B) label may carry besides the spec.
FORM_B_KEYS = frozenset({"name", "type", "spec", "labels", "dynamic-labels", "annotations",
                         "boot-timeout", "image-pull-secrets", *S.GUARD_KEYS})
PULL_SECRETS_KEY = "image-pull-secrets"
PULL_SECRETS_DEFAULT = "default-label-image-pull-secrets"
# Namespace label prefix the driver manages through `pod-security`.
POD_SECURITY_PREFIX = "pod-security.kubernetes.io/"
# Keys that only make sense for a pod nodepool_k8s builds itself.
POD_ONLY_KEYS = ("image", "image-pull", "cpu-limit", "memory-limit", "storage-limit", "gpu",
                 "gpu-resource", "env", "node-selector", "privileged", "scheduler-name",
                 "volumes", "volume-mounts", *S.SCHEDULING_KEYS)
# What `annotations` may take of Kubernetes' limit on one object's annotations; the rest is
# for nodepool_config_hash (20 + 16 bytes) on the namespace.
ANNOTATION_ROOM = 64
MAX_ANNOTATIONS = S.K8S_ANNOTATIONS_MAX - ANNOTATION_ROOM
# Kubernetes' strict environment variable name (relaxed to any printable ASCII but '=' in 1.32).
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_INT64 = re.compile(r"^[+-]?[0-9]+\Z")


class _Report:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, path: Path, message: str) -> None:
        self.errors.append(f"{format_path(path)}: {message}")

    def warn(self, path: Path, message: str) -> None:
        self.warnings.append(f"{format_path(path)}: warning: {message}")


def check(data: Raw, skip: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """All semantic problems of a schema-valid main file.

    `skip` names top-level keys that came from the secure file and were checked there.
    """
    report = _Report()
    _zookeeper(data, report, skip=set(skip))
    _zookeeper_access(data, report, skip=set(skip))
    _unique(report, ("labels",), data.get("labels", []), "name", "label")
    _unique(report, ("tenant-resource-limits",), data.get("tenant-resource-limits", []),
            "tenant-name", "tenant")
    for index, tenant in enumerate(data.get("tenant-resource-limits", [])):
        _tenant(tenant, ("tenant-resource-limits", index), report)
    top_labels = {label["name"] for label in data.get("labels", [])}
    providers = data.get("providers", [])
    _unique(report, ("providers",), providers, "name", "provider")
    for index, provider in enumerate(providers):
        _provider(provider, ("providers", index), top_labels, report)
    _min_ready(data, report)
    _tracing(data.get("tracing") or {}, report)
    return report.errors, report.warnings


def check_secure(data: Raw) -> tuple[list[str], list[str]]:
    """Semantic problems of a schema-valid secure file (its ZooKeeper settings)."""
    report = _Report()
    _zookeeper(data, report, skip=set())
    return report.errors, report.warnings


def _unique(report: _Report, path: Path, items: list[Raw], key: str, what: str) -> None:
    first: dict[Any, int] = {}
    for index, item in enumerate(items):
        name = item.get(key)
        if name in first:
            report.error(path + (index, key),
                         f"duplicate {what} name {name!r} (also at {format_path(path)}"
                         f"[{first[name]}])")
        else:
            first[name] = index


# -- zookeeper -----------------------------------------------------------------------------------


def _zookeeper(data: Raw, report: _Report, skip: set[str]) -> None:
    if "zookeeper-servers" in data and "zookeeper-servers" not in skip:
        servers = data["zookeeper-servers"]
        seen: dict[tuple[str, int], int] = {}
        for index, server in enumerate(servers):
            path: Path = ("zookeeper-servers", index)
            host = server["host"]
            if "[" in host or "]" in host or "/" in host or host.count(":") == 1:
                report.error(path + ("host",), f"{host!r} must be a bare host name or address;"
                             " give the port in `port` and the chroot in `chroot`")
            elif ":" not in host and (len(host) > 253 or any(
                    len(label) > 63 for label in host.rstrip(".").split("."))):
                # The resolver refuses such a name on every connection attempt, with a
                # traceback each time, long after the configuration was accepted.
                report.error(path + ("host",), f"{host[:80]!r} is not a usable host name:"
                             " each dot-separated part may have at most 63 characters, the"
                             " whole name 253")
            chroot = server.get("chroot")
            if chroot is not None and not _CHROOT.match(chroot):
                report.error(path + ("chroot",), f"{chroot!r} must be an absolute znode path"
                             " like /nodepool (leading /, no trailing /)")
            endpoint = (host, server.get("port", S.ZK_PORT))
            if endpoint in seen:
                report.warn(path, f"same server as zookeeper-servers[{seen[endpoint]}]")
            seen.setdefault(endpoint, index)
        chroots = sorted({s.get("chroot") or "" for s in servers})
        if len(chroots) > 1:
            shown = ", ".join(repr(c) if c else "none" for c in chroots)
            report.error(("zookeeper-servers",), "all servers must name the same chroot (one"
                         f" chroot applies to the whole ensemble); found {shown}")
    tls = data.get("zookeeper-tls")
    if tls and "zookeeper-tls" not in skip:
        for key in ("cert", "key", "ca"):
            try:
                with open(tls[key], "rb"):
                    pass
            except OSError as exc:
                report.error(("zookeeper-tls", key),
                             f"cannot read {tls[key]!r}: {exc.strerror or exc}")
    acl = data.get("zookeeper-acl")
    if acl and "zookeeper-acl" not in skip:
        for index, grant in enumerate(acl.get("grants") or ()):
            _zk_grant(grant, ("zookeeper-acl", "grants", index), report)


def _tracing(section: Raw, report: _Report) -> None:
    protocol = section.get("protocol", S.TRACING_PROTOCOL)
    endpoint = section.get("endpoint")
    enabled = section.get("enabled", S.TRACING_ENABLED)
    if endpoint is not None:
        scheme = endpoint.split("://", 1)[0].lower() if "://" in endpoint else ""
        if protocol == "http/protobuf" and scheme not in ("http", "https"):
            report.error(("tracing", "endpoint"), f"{endpoint!r} must be a URL starting with"
                         " https:// (or http:// with insecure: true), such as"
                         " https://collector:4318/v1/traces")
        elif protocol == "grpc" and scheme not in ("", "http", "https"):
            report.error(("tracing", "endpoint"), f"{endpoint!r} must be host:port or a URL"
                         " starting with https:// (or http:// with insecure: true)")
        elif scheme == "http" and not section.get("insecure", S.TRACING_INSECURE):
            # Spans name requests, requestors and nodes: clear text only when asked for.
            report.error(("tracing", "endpoint"), f"{endpoint!r} sends spans in clear text:"
                         " use https://, or set insecure: true to allow it")
    if not enabled:
        return
    if endpoint is None:
        report.error(("tracing", "endpoint"), "required when tracing is enabled")
    missing = tracing.missing_packages(protocol)
    if missing:
        report.error(("tracing", "enabled"), tracing.unavailable_message(missing))


def _zk_grant(grant: Raw, path: Path, report: _Report) -> None:
    has_id = "id" in grant
    has_login = "username" in grant or "password" in grant
    if grant["scheme"] == "digest":
        if has_id == has_login:
            report.error(path, "a digest grant needs either `id` (user:base64-sha1, as"
                         " ZooKeeper's DigestAuthenticationProvider prints it) or"
                         " `username` and `password`, not both")
        elif has_login and not ("username" in grant and "password" in grant):
            report.error(path, "a digest grant needs both `username` and `password`")
        elif has_id and ":" not in grant["id"]:
            report.error(path + ("id",), f"{grant['id']!r} is not a digest id: expected"
                         " <user>:<base64 of SHA-1 of user:password>")
    elif has_login:
        report.error(path, f"`username`/`password` are for digest grants only; a"
                     f" {grant['scheme']} grant names its `id`")
    elif not has_id:
        report.error(path + ("id",), f"required for a {grant['scheme']} grant"
                     + (" (the certificate subject DN, e.g. CN=zuul,O=Example)"
                        if grant["scheme"] == "x509" else ""))


def _zookeeper_access(data: Raw, report: _Report, skip: set[str]) -> None:
    """Cross-key checks of the merged settings (`zookeeper-*` may come from either file)."""
    acl = data.get("zookeeper-acl")
    if acl is not None and acl.get("enabled", True) and not data.get("zookeeper-auth") \
            and not data.get("zookeeper-tls"):
        report.error(("zookeeper-acl",), "an ACL needs an identity for the launcher: set"
                     " zookeeper-auth (digest credentials) or zookeeper-tls (client"
                     " certificate, with ZooKeeper's x509 authentication provider)")
    if data.get("zookeeper-auth") and "zookeeper-auth" not in skip:
        report.warn(("zookeeper-auth",), "holds a password: keep it in the secure file"
                    " (-s), which only the launcher can read")
    if data.get("zookeeper-auth") and not data.get("zookeeper-tls"):
        # Digest authentication sends user and password in each session's first packets.
        report.warn(("zookeeper-auth",), "digest credentials without zookeeper-tls travel"
                    " in clear text to ZooKeeper, for anyone on the network path to read;"
                    " set zookeeper-tls (doc/security.md, ZooKeeper access control)")
    if (acl is None or not acl.get("enabled", True)) and any(
            p.get("driver") == "kubernetes" for p in data.get("providers") or []):
        report.warn(("zookeeper-acl",), "off: node records of kubernetes providers hold"
                    " their namespace's service-account token, and with ZooKeeper's open ACL"
                    " any client that reaches ZooKeeper (a CI job, unless a NetworkPolicy"
                    " keeps it out) can read every token and write records; set"
                    " zookeeper-acl (doc/security.md, ZooKeeper access control)")


# -- tenants, top-level labels -------------------------------------------------------------------


def _tenant(tenant: Raw, path: Path, report: _Report) -> None:
    known = ["tenant-name", *S.TENANT_LIMIT_KEYS]
    for key in tenant:
        if key in known or not str(key).startswith("max-"):
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        report.warn(path + (key,), f"not a known limit, so it limits a custom resource named"
                    f" {key!r}{hint}")


def _min_ready(data: Raw, report: _Report) -> None:
    serving: set[str] = set()
    for provider in data.get("providers", []):
        for pool in provider["pools"]:
            if build.pool_disabled(pool, provider):
                continue
            serving.update(label["name"] for label in pool["labels"])
    for index, label in enumerate(data.get("labels", [])):
        if label.get("min-ready", 0) > 0 and label["name"] not in serving:
            report.warn(("labels", index, "min-ready"),
                        f"{label['min-ready']} ready nodes wanted, but no enabled pool serves"
                        f" label {label['name']!r}")


# -- providers and pools -------------------------------------------------------------------------


def _provider(provider: Raw, path: Path, top_labels: set[str], report: _Report) -> None:
    driver = provider["driver"]
    if driver == "kubernetes" and not _is_label_value(provider["name"]):
        # Stored sanitised in nodepool_provider_name; two providers whose names sanitise
        # alike could then take each other's namespaces for their own leaks.
        report.warn(path + ("name",), f"{provider['name']!r} is not a valid Kubernetes label"
                    f" value ({_LABEL_VALUE_RULE}), so nodepool_provider_name holds an altered"
                    " form")
    if provider.get("max-servers") is not None and provider["max-servers"] <= 0:
        report.warn(path + ("max-servers",), "0 or less disables every pool that does not set"
                    " its own max-servers")
    if driver == "kubernetes":
        _scheduling_defaults(provider, path, report)
        _pull_secrets(provider.get(PULL_SECRETS_DEFAULT) or [], path + (PULL_SECRETS_DEFAULT,),
                      report)
    if not provider["pools"]:
        report.warn(path + ("pools",), "the provider has no pools, so it serves nothing")
    _unique(report, path + ("pools",), provider["pools"], "name", "pool")
    for index, pool in enumerate(provider["pools"]):
        _pool(pool, provider, path + ("pools", index), top_labels, report)


def _pool(pool: Raw, provider: Raw, path: Path, top_labels: set[str], report: _Report) -> None:
    name = pool["name"]
    if not _DNS_LABEL.match(name) or len(name) > MAX_POOL_NAME:
        report.error(path + ("name",), f"{name!r} must be a lowercase DNS-1123 label of at most"
                     f" {MAX_POOL_NAME} characters (letters, digits and '-', starting and"
                     " ending with a letter or digit): namespaces are named <pool>-<node id>")
    if "node-attributes" in pool:
        try:
            json.dumps(pool["node-attributes"])
        except (TypeError, ValueError) as exc:
            report.error(path + ("node-attributes",), f"must be plain JSON data (it is stored"
                         f" on every node in ZooKeeper): {exc}")
    for resource, (_, default_key) in build.LIMITS.items():
        request, limit = pool.get(build.REQUESTS[resource]), pool.get(default_key)
        if request is not None and limit is not None and limit < request:
            report.error(path + (default_key,), f"{limit:g} is below"
                         f" {build.REQUESTS[resource]} {request:g}")
    if provider["driver"] == "kubernetes":
        _scheduling_defaults(pool, path, report)
        _pull_secrets(pool.get(PULL_SECRETS_DEFAULT) or [], path + (PULL_SECRETS_DEFAULT,),
                      report)
    before = len(report.errors)
    for index, window in enumerate(pool.get("maintenance") or []):
        _window(window, path + ("maintenance", index), report)
    if "drift-budget" in pool:
        _drift_budget(pool["drift-budget"], path + ("drift-budget",), report)
    for index, budget in enumerate(pool.get("disruption-budgets") or []):
        _drift_budget(budget, path + ("disruption-budgets", index), report)
    if not pool["labels"]:
        report.warn(path + ("labels",), "the pool has no labels, so it serves nothing")
    _unique(report, path + ("labels",), pool["labels"], "name", "label")
    if len(report.errors) > before:
        return  # build_pool below needs the windows and budget to parse
    built = build.build_pool(pool, provider)
    for index, label in enumerate(pool["labels"]):
        label_path = path + ("labels", index)
        if label["name"] not in top_labels:
            report.error(label_path + ("name",), f"label {label['name']!r} is not defined in"
                         " the top-level labels")
        if provider["driver"] == "kubernetes":
            _kubernetes_label(label, pool, label_path, report)
            _guards(label, pool, provider, label_path, path, report)
        if not built.disabled:
            _fits(build.build_label(label, pool, provider), built, provider, label_path, report)


def _fits(label: PoolLabel, pool: PoolConfig, provider: Raw, path: Path,
          report: _Report) -> None:
    """Warn when a single node of the label can never fit the pool's or provider's limits."""
    need = label.quota()
    for what, limits in (("pool", pool.limits()),
                         ("provider", build.build_provider({**provider, "pools": []}).limits())):
        over = need.exceeded_keys(limits)
        if over:
            shown = ", ".join(f"{k} {need[k]:g} > {limits[k]:g}" for k in over)
            report.warn(path, f"one node needs more than the {what} allows ({shown}), so this"
                        " label can never be launched there")
            return  # the pool's limits default to the provider's: say it once


# -- kubernetes labels ---------------------------------------------------------------------------


def _kubernetes_label(label: Raw, pool: Raw, path: Path, report: _Report) -> None:
    name, kind, form_b = label["name"], label["type"], "spec" in label
    if kind == "pod" and not (_DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        report.error(path + ("name",), f"{name!r} names the pod, so it must be a lowercase"
                     " DNS-1123 subdomain (letters, digits, '-' and '.', starting and ending"
                     " with a letter or digit)")
    elif not _is_label_value(name):
        # The driver stores a sanitised form, so this works, but selectors on the label
        # value (kubectl get ns -l nodepool_node_label=...) will not match the name.
        report.warn(path + ("name",), f"{name!r} is not a valid Kubernetes label value ("
                    f"{_LABEL_VALUE_RULE}), so nodepool_node_label holds an altered form")
    if form_b:
        if kind != "pod":
            report.error(path + ("type",), "must be pod when spec is given")
        for key in label:
            if key not in FORM_B_KEYS:
                report.error(path + (key,), "cannot be combined with spec (a spec is used"
                             " verbatim; put the setting into the spec instead)")
        _spec(label["spec"], path + ("spec",), report)
    elif kind == "namespace":
        for key in POD_ONLY_KEYS:
            if key in label:
                report.error(path + (key,), "only applies to type: pod labels")
    else:
        if "image" not in label:
            report.error(path + ("image",), "required for type: pod labels without spec")
        _limits(label, pool, path, report)
        _volumes(label, path, report)
        _pod_fields(label, path, report)
        for index, entry in enumerate(label.get("env", [])):
            if "value" in entry and "valueFrom" in entry:
                report.error(path + ("env", index), "set value or valueFrom, not both")
            if "value" in entry and not isinstance(entry["value"], str):
                report.error(path + ("env", index, "value"), f"expected str, got"
                             f" {entry['value']!r} (quote it in YAML)")
    if ("gpu" in label) != ("gpu-resource" in label) and kind == "pod" and not form_b:
        missing = "gpu-resource" if "gpu" in label else "gpu"
        report.error(path + (missing,), "gpu and gpu-resource must be given together")
    if "gpu-resource" in label and not _is_extended_resource(label["gpu-resource"]):
        report.error(path + ("gpu-resource",), f"{label['gpu-resource']!r} is not a valid"
                     " extended resource name (<domain>/<name>, e.g. nvidia.com/gpu; not"
                     " in kubernetes.io)")
    if "gpu" in label and not float(label["gpu"]).is_integer():
        # Kubernetes counts extended resources in whole units ("must be an integer").
        report.error(path + ("gpu",), f"{label['gpu']:g} must be a whole number: Kubernetes"
                     " refuses fractions of an extended resource such as a GPU")
    for key in S.SCHEDULING_KEYS:
        _scheduling(key, label.get(key) or [], path + (key,), report)
    if PULL_SECRETS_KEY in label:
        if kind == "namespace":
            report.error(path + (PULL_SECRETS_KEY,), "not allowed on type: namespace labels:"
                         " their job creates pods, and a pod may mount any Secret of its"
                         " namespace (with allow-job-secrets its role reads them directly),"
                         " so the copy would hand the registry credential to the job; use a"
                         " pod label (its job can create no pods)")
        else:
            _pull_secrets(label[PULL_SECRETS_KEY], path + (PULL_SECRETS_KEY,), report)
    _metadata(label, path, report)


def _pull_secrets(items: list[Raw], path: Path, report: _Report) -> None:
    """`image-pull-secrets` entries: Kubernetes names, each Secret name once (the copies
    share the node's namespace), a small number of them."""
    if len(items) > S.MAX_IMAGE_PULL_SECRETS:
        report.error(path, f"{len(items)} entries; at most {S.MAX_IMAGE_PULL_SECRETS} (each"
                     " is read and copied at every launch)")
    seen: dict[str, int] = {}
    for index, item in enumerate(items):
        name, namespace = item["name"], item["namespace"]
        if not (len(name) <= 253 and _DNS_SUBDOMAIN.match(name)):
            report.error(path + (index, "name"), f"{name!r} is not a Secret name: a lowercase"
                         " DNS-1123 subdomain (letters, digits, '-' and '.', starting and"
                         " ending with a letter or digit, at most 253 characters)")
        elif name in seen:
            report.error(path + (index, "name"), f"duplicate Secret name {name!r} (also at"
                         f" {format_path(path + (seen[name],))}): the copies share the node's"
                         " namespace")
        seen.setdefault(name, index)
        if not (len(namespace) <= 63 and _DNS_LABEL.match(namespace)):
            report.error(path + (index, "namespace"), f"{namespace!r} is not a namespace"
                         " name: a lowercase DNS-1123 label (letters, digits and '-',"
                         " starting and ending with a letter or digit, at most 63"
                         " characters)")


def _secret_references(value: Any) -> set[str]:
    """The Secret names a pod spec (or a label's volumes and env) refers to: secret
    volumes, projected secret sources, env secretKeyRef and envFrom secretRef."""
    found: set[str] = set()
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "secretName" and isinstance(item, str):
                found.add(item)
            elif key in ("secret", "secretKeyRef", "secretRef") and isinstance(item, Mapping) \
                    and isinstance(item.get("name"), str):
                found.add(item["name"])
            found |= _secret_references(item)
    elif isinstance(value, list):
        for item in value:
            found |= _secret_references(item)
    return found


def _window(window: Raw, path: Path, report: _Report) -> None:
    """A maintenance window (or a drift budget's window): cron, duration, time zone."""
    timezone = window.get("timezone", S.TIMEZONE)
    try:
        cron.zone(timezone)
    except ValueError as exc:
        report.error(path + ("timezone",), str(exc))
        timezone = S.TIMEZONE
    if "schedule" in window:
        try:
            cron.Cron.parse(window["schedule"], timezone)
        except ValueError as exc:
            report.error(path + ("schedule",), f"not a 5-field cron schedule: {exc}")
    if "duration" in window:
        try:
            cron.parse_duration(window["duration"])
        except ValueError as exc:
            report.error(path + ("duration",), str(exc))


def _drift_budget(budget: Raw, path: Path, report: _Report) -> None:
    """A drift budget or a disruption budget: a window needs both of its keys."""
    if ("schedule" in budget) != ("duration" in budget):
        missing = "duration" if "schedule" in budget else "schedule"
        report.error(path + (missing,), "schedule and duration must be given together")
    _window(budget, path, report)


def _scheduling_defaults(section: Raw, path: Path, report: _Report) -> None:
    """`default-label-tolerations` etc. of a pool or provider, checked where they are."""
    for key in S.SCHEDULING_KEYS:
        default_key = f"default-label-{key}"
        _scheduling(key, section.get(default_key) or [], path + (default_key,), report)


def _scheduling(key: str, items: list[Raw], path: Path, report: _Report) -> None:
    check_item = _toleration if key == "tolerations" else _requirement
    for index, item in enumerate(items):
        check_item(item, path + (index,), report)


def _requirement(item: Raw, path: Path, report: _Report) -> None:
    """A node selector requirement as the API server validates one."""
    operator, values = item["operator"], item.get("values") or []
    if not _is_qualified_name(item["key"]):
        report.error(path + ("key",), f"{item['key']!r} is not a valid node label key"
                     " ([prefix/]name, name at most 63 letters, digits, '-', '_' or '.')")
    if operator in ("In", "NotIn") and not values:
        report.error(path + ("values",), f"operator {operator} needs at least one value")
    elif operator in ("Exists", "DoesNotExist") and values:
        report.error(path + ("values",), f"operator {operator} takes no values")
    elif operator in ("Gt", "Lt"):
        if len(values) != 1:
            report.error(path + ("values",), f"operator {operator} takes exactly one value"
                         f" (an integer), got {len(values)}")
        elif not _INT64.match(str(values[0])) or not -2**63 <= int(values[0]) < 2**63:
            report.error(path + ("values", 0), f"operator {operator} compares integers;"
                         f" {values[0]!r} is not one")


def _toleration(item: Raw, path: Path, report: _Report) -> None:
    """A toleration as the API server validates one."""
    key, operator = item.get("key"), item.get("operator", "Equal")
    if key is not None and not _is_qualified_name(key):
        report.error(path + ("key",), f"{key!r} is not a valid taint key ([prefix/]name,"
                     " name at most 63 letters, digits, '-', '_' or '.')")
    if key is None and operator != "Exists":
        report.error(path + ("operator",), "must be Exists when no key is given (an empty"
                     " key with Exists tolerates every taint)")
    if operator == "Exists" and item.get("value"):
        report.error(path + ("value",), "must be empty when operator is Exists")
    if operator == "Equal" and not _is_label_value(item.get("value", "")):
        report.error(path + ("value",), f"{item.get('value')!r} is not a valid taint value"
                     f" ({_LABEL_VALUE_RULE})")
    if "tolerationSeconds" in item and item.get("effect") != "NoExecute":
        report.error(path + ("tolerationSeconds",), "only applies to effect: NoExecute (set"
                     " effect: NoExecute or leave tolerationSeconds out)")


def _guards(label: Raw, pool: Raw, provider: Raw, path: Path, pool_path: Path,
            report: _Report) -> None:
    """Dangerous pod settings need a permission; the Pod Security level must allow them."""
    provider_path = pool_path[:2]
    for where, what, key, _ in build.dangerous_settings(label):
        if not build.permitted(pool, provider, key):
            report.error(path + where, f"{what} is not allowed here: set `{key}: true` on the"
                         f" pool ({format_path(pool_path)}) or the provider"
                         f" ({format_path(provider_path)}) to allow it")
    level = label.get("pod-security")
    if level is not None and level != "privileged" and build.needs_privileged(label):
        needing = ", ".join(what for _, what, _, privileged in build.dangerous_settings(label)
                            if privileged)
        report.error(path + ("pod-security",), f"{level} forbids {needing}; set pod-security:"
                     " privileged (or leave it out: such labels get privileged)")
    if (build.pod_security(label, pool, provider) == "restricted" and label["type"] == "pod"
            and "spec" not in label):
        report.error(path + ("pod-security",), "restricted: the pod nodepool_k8s builds"
                     " (image/command) does not set runAsNonRoot, seccompProfile and the"
                     " capability drops restricted requires; use baseline, or a verbatim"
                     " spec that sets them")
    allowed, origin = build.resolve_guard(label, pool, provider, "egress-allow")
    cidr_path = path + ("egress-allow",) if origin == "label" else (
        pool_path + ("default-label-egress-allow",) if origin == "pool"
        else provider_path + ("default-label-egress-allow",))
    for index, cidr in enumerate(allowed or []):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            report.error(cidr_path + (index,), f"{cidr!r} is not a CIDR (like 10.0.0.0/8)")
    policy, _ = build.resolve_guard(label, pool, provider, "network-policy")
    if origin == "label" and not policy:
        report.warn(path + ("egress-allow",), "has no effect without network-policy: true")
    if label["type"] == "pod" and build.object_quota(label, pool, provider)["pods"] < 1:
        # The quota counts the label's own pod: every launch would fail "exceeded quota".
        where = next((place + (key, "pods") for place, key, section in (
            (path, "object-quota", label), (pool_path, "default-label-object-quota", pool),
            (provider_path, "default-label-object-quota", provider))
            if (section.get(key) or {}).get("pods") is not None), path)
        message = "a pod label needs room for its own pod: at least 1"
        if f"{format_path(where)}: {message}" not in report.errors:  # once per default
            report.error(where, message)
    pulls = build.image_pull_secrets(label, pool, provider)
    if pulls:
        # Object counts are enforced whatever `resource-quota` says (guards.quota_hard).
        room = build.object_quota(label, pool, provider)["secrets"]
        if room < len(pulls):
            report.error(path, f"{len(pulls)} image pull Secrets are copied into each node's"
                         f" namespace, but its ResourceQuota allows {room} secrets: raise"
                         " object-quota.secrets")
        mounted = sorted(_secret_references([label.get("volumes"), label.get("env"),
                                             label.get("spec")])
                         & {pull.name for pull in pulls})
        if mounted:
            report.error(path, f"the pod mounts or reads the image pull Secret"
                         f" {', '.join(map(repr, mounted))}: its job could read the registry"
                         " credential through the pod; pull Secrets are for the kubelet only")
    for section in ("labels", "dynamic-labels"):
        for key in label.get(section, {}):
            if str(key).startswith(POD_SECURITY_PREFIX):
                report.error(path + (section, key), "set by nodepool_k8s from pod-security;"
                             " use that key instead")


def _limits(label: Raw, pool: Raw, path: Path, report: _Report) -> None:
    for resource, (limit_key, _) in build.LIMITS.items():
        request, request_origin = build.resolve_request(label, pool, resource)
        limit, limit_origin = build.resolve_limit(label, pool, resource)
        # Both from pool defaults: already reported once for the pool.
        from_label = resource in label or limit_key in label
        if request is None or limit is None or limit >= request or not from_label:
            continue
        report.error(path + (limit_key,), f"{limit:g} (from {limit_origin}) is below the"
                     f" {resource} request {request:g} (from {request_origin})")


def _volumes(label: Raw, path: Path, report: _Report) -> None:
    """Volumes and mounts as the API server validates them (names, one source, unique)."""
    volumes: dict[str, int] = {}
    for index, volume in enumerate(label.get("volumes", [])):
        where, name = path + ("volumes", index), volume["name"]
        if not (len(name) <= 63 and _DNS_LABEL.match(name)):
            report.error(where + ("name",), f"{name!r} must be a lowercase DNS-1123 label of at"
                         " most 63 characters (letters, digits and '-', starting and ending"
                         " with a letter or digit)")
        elif name in volumes:
            report.error(where + ("name",), f"duplicate volume name {name!r} (also at"
                         f" {format_path(path + ('volumes', volumes[name]))})")
        volumes.setdefault(name, index)
        sources = [key for key in volume if key != "name"]
        if len(sources) != 1:
            report.error(where, "needs exactly one volume source (emptyDir, configMap, secret,"
                         f" ...), got {len(sources)}" + (f": {', '.join(sources)}"
                                                         if sources else ""))
    paths: dict[str, int] = {}
    for index, mount in enumerate(label.get("volume-mounts", [])):
        if mount["name"] not in volumes:
            report.error(path + ("volume-mounts", index, "name"), f"no volume named"
                         f" {mount['name']!r} in this label's volumes")
        if mount["mountPath"] in paths:
            report.error(path + ("volume-mounts", index, "mountPath"), f"duplicate mountPath"
                         f" {mount['mountPath']!r} (also at"
                         f" {format_path(path + ('volume-mounts', paths[mount['mountPath']]))})")
        paths.setdefault(mount["mountPath"], index)


def _pod_fields(label: Raw, path: Path, report: _Report) -> None:
    """Pod fields of a form A label the API server would refuse (every launch: 422)."""
    image = label.get("image")
    if isinstance(image, str) and image != image.strip():
        report.error(path + ("image",), f"{image!r} must not have leading or trailing"
                     " whitespace")
    scheduler = label.get("scheduler-name")
    if scheduler is not None and not (len(scheduler) <= 253
                                      and _DNS_SUBDOMAIN.match(scheduler)):
        report.error(path + ("scheduler-name",), f"{scheduler!r} must be a lowercase DNS-1123"
                     " subdomain (letters, digits, '-' and '.', starting and ending with a"
                     " letter or digit), like default-scheduler")
    for index, entry in enumerate(label.get("env", [])):
        name = entry["name"]
        if "=" in name or not all(" " <= char <= "~" for char in name):
            report.error(path + ("env", index, "name"), f"{name!r} is not a valid environment"
                         " variable name (printable ASCII characters other than '=')")
        elif not _ENV_NAME.match(name):
            report.warn(path + ("env", index, "name"), f"{name!r}: Kubernetes before 1.32"
                        " refuses environment variable names other than letters, digits,"
                        " '-', '_' and '.' not starting with a digit")


def _spec(spec: Raw, path: Path, report: _Report) -> None:
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        report.error(path + ("containers",), "a pod spec needs a non-empty containers list")
        return
    names: set[str] = set()
    for section in ("containers", "initContainers"):
        items = spec.get(section) if section == "initContainers" else containers
        for index, container in enumerate(items if isinstance(items, list) else []):
            where = path + (section, index)
            if not isinstance(container, dict) or not container.get("name"):
                report.error(where, "each container needs a name")
                continue
            # The spec is sent as written: what the API server checks of every pod fails
            # every launch, so it is checked here.
            name, image = container["name"], container.get("image")
            if not (isinstance(name, str) and len(name) <= 63 and _DNS_LABEL.match(name)):
                report.error(where + ("name",), f"{name!r} must be a lowercase DNS-1123 label"
                             " of at most 63 characters")
            elif name in names:
                report.error(where + ("name",), f"duplicate container name {name!r}")
            names.add(str(name))
            if not isinstance(image, str) or not image.strip() or image != image.strip():
                report.error(where + ("image",), "each container needs an image (a string"
                             " without leading or trailing whitespace)")


def _metadata(label: Raw, path: Path, report: _Report) -> None:
    static = label.get("labels", {})
    size = sum(len(str(k).encode()) + len(str(v).encode())
               for k, v in label.get("annotations", {}).items())
    if size > MAX_ANNOTATIONS:
        report.error(path + ("annotations",), f"{size} bytes of keys and values; Kubernetes"
                     f" allows {S.K8S_ANNOTATIONS_MAX} per object, {ANNOTATION_ROOM} of them"
                     " kept for nodepool_k8s' own annotation")
    for section in ("labels", "dynamic-labels", "annotations", "node-selector"):
        for key, value in label.get(section, {}).items():
            where = path + (section, key)
            if not _is_qualified_name(key):
                report.error(where, "not a valid Kubernetes key ([prefix/]name, name at most"
                             " 63 letters, digits, '-', '_' or '.')")
            elif section in ("labels", "dynamic-labels") and key in RESERVED_LABELS:
                report.error(where, "reserved: nodepool_k8s sets this label itself")
            if section in ("labels", "node-selector") and not _is_label_value(value):
                message = f"{value!r} is not a valid label value ({_LABEL_VALUE_RULE})"
                if section == "node-selector":
                    report.error(where, message)  # sent verbatim: the API would refuse the pod
                else:
                    report.warn(where, message + ", so the stored value is altered")
            if section == "dynamic-labels":
                problem = template_problem(value)
                if problem:
                    report.error(where, problem)
                elif key in static:
                    report.warn(where, "also set in labels; the dynamic value wins")


def template_problem(template: str) -> str | None:
    """Why `template` is not a usable dynamic-labels value, or None when it is."""
    allowed = ", ".join(REQUEST_FIELDS)
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"invalid format template {template!r}: {exc}"
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        match = _FIELD_NAME.match(field)
        first = match.group(1) if match else field
        if first != "request":
            return (f"{{{field}}}: only {{request.<field>}} can be used, with <field> one of"
                    f" {allowed}")
        accessors = _ACCESSOR.findall(match.group(2)) if match else []
        attribute = accessors[0][0] or accessors[0][1] if accessors else ""
        if not attribute:
            return f"{{{field}}}: use request.<field> with <field> one of {allowed}"
        if attribute not in REQUEST_FIELDS:
            return (f"{{{field}}}: the request has no field {attribute!r}; use one of"
                    f" {allowed}")
        if conversion not in (None, "r", "s", "a"):
            return f"{{{field}}}: unknown conversion !{conversion}"
        if spec and "{" in spec:
            nested = template_problem(spec)
            if nested:
                return nested
    return None


def _is_label_value(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.match(value))


def _is_extended_resource(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: prefixed, not native, usable in a quota."""
    return ("/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")
            and _is_qualified_name("requests." + name))


def _is_qualified_name(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    # "/name" has an empty prefix, which the API server refuses ("prefix part must be
    # non-empty"); only a key without any "/" goes without one.
    if slash and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(_NAME_PART.match(name))
