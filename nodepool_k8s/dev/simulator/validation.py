"""Validation and defaulting of incoming objects, per resource type.

Owns: the checks the real API server applies that matter to our driver — object names
(DNS-1123 label for namespaces, subdomain for most kinds, path segment for RBAC), label keys
and values, required pod fields (containers, names, images), quantities and requests <= limits,
secret data encoding (and the JSON key of a registry credential Secret), RBAC roleRef —
plus the defaults the server fills in (pod restartPolicy, imagePullPolicy, secret type, ...).
Fails by raising `ApiError` 422 Invalid (or 400 for undecodable data) listing every problem
found, like the real server does.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from nodepool_k8s.dev.simulator import errors, policy
from nodepool_k8s.dev.simulator.resources import ResourceType

Causes = list[tuple[str, str, str]]

# \Z, not $: Go's $ ends the text, Python's also matches before a trailing newline.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SUFFIX = {
    "": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}
TOTAL_ANNOTATION_SIZE = 256 * 1024  # bytes of all keys and values of one object
SA_TOKEN_TYPE = "kubernetes.io/service-account-token"
SA_NAME_ANNOTATION = "kubernetes.io/service-account.name"


def dns_label_errors(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _DNS_LABEL.match(value):
        problems.append("a lowercase RFC 1123 label must consist of lower case alphanumeric "
                        "characters or '-', and must start and end with an alphanumeric "
                        "character (e.g. 'my-name',  or '123-abc', regex used for validation "
                        "is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
    return problems


def dns_subdomain_errors(value: str) -> list[str]:
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if not _DNS_SUBDOMAIN.match(value):
        problems.append("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                        "characters, '-' or '.', and must start and end with an alphanumeric "
                        "character (e.g. 'example.com', regex used for validation is "
                        "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
    return problems


def path_segment_errors(value: str) -> list[str]:
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    bad = [c for c in ("/", "%") if c in value]
    return [f"may not contain '{c}'" for c in bad]


def name_errors(resource: ResourceType, name: str) -> list[str]:
    if resource.plural == "namespaces":
        return dns_label_errors(name)
    if resource.path_segment_names:
        return path_segment_errors(name)
    return dns_subdomain_errors(name)


def _label_key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    problems = []
    if "/" in key and not prefix:
        problems.append("prefix part must be non-empty")
    if prefix:
        problems += [f"prefix part {p}" for p in dns_subdomain_errors(prefix)]
    if not name or len(name) > 63 or not _LABEL_NAME.match(name):
        problems.append("name part must consist of alphanumeric characters, '-', '_' or '.', "
                        "and must start and end with an alphanumeric character (e.g. "
                        "'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
                        "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with at most 63 characters")
    return problems


def _metadata_causes(resource: ResourceType, meta: dict[str, Any]) -> Causes:
    causes: Causes = []
    name = meta.get("name")
    if not name:
        causes.append(("metadata.name", "FieldValueRequired",
                       "Required value: name or generateName is required"))
    elif not isinstance(name, str):
        causes.append(("metadata.name", "FieldValueInvalid", "Invalid value: must be a string"))
    else:
        for problem in name_errors(resource, name):
            causes.append(("metadata.name", "FieldValueInvalid",
                           f'Invalid value: "{name}": {problem}'))
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        causes.append(("metadata.labels", "FieldValueInvalid", "Invalid value: must be a map"))
        labels = {}
    for key, value in labels.items():
        for problem in _label_key_errors(str(key)):
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f'Invalid value: "{key}": {problem}'))
        if not isinstance(value, str):
            causes.append((f"metadata.labels.{key}", "FieldValueInvalid",
                           "Invalid value: label values must be strings"))
        elif value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            causes.append(("metadata.labels", "FieldValueInvalid",
                           f'Invalid value: "{value}": a valid label must be an empty string or '
                           "consist of alphanumeric characters, '-', '_' or '.', and must start "
                           "and end with an alphanumeric character, at most 63 characters"))
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        causes.append(("metadata.annotations", "FieldValueInvalid",
                       "Invalid value: must be a map"))
        annotations = {}
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE:
        causes.append(("metadata.annotations", "FieldValueTooLong",
                       f"Too long: must have at most {TOTAL_ANNOTATION_SIZE} bytes"))
    for key, value in annotations.items():
        for problem in _label_key_errors(str(key)):
            causes.append(("metadata.annotations", "FieldValueInvalid",
                           f'Invalid value: "{key}": {problem}'))
        if not isinstance(value, str):
            causes.append((f"metadata.annotations.{key}", "FieldValueInvalid",
                           "Invalid value: annotation values must be strings"))
    return causes


def parse_quantity(value: Any) -> Decimal | None:
    """A resource quantity ("500m", "1Gi", 2) as a number, or None if it is malformed."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    m = _QUANTITY.match(value.strip())
    if not m:
        return None
    number, suffix = m.groups()
    try:
        base = Decimal(number)
    except InvalidOperation:
        return None
    if suffix in _SUFFIX:
        return base * _SUFFIX[suffix]
    if re.fullmatch(r"[eE][-+]?[0-9]+", suffix):
        return base * (Decimal(10) ** int(suffix[1:]))
    return None


_STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def _is_extended(name: str) -> bool:
    """An extended resource (nvidia.com/gpu): prefixed, outside kubernetes.io."""
    return "/" in name and "kubernetes.io/" not in name and not name.startswith("requests.")


def _unique_name_causes(path: str, name: Any, seen: set[str]) -> Causes:
    """`<path>.name`: required, a DNS label, not in `seen` (then added to it)."""
    if not name:
        return [(f"{path}.name", "FieldValueRequired", "Required value")]
    causes: Causes = [(f"{path}.name", "FieldValueInvalid", f'Invalid value: "{name}": {problem}')
                      for problem in dns_label_errors(str(name))]
    if name in seen:
        causes.append((f"{path}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
    seen.add(str(name))
    return causes


def _container_causes(path: str, container: Any, seen: set[str]) -> Causes:
    if not isinstance(container, dict):
        return [(path, "FieldValueInvalid", "Invalid value: must be an object")]
    causes = _unique_name_causes(path, container.get("name"), seen)
    image = container.get("image")
    if not image:
        causes.append((f"{path}.image", "FieldValueRequired", "Required value"))
    elif isinstance(image, str) and image != image.strip():
        causes.append((f"{path}.image", "FieldValueInvalid",
                       f'Invalid value: "{image}": must not have leading or trailing whitespace'))
    for i, env in enumerate(container.get("env") or []):
        name = env.get("name") if isinstance(env, dict) else None
        # RelaxedEnvironmentVariableValidation (on by default since 1.32): printable ASCII
        # except '='.
        if not isinstance(name, str) or not name:
            causes.append((f"{path}.env[{i}].name", "FieldValueRequired", "Required value"))
        elif "=" in name or not all(" " <= char <= "~" for char in name):
            causes.append((f"{path}.env[{i}].name", "FieldValueInvalid",
                           f'Invalid value: "{name}": a valid environment variable name must '
                           "consist only of printable ASCII characters other than '='"))
    mount_paths: set[str] = set()
    for i, mount in enumerate(container.get("volumeMounts") or []):
        mount_path = mount.get("mountPath") if isinstance(mount, dict) else None
        if not mount_path:
            causes.append((f"{path}.volumeMounts[{i}].mountPath", "FieldValueRequired",
                           "Required value"))
        elif mount_path in mount_paths:
            causes.append((f"{path}.volumeMounts[{i}].mountPath", "FieldValueInvalid",
                           f'Invalid value: "{mount_path}": must be unique'))
        else:
            mount_paths.add(str(mount_path))
    resources = container.get("resources") or {}
    parsed: dict[str, dict[str, Decimal]] = {}
    for section in ("requests", "limits"):
        for res_name, quantity in (resources.get(section) or {}).items():
            number = parse_quantity(quantity)
            field = f"{path}.resources.{section}[{res_name}]"
            if number is None:
                causes.append((field, "FieldValueInvalid",
                               f'Invalid value: "{quantity}": quantities must match the regular '
                               "expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
            elif number < 0:
                causes.append((field, "FieldValueInvalid",
                               f'Invalid value: "{quantity}": must be greater than or equal '
                               "to 0"))
            elif _is_extended(str(res_name)) and number != number.to_integral_value():
                causes.append((field, "FieldValueInvalid",
                               f'Invalid value: "{quantity}": must be an integer'))
            else:
                parsed.setdefault(section, {})[res_name] = number
            if "/" not in str(res_name) and not (res_name in _STANDARD_CONTAINER_RESOURCES
                                                 or str(res_name).startswith("hugepages-")):
                causes.append((field, "FieldValueInvalid",
                               f'Invalid value: "{res_name}": must be a standard resource for'
                               " containers"))
    for res_name, request in parsed.get("requests", {}).items():
        limit = parsed.get("limits", {}).get(res_name)
        if _is_extended(str(res_name)) and limit != request:
            # Not overcommittable: the limit must be set, and equal to the request.
            given = (resources.get("limits") or {}).get(res_name)
            causes.append((f"{path}.resources.requests[{res_name}]", "FieldValueInvalid",
                           f'Invalid value: "{resources["requests"][res_name]}": must be equal'
                           f" to {res_name} limit of {given}"))
            continue
        if limit is not None and request > limit:
            quantity = resources["requests"][res_name]
            causes.append((f"{path}.resources.requests", "FieldValueInvalid",
                           f'Invalid value: "{quantity}": must be less than or equal to '
                           f"{res_name} limit of {resources['limits'][res_name]}"))
    return causes


def _pod_causes(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec.containers", "FieldValueRequired", "Required value")]
    causes: Causes = []
    containers = spec.get("containers")
    if not containers or not isinstance(containers, list):
        causes.append(("spec.containers", "FieldValueRequired", "Required value"))
        containers = []
    seen: set[str] = set()
    for i, container in enumerate(containers):
        causes += _container_causes(f"spec.containers[{i}]", container, seen)
    for i, container in enumerate(spec.get("initContainers") or []):
        causes += _container_causes(f"spec.initContainers[{i}]", container, seen)
    policy = spec.get("restartPolicy")
    if policy not in ("Always", "OnFailure", "Never"):
        causes.append(("spec.restartPolicy", "FieldValueNotSupported",
                       f'Unsupported value: "{policy}": supported values: "Always", '
                       '"OnFailure", "Never"'))
    scheduler = spec.get("schedulerName")
    if isinstance(scheduler, str) and scheduler:
        for problem in dns_subdomain_errors(scheduler):
            causes.append(("spec.schedulerName", "FieldValueInvalid",
                           f'Invalid value: "{scheduler}": {problem}'))
    causes += _volumes_causes(spec.get("volumes") or [], containers,
                              spec.get("initContainers") or [])
    selector = spec.get("nodeSelector")
    if selector is not None and not isinstance(selector, dict):
        causes.append(("spec.nodeSelector", "FieldValueInvalid", "Invalid value: must be a map"))
    return causes


def _volumes_causes(volumes: Any, containers: list[Any], init: list[Any]) -> Causes:
    causes: Causes = []
    names: set[str] = set()
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if not isinstance(volume, dict):
            causes.append((f"spec.volumes[{i}]", "FieldValueInvalid",
                           "Invalid value: must be an object"))
            continue
        causes += _unique_name_causes(f"spec.volumes[{i}]", volume.get("name"), names)
        sources = [key for key in volume if key != "name"]
        if not sources:
            causes.append((f"spec.volumes[{i}]", "FieldValueRequired",
                           "Required value: must specify a volume type"))
        elif len(sources) > 1:
            causes.append((f"spec.volumes[{i}].{sources[1]}", "FieldValueForbidden",
                           "Forbidden: may not specify more than 1 volume type"))
    for section, items in (("containers", containers), ("initContainers", init)):
        for i, container in enumerate(items):
            mounts = container.get("volumeMounts") if isinstance(container, dict) else None
            for j, mount in enumerate(mounts or []):
                name = mount.get("name") if isinstance(mount, dict) else None
                if name not in names:
                    causes.append((f"spec.{section}[{i}].volumeMounts[{j}].name",
                                   "FieldValueNotFound", f'Not found: "{name}"'))
    return causes


def _data_key_causes(field: str, data: Any) -> Causes:
    if data is None:
        return []
    if not isinstance(data, dict):
        return [(field, "FieldValueInvalid", "Invalid value: must be a map")]
    return [(field, "FieldValueInvalid",
             f'Invalid value: "{key}": a valid config key must consist of alphanumeric '
             "characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', "
             "regex used for validation is '[-._a-zA-Z0-9]+')")
            for key in data if not _CONFIG_KEY.match(str(key))]


# Registry credential Secret types and the one key each must hold (a JSON document).
DOCKER_SECRET_KEYS = {"kubernetes.io/dockerconfigjson": ".dockerconfigjson",
                      "kubernetes.io/dockercfg": ".dockercfg"}


def _docker_secret_causes(obj: dict[str, Any]) -> Causes:
    """A registry credential Secret needs its key, holding JSON (as the real API checks)."""
    key = DOCKER_SECRET_KEYS.get(str(obj.get("type")))
    if key is None:
        return []
    raw_data, raw_strings = obj.get("data"), obj.get("stringData")
    data: dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    strings: dict[str, Any] = raw_strings if isinstance(raw_strings, dict) else {}
    field = f"data[{key}]"
    if key in strings and isinstance(strings[key], str):
        text = strings[key].encode()
    elif key in data and isinstance(data[key], str):
        try:
            text = base64.b64decode(data[key].replace("\n", ""), validate=True)
        except (binascii.Error, ValueError):
            return []  # reported by the data checks
    else:
        return [(field, "FieldValueRequired", "Required value")]
    try:
        json.loads(text)
    except ValueError as exc:
        return [(field, "FieldValueInvalid",
                 f'Invalid value: "<secret contents redacted>": {exc}')]
    return []


def _secret_causes(obj: dict[str, Any]) -> Causes:
    causes = _data_key_causes("data", obj.get("data")) + _docker_secret_causes(obj)
    if obj.get("type") == SA_TOKEN_TYPE:
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        if not annotations.get(SA_NAME_ANNOTATION):
            causes.append((f"metadata.annotations[{SA_NAME_ANNOTATION}]", "FieldValueRequired",
                           "Required value"))
    return causes


def _role_causes(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    for i, rule in enumerate(obj.get("rules") or []):
        if not isinstance(rule, dict):
            causes.append((f"rules[{i}]", "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        if not rule.get("verbs"):
            causes.append((f"rules[{i}].verbs", "FieldValueRequired",
                           "Required value: verbs must contain at least one value"))
        if rule.get("resources") and not rule.get("apiGroups"):
            causes.append((f"rules[{i}].apiGroups", "FieldValueRequired",
                           "Required value: resource rules must supply at least one api group"))
    return causes


def _rolebinding_causes(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    ref = obj.get("roleRef")
    if not isinstance(ref, dict):
        causes.append(("roleRef", "FieldValueRequired", "Required value"))
    else:
        if ref.get("kind") not in ("Role", "ClusterRole"):
            causes.append(("roleRef.kind", "FieldValueNotSupported",
                           f'Unsupported value: "{ref.get("kind")}": supported values: '
                           '"Role", "ClusterRole"'))
        if ref.get("apiGroup") != "rbac.authorization.k8s.io":
            causes.append(("roleRef.apiGroup", "FieldValueNotSupported",
                           f'Unsupported value: "{ref.get("apiGroup")}": supported values: '
                           '"rbac.authorization.k8s.io"'))
        if not ref.get("name"):
            causes.append(("roleRef.name", "FieldValueRequired", "Required value"))
    for i, subject in enumerate(obj.get("subjects") or []):
        if not isinstance(subject, dict) or not subject.get("name"):
            causes.append((f"subjects[{i}].name", "FieldValueRequired", "Required value"))
        elif subject.get("kind") not in ("ServiceAccount", "User", "Group"):
            causes.append((f"subjects[{i}].kind", "FieldValueNotSupported",
                           f'Unsupported value: "{subject.get("kind")}": supported values: '
                           '"ServiceAccount", "User", "Group"'))
    return causes


def _quantities_causes(field: str, amounts: Any) -> Causes:
    if amounts is None:
        return []
    if not isinstance(amounts, dict):
        return [(field, "FieldValueInvalid", "Invalid value: must be a map")]
    return [(f"{field}[{key}]", "FieldValueInvalid",
             f'Invalid value: "{value}": quantities must match the regular expression '
             "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'")
            for key, value in amounts.items() if parse_quantity(value) is None]


def _quota_causes(obj: dict[str, Any]) -> Causes:
    return _quantities_causes("spec.hard", (obj.get("spec") or {}).get("hard"))


def _claim_causes(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec") or {}
    causes: Causes = []
    if not spec.get("accessModes"):
        causes.append(("spec.accessModes", "FieldValueRequired",
                       "Required value: at least 1 access mode is required"))
    requests = (spec.get("resources") or {}).get("requests") or {}
    if "storage" not in requests:
        causes.append(("spec.resources[storage]", "FieldValueRequired", "Required value"))
    causes += _quantities_causes("spec.resources.requests", requests)
    return causes


def _limitrange_causes(obj: dict[str, Any]) -> Causes:
    causes: Causes = []
    for i, item in enumerate((obj.get("spec") or {}).get("limits") or []):
        if not isinstance(item, dict):
            causes.append((f"spec.limits[{i}]", "FieldValueInvalid",
                           "Invalid value: must be an object"))
            continue
        if item.get("type") not in ("Container", "Pod", "PersistentVolumeClaim"):
            causes.append((f"spec.limits[{i}].type", "FieldValueNotSupported",
                           f'Unsupported value: "{item.get("type")}": supported values: '
                           '"Container", "Pod", "PersistentVolumeClaim"'))
        for section in ("default", "defaultRequest", "max", "min", "maxLimitRequestRatio"):
            causes += _quantities_causes(f"spec.limits[{i}].{section}", item.get(section))
    return causes


def _service_causes(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec") or {}
    kind = spec.get("type")
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer", "ExternalName"):
        return [("spec.type", "FieldValueNotSupported",
                 f'Unsupported value: "{kind}": supported values: "ClusterIP", '
                 '"ExternalName", "LoadBalancer", "NodePort"')]
    causes: Causes = []
    for i, port in enumerate(spec.get("ports") or []):
        if not isinstance(port, dict) or not isinstance(port.get("port"), int):
            causes.append((f"spec.ports[{i}].port", "FieldValueRequired", "Required value"))
    return causes


def _networkpolicy_causes(obj: dict[str, Any]) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("podSelector"), dict):
        return [("spec.podSelector", "FieldValueRequired", "Required value")]
    causes: Causes = []
    for i, kind in enumerate(spec.get("policyTypes") or []):
        if kind not in ("Ingress", "Egress"):
            causes.append((f"spec.policyTypes[{i}]", "FieldValueNotSupported",
                           f'Unsupported value: "{kind}": supported values: "Ingress", '
                           '"Egress"'))
    for section, peers in (("egress", "to"), ("ingress", "from")):
        for i, rule in enumerate(spec.get(section) or []):
            for j, peer in enumerate((rule or {}).get(peers) or []):
                block = (peer or {}).get("ipBlock")
                if block is not None and not _is_cidr((block or {}).get("cidr")):
                    causes.append((f"spec.{section}[{i}].{peers}[{j}].ipBlock.cidr",
                                   "FieldValueInvalid",
                                   f'Invalid value: "{(block or {}).get("cidr")}": must be a'
                                   " valid CIDR"))
            for j, port in enumerate((rule or {}).get("ports") or []):
                where = f"spec.{section}[{i}].ports[{j}]"
                protocol = (port or {}).get("protocol", "TCP")
                if protocol not in ("TCP", "UDP", "SCTP"):
                    causes.append((f"{where}.protocol", "FieldValueNotSupported",
                                   f'Unsupported value: "{protocol}": supported values: "SCTP",'
                                   ' "TCP", "UDP"'))
                number = (port or {}).get("port")
                if isinstance(number, int) and not 1 <= number <= 65535:
                    causes.append((f"{where}.port", "FieldValueInvalid",
                                   f"Invalid value: {number}: must be between 1 and 65535,"
                                   " inclusive"))
    return causes


def _is_cidr(value: Any) -> bool:
    try:
        ipaddress.ip_network(str(value), strict=False)
    except ValueError:
        return False
    return isinstance(value, str) and "/" in value


_KIND_CAUSES = {
    "pods": _pod_causes,
    "secrets": _secret_causes,
    "configmaps": lambda obj: (_data_key_causes("data", obj.get("data"))
                               + _data_key_causes("binaryData", obj.get("binaryData"))),
    "roles": _role_causes,
    "clusterroles": _role_causes,
    "rolebindings": _rolebinding_causes,
    "clusterrolebindings": _rolebinding_causes,
    "resourcequotas": _quota_causes,
    "limitranges": _limitrange_causes,
    "persistentvolumeclaims": _claim_causes,
    "services": _service_causes,
    "networkpolicies": _networkpolicy_causes,
    policy.POLICIES: policy.policy_causes,
    policy.BINDINGS: policy.binding_causes,
}


def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def apply_defaults(resource: ResourceType, obj: dict[str, Any]) -> None:
    """Fill in the fields the real server defaults, in place (before validation)."""
    if resource.plural == "pods":
        spec = obj.setdefault("spec", {})
        if not isinstance(spec, dict):
            return
        # The real API defaults restartPolicy inside spec; a top-level one is an unknown field.
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("enableServiceLinks", True)
        spec.setdefault("priority", 0)
        for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            if isinstance(container, dict) and isinstance(container.get("image"), str):
                container.setdefault("imagePullPolicy", _image_pull_policy(container["image"]))
                container.setdefault("terminationMessagePath", "/dev/termination-log")
                container.setdefault("terminationMessagePolicy", "File")
                container.setdefault("resources", {})
    elif resource.plural == "secrets":
        obj.setdefault("type", "Opaque")
        data = obj.get("data")
        if isinstance(data, dict):
            # The real server decodes data with Go's base64, which skips line breaks (the
            # wrapped base64 kustomize's secretGenerator writes), and stores the bytes: the
            # value reads back unwrapped.
            for key, value in data.items():
                if isinstance(value, str):
                    data[key] = value.replace("\r", "").replace("\n", "")
        string_data = obj.pop("stringData", None)
        if isinstance(string_data, dict):
            # stringData is write-only: merged into data (base64) and dropped, as the real API.
            data = obj.setdefault("data", {}) or {}
            obj["data"] = data
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
    elif resource.plural == "namespaces":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("finalizers", ["kubernetes"])
        name = (obj.get("metadata") or {}).get("name")
        if name:
            labels = obj["metadata"].setdefault("labels", {}) or {}
            obj["metadata"]["labels"] = labels
            labels["kubernetes.io/metadata.name"] = name
    elif resource.plural == "nodes":
        obj.setdefault("spec", {})
    elif resource.plural == "services":
        spec = obj.setdefault("spec", {})
        if isinstance(spec, dict):
            spec.setdefault("type", "ClusterIP")
            for port in spec.get("ports") or []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    elif resource.plural == "networkpolicies":
        spec = obj.get("spec")
        if isinstance(spec, dict) and not spec.get("policyTypes"):
            spec["policyTypes"] = ["Ingress"] + (["Egress"] if spec.get("egress") else [])


def validate(resource: ResourceType, obj: dict[str, Any]) -> None:
    """Raise 422 Invalid (or 400 for undecodable secret data) if `obj` is not acceptable."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise errors.invalid(resource.kind, "", [("metadata", "FieldValueRequired",
                                                  "Required value")], resource.group)
    causes = _metadata_causes(resource, meta)
    check = _KIND_CAUSES.get(resource.plural)
    if check:
        causes += check(obj)
    if causes:
        raise errors.invalid(resource.kind, str(meta.get("name") or ""), causes, resource.group)
    if resource.plural == "secrets":
        for key, value in (obj.get("data") or {}).items():
            try:
                base64.b64decode(str(value), validate=True)
            except (binascii.Error, ValueError):
                raise errors.bad_request(
                    f"Secret in version \"v1\" cannot be handled as a Secret: illegal base64 "
                    f"data in data[{key!r}]") from None


def validate_update(resource: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Checks on fields that cannot change after creation."""
    if resource.plural in ("rolebindings", "clusterrolebindings") and \
            old.get("roleRef") != new.get("roleRef"):
        raise errors.invalid(resource.kind, old["metadata"]["name"],
                             [("roleRef", "FieldValueInvalid",
                               "Invalid value: cannot change roleRef")], resource.group)
    if resource.plural == "secrets" and old.get("type") != new.get("type"):
        raise errors.invalid(resource.kind, old["metadata"]["name"],
                             [("type", "FieldValueInvalid", "Invalid value: field is immutable")])
