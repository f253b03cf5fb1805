"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic merge patch.

Owns: applying a patch document to an object dict, returning a new dict (inputs are never
modified, the store relies on that). Strategic merge patch is approximated: it is a merge patch
except that lists of objects that all carry a `name` are merged by name (how the real server
treats containers, env, volumes, ...), `$patch: delete|replace` is honoured and other `$...`
directives (e.g. `$setElementOrder`, sent by `kubectl apply`) are dropped.
Fails with `ApiError` 400/422 for malformed documents or failed JSON-patch tests, and 415 for
an unknown patch content type (e.g. server-side apply, which is not simulated).
"""

from __future__ import annotations

from typing import Any

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.data import clone

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _all_named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return clone(patch)
    if patch.get("$patch") == "replace":
        return {k: clone(v) for k, v in patch.items() if not k.startswith("$")}
    result = clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if isinstance(result.get(field), list) and isinstance(value, list):
                result[field] = [v for v in result[field] if v not in value]
            continue
        if key.startswith("$"):
            continue  # $setElementOrder, $retainKeys, ...: ordering/pruning hints only
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and _all_named(value) and (
                key not in result or isinstance(result.get(key), list)):
            result[key] = _merge_named_list(result.get(key) or [], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_named_list(current: list[Any], patch: list[dict[str, Any]]) -> list[Any]:
    merged = [clone(item) for item in current]
    index = {item.get("name"): i for i, item in enumerate(merged) if isinstance(item, dict)}
    deleted: set[str] = set()
    for element in patch:
        name = element["name"]
        if element.get("$patch") == "delete":
            deleted.add(name)
            continue
        if name in index:
            merged[index[name]] = strategic_merge_patch(merged[index[name]], element)
        else:
            index[name] = len(merged)
            merged.append(strategic_merge_patch({}, element))
    return [item for item in merged
            if not (isinstance(item, dict) and item.get("name") in deleted)]


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.bad_request(f"json patch: invalid path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise errors.invalid("Patch", "", [(path, "FieldValueNotFound",
                                                f"json patch: path {path!r} does not exist")])
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    key = parts[-1]
    if isinstance(parent, dict) and key in parent:
        return parent[key]
    if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        return parent[int(key)]
    raise errors.invalid("Patch", "", [(path, "FieldValueNotFound",
                                        f"json patch: path {path!r} does not exist")])


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    key = parts[-1]
    if isinstance(parent, dict) and key in parent:
        return parent.pop(key)
    if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        return parent.pop(int(key))
    raise errors.invalid("Patch", "", [(path, "FieldValueNotFound",
                                        f"json patch: cannot remove missing {path!r}")])


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    key = parts[-1]
    if isinstance(parent, dict):
        if replace and key not in parent:
            raise errors.invalid("Patch", "", [(path, "FieldValueNotFound",
                                                f"json patch: cannot replace missing {path!r}")])
        parent[key] = value
    elif isinstance(parent, list):
        if key == "-" and not replace:
            parent.append(value)
        elif key.isdigit() and int(key) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(key)] = value
            else:
                parent.insert(int(key), value)
        else:
            raise errors.invalid("Patch", "", [(path, "FieldValueInvalid",
                                                f"json patch: bad array index in {path!r}")])
    else:
        raise errors.invalid("Patch", "", [(path, "FieldValueInvalid",
                                            f"json patch: {path!r} is not in a container")])
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise errors.bad_request("json patch: body must be a list of operations")
    doc = clone(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise errors.bad_request(f"json patch: malformed operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, clone(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, clone(op.get("value")), replace=True)
        elif kind in ("move", "copy"):
            source = op.get("from", "")
            value = _remove(doc, source) if kind == "move" else clone(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise errors.invalid("Patch", "", [(path, "FieldValueInvalid",
                                                    f"json patch: test failed at {path!r}")])
        else:
            raise errors.bad_request(f"json patch: unknown op {kind!r}")
    return doc


def apply(content_type: str, target: dict[str, Any], body: Any) -> dict[str, Any]:
    """Apply a PATCH body of the given Content-Type; returns a new object."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == MERGE:
        result = merge_patch(target, body)
    elif media == STRATEGIC:
        result = strategic_merge_patch(target, body)
    elif media == JSON_PATCH:
        result = json_patch(target, body)
    else:
        raise errors.unsupported_media_type(content_type, f"{JSON_PATCH}, {MERGE}, {STRATEGIC}")
    if not isinstance(result, dict):
        raise errors.bad_request("patch result is not an object")
    return result
