"""Decoding Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).

Owns: turning the protobuf bodies that kubectl's typed clients send (`kubectl create
namespace|serviceaccount|secret|configmap|role|rolebinding|token`) into the same JSON-style
dicts a JSON body would give. The envelope is the 4-byte magic "k8s\\0" followed by a
runtime.Unknown message {typeMeta{apiVersion, kind}, raw}; `raw` is the object message.

Only request decoding is implemented, only for the kinds in `_KINDS` (field numbers per the
Kubernetes wire schema); responses are always JSON, which every client accepts. Fails with
`ApiError` 415 for kinds it cannot decode and 400 for malformed bytes. Fields a schema here
does not list are dropped, as unknown fields would be.
"""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from typing import Any, Union

from nodepool_k8s.dev.simulator import errors

MAGIC = b"k8s\x00"
MEDIA_TYPE = "application/vnd.kubernetes.protobuf"

# A field: (JSON name, type, repeated). A type is a scalar name, a message name, or a
# ("map", value type) pair; map keys are always strings in the Kubernetes API.
FieldType = Union[str, tuple[str, str]]
Schema = dict[int, tuple[str, FieldType, bool]]

_MESSAGES: dict[str, Schema] = {
    "TypeMeta": {1: ("apiVersion", "string", False), 2: ("kind", "string", False)},
    "Unknown": {1: ("typeMeta", "TypeMeta", False), 2: ("raw", "bytes", False),
                3: ("contentEncoding", "string", False), 4: ("contentType", "string", False)},
    "Time": {1: ("seconds", "int", False), 2: ("nanos", "int", False)},
    "ObjectMeta": {
        1: ("name", "string", False), 2: ("generateName", "string", False),
        3: ("namespace", "string", False), 5: ("uid", "string", False),
        6: ("resourceVersion", "string", False), 7: ("generation", "int", False),
        8: ("creationTimestamp", "Time", False), 9: ("deletionTimestamp", "Time", False),
        10: ("deletionGracePeriodSeconds", "int", False),
        11: ("labels", ("map", "string"), False), 12: ("annotations", ("map", "string"), False),
        13: ("ownerReferences", "OwnerReference", True), 14: ("finalizers", "string", True),
    },
    "OwnerReference": {1: ("kind", "string", False), 3: ("name", "string", False),
                       4: ("uid", "string", False), 5: ("apiVersion", "string", False),
                       6: ("controller", "bool", False),
                       7: ("blockOwnerDeletion", "bool", False)},
    "ObjectReference": {1: ("kind", "string", False), 2: ("namespace", "string", False),
                        3: ("name", "string", False), 4: ("uid", "string", False),
                        5: ("apiVersion", "string", False),
                        6: ("resourceVersion", "string", False),
                        7: ("fieldPath", "string", False)},
    "LocalObjectReference": {1: ("name", "string", False)},
    "Namespace": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "NamespaceSpec", False)},
    "NamespaceSpec": {1: ("finalizers", "string", True)},
    "ServiceAccount": {1: ("metadata", "ObjectMeta", False),
                       2: ("secrets", "ObjectReference", True),
                       3: ("imagePullSecrets", "LocalObjectReference", True),
                       4: ("automountServiceAccountToken", "bool", False)},
    "Secret": {1: ("metadata", "ObjectMeta", False), 2: ("data", ("map", "bytes"), False),
               3: ("type", "string", False), 4: ("stringData", ("map", "string"), False),
               5: ("immutable", "bool", False)},
    "ConfigMap": {1: ("metadata", "ObjectMeta", False), 2: ("data", ("map", "string"), False),
                  3: ("binaryData", ("map", "bytes"), False), 4: ("immutable", "bool", False)},
    "Role": {1: ("metadata", "ObjectMeta", False), 2: ("rules", "PolicyRule", True)},
    "PolicyRule": {1: ("verbs", "string", True), 2: ("apiGroups", "string", True),
                   3: ("resources", "string", True), 4: ("resourceNames", "string", True),
                   5: ("nonResourceURLs", "string", True)},
    "RoleBinding": {1: ("metadata", "ObjectMeta", False), 2: ("subjects", "Subject", True),
                    3: ("roleRef", "RoleRef", False)},
    "Subject": {1: ("kind", "string", False), 2: ("apiGroup", "string", False),
                3: ("name", "string", False), 4: ("namespace", "string", False)},
    "RoleRef": {1: ("apiGroup", "string", False), 2: ("kind", "string", False),
                3: ("name", "string", False)},
    "TokenRequest": {1: ("metadata", "ObjectMeta", False), 2: ("spec", "TokenRequestSpec", False)},
    "TokenRequestSpec": {1: ("audiences", "string", True),
                         3: ("boundObjectRef", "BoundObjectReference", False),
                         4: ("expirationSeconds", "int", False)},
    "BoundObjectReference": {1: ("kind", "string", False), 2: ("apiVersion", "string", False),
                             3: ("name", "string", False), 4: ("uid", "string", False)},
    "DeleteOptions": {1: ("gracePeriodSeconds", "int", False),
                      2: ("preconditions", "Preconditions", False),
                      3: ("orphanDependents", "bool", False),
                      4: ("propagationPolicy", "string", False),
                      5: ("dryRun", "string", True)},
    "Preconditions": {1: ("uid", "string", False), 2: ("resourceVersion", "string", False)},
}
_KINDS = ("Namespace", "ServiceAccount", "Secret", "ConfigMap", "Role", "RoleBinding",
          "TokenRequest", "DeleteOptions")


