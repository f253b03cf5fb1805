"""Helpers for the JSON-like dicts every object is: a fast copy and a shared encoding cache.

Owns: `clone`, a copy for dict/list/scalar trees several times faster than `copy.deepcopy`
(which handles cycles and arbitrary classes the simulator never has), and `encode_object`,
which serializes a stored object once even when many watches stream it. The cache is keyed by
object identity; that is sound because stored objects are never modified after insertion
(see store.py) and the cache holds a reference, so an id cannot be reused while cached.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, TypeVar, cast

T = TypeVar("T")

_CACHE_SIZE = 4096
_cache: "OrderedDict[int, tuple[Any, bytes]]" = OrderedDict()
_cache_lock = threading.Lock()


def clone(value: T) -> T:
    """A deep copy of JSON-like data (dicts, lists, scalars)."""
    if isinstance(value, dict):
        return cast(T, {k: clone(v) for k, v in value.items()})
    if isinstance(value, list):
        return cast(T, [clone(v) for v in value])
    return value


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def encode_object(obj: dict[str, Any]) -> bytes:
    """JSON bytes of a stored (immutable) object, computed once per object version."""
    key = id(obj)
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None and hit[0] is obj:
            _cache.move_to_end(key)
            return hit[1]
    encoded = dumps(obj)
    with _cache_lock:
        _cache[key] = (obj, encoded)
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return encoded