class _Malformed(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _Malformed("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Malformed("varint too long")


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, raw value) for every field in a message."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _Malformed("truncated field")
            value, pos = data[pos:pos + length], pos + length
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise _Malformed(f"unsupported wire type {wire}")
        out.append((number, wire, value))
    return out


def _scalar(kind: str, value: Any) -> Any:
    if kind == "string":
        return bytes(value).decode("utf-8")
    if kind == "bytes":
        return base64.b64encode(bytes(value)).decode()  # JSON form of []byte
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return value - (1 << 64) if value >= (1 << 63) else value  # two's complement int64
    raise _Malformed(f"unknown scalar {kind}")


def _time(message: dict[str, Any]) -> str:
    moment = datetime.fromtimestamp(message.get("seconds", 0), timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _message(name: str, data: bytes) -> dict[str, Any]:
    schema = _MESSAGES[name]
    result: dict[str, Any] = {}
    for number, wire, value in _fields(data):
        if number not in schema:
            continue
        json_name, ftype, repeated = schema[number]
        if isinstance(ftype, tuple):  # map entry: key = 1, value = 2
            entry = {n: v for n, _, v in _fields(value)}
            key = _scalar("string", entry.get(1, b""))
            result.setdefault(json_name, {})[key] = _scalar(ftype[1], entry.get(2, b""))
            continue
        if ftype in _MESSAGES:
            decoded: Any = _message(ftype, value)
            if ftype == "Time":
                decoded = _time(decoded)
        elif repeated and wire == 2 and ftype in ("int", "bool"):
            # packed repeated scalars
            decoded_list, pos = [], 0
            while pos < len(value):
                item, pos = _varint(value, pos)
                decoded_list.append(_scalar(ftype, item))
            result.setdefault(json_name, []).extend(decoded_list)
            continue
        else:
            decoded = _scalar(ftype, value)
            if not repeated and decoded in ("", 0, False):
                # Go writes unset optional scalars as zero values; JSON (omitempty) omits them.
                continue
        if repeated:
            result.setdefault(json_name, []).append(decoded)
        else:
            result[json_name] = decoded
    return result


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the dict its JSON form would give."""
    if not body.startswith(MAGIC):
        raise errors.bad_request("protobuf body without the k8s envelope")
    try:
        envelope = _message("Unknown", body[len(MAGIC):])
        type_meta = envelope.get("typeMeta") or {}
        kind = type_meta.get("kind", "")
        if kind not in _KINDS:
            raise errors.unsupported_media_type(
                f"{MEDIA_TYPE} for kind {kind or '(none)'}",
                f"application/json; protobuf only for {', '.join(_KINDS)}")
        raw = base64.b64decode(envelope.get("raw", ""))
        obj = _message(kind, raw)
    except (_Malformed, UnicodeDecodeError, ValueError) as exc:
        raise errors.bad_request(f"the protobuf body could not be decoded: {exc}") from None
    if type_meta.get("apiVersion"):
        obj = {"apiVersion": type_meta["apiVersion"], "kind": kind, **obj}
    return obj
