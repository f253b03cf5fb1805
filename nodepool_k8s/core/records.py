"""The one gate every ZooKeeper record passes: node requests, nodes, components, events and
our own records under `/nodepool_k8s`.

Owns: `load_json`, the only parser for data other programs can write (orjson, and the
standard library's parser with a check per number for what orjson refuses or would read
differently: text with an integer beyond 64 bits, which orjson makes a float). The bytes must be
at most `MAX_RECORD_BYTES`, valid UTF-8 and one JSON value nested at most `MAX_DEPTH`
levels (so it can always be encoded again), and every number in it must be usable: no
`NaN`/`Infinity` literals, no float that overflows (`1e400`), no integer of more than
`MAX_INT_DIGITS` digits (so every number converts to a finite float and stays cheap to
compute with). On top of it, the field checks of each kind: every key the launcher reads
must have the type the protocol gives it (strings, lists of strings, finite non-negative
numbers, timestamps up to `MAX_TIME`, known states), and a request may ask for at most
`MAX_NODE_TYPES` nodes. Keys we do not read (and `requestor_data`, which is opaque) are
not type-checked, so unknown keys still round-trip unchanged.

Failure: `Malformed(reason)` for anything else. Every decode error is converted, the JSON
parser's RecursionError on deeply nested input included, so a caller that catches
`Malformed` can never be stopped by a record. `MalformedLog` reports each bad znode once
(per version), not on every pass over it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

import orjson

from nodepool_k8s.core import model

# Our own node records are about 4 KB (with a token and CA certificate), Zuul's requests
# well under 1 KB plus requestor_data. ZooKeeper's own default limit is 1 MiB.
MAX_RECORD_BYTES = 256 * 1024
# Zuul's largest nodesets have tens of nodes; a request for thousands is an error or an
# attack, and each node type costs a plan entry and a node znode.
MAX_NODE_TYPES = 256
# Records are a few levels deep (requestor_data and attributes included). The JSON parser's
# own limit is the interpreter's recursion limit, which the encoder reaches sooner on a
# deeper stack: a record decoded just under it could not be written back.
MAX_DEPTH = 64

# Integers of up to 308 digits are below 1e308, so each converts to a finite float (the
# views and the arithmetic on times and counts mix them with floats). Zuul's trace ids in
# `requestor_data` are 128-bit (39 digits); anything longer is an error or an attack
# (int() of a 4,000-digit string alone costs a millisecond).
MAX_INT_DIGITS = 308
# The last second of year 9999 (UTC): the latest timestamp that can be shown as a date,
# and far enough from float's limits that differences of two timestamps stay finite.
MAX_TIME = 253402300799

# Remembered (path -> version) of reported records; the oldest are forgotten first.
MALFORMED_MEMORY = 10_000


class Malformed(ValueError):
    """A znode that is not a usable record; `reason` says why, for the log and the views."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class MalformedRecord:
    """A znode the listings show as malformed instead of hiding it."""

    kind: str  # "node" or "request"
    id: str
    reason: str


# -- field checks -------------------------------------------------------------------------

def _number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _opt_number(value: Any) -> bool:
    return value is None or _number(value)


def timestamp(value: Any) -> bool:
    """Seconds since the epoch, from 1970 up to `MAX_TIME` (a number, not a bool)."""
    # The range test also refuses NaN (every comparison with it is false).
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and 0 <= value <= MAX_TIME)


def _opt_time(value: Any) -> bool:
    return value is None or timestamp(value)


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _opt_str_list(value: Any) -> bool:
    return value is None or _str_list(value)


def _resources(value: Any) -> bool:
    return value is None or (isinstance(value, dict)
                             and all(isinstance(k, str) and _number(v)
                                     for k, v in value.items()))


def _node_type(value: Any) -> bool:
    return value is None or isinstance(value, str) or _str_list(value)


def _opt_int(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _opt_bool(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def _opt_object(value: Any) -> bool:
    return value is None or isinstance(value, dict)


def _opt_list(value: Any) -> bool:
    return value is None or isinstance(value, list)


def conditions(value: Any) -> bool:
    """A `conditions` list (nodes and pool status): objects whose type, status, reason and
    message are strings and whose `last_transition_time` is a timestamp."""
    if value is None:
        return True
    if not isinstance(value, list):
        return False
    for item in value:
        if not isinstance(item, dict):
            return False
        get = item.get
        when = get("last_transition_time")
        if when is not None and not timestamp(when):
            return False
        if not _STR_OR_NONE.issuperset(map(type, map(get, _CONDITION_STRINGS))) \
                and not all(_opt_str(get(key)) for key in _CONDITION_STRINGS):
            return False
    return True


_CONDITION_STRINGS = ("type", "status", "reason", "message")
_STR_OR_NONE = frozenset((str, type(None)))


_Check = Callable[[Any], bool]


class _Fields:
    """A kind's field checks: the optional strings tested together at C speed (the type
    of each value, missing ones read as None), the others one by one; only a record that
    fails is walked again, field by field, for the reason."""

    __slots__ = ("fields", "strings", "others")

    def __init__(self, fields: Mapping[str, tuple[_Check, str]]) -> None:
        self.fields = fields
        self.strings = tuple(key for key, (check, _) in fields.items() if check is _opt_str)
        self.others = tuple((key, check) for key, (check, _) in fields.items()
                            if check is not _opt_str)

    def check(self, data: Mapping[str, Any]) -> None:
        get = data.get
        if _STR_OR_NONE.issuperset(map(type, map(get, self.strings))):
            for key, check in self.others:
                value = get(key)
                if value is not None and not check(value):
                    break
            else:
                return
        for key, (check, expected) in self.fields.items():
            if key in data and not check(data[key]):
                raise Malformed(f"{key} must be {expected}, got {_sample(data[key])}")


_TIME = "seconds since the epoch (0 to the end of year 9999)"
CONDITIONS = "a list of conditions (strings, and timestamps up to year 9999)"

_REQUEST_FIELDS = _Fields({
    "state_time": (_opt_time, _TIME),
    "node_types": (_opt_str_list, "a list of label names"),
    "nodes": (_opt_str_list, "a list of node ids"),
    "declined_by": (_opt_str_list, "a list of strings"),
    "reuse": (_opt_bool, "true or false"),
    "requestor": (_opt_str, "a string"),
    "provider": (_opt_str, "a string"),
    "relative_priority": (_opt_int, "an integer"),
    "event_id": (_opt_str, "a string"),
    "created_time": (_opt_time, _TIME),
    "tenant_name": (_opt_str, "a string"),
})

_NODE_STRINGS = ("provider", "pool", "allocated_to", "tenant_name", "launcher",
                 "external_id", "hostname", "cloud", "region", "az", "public_ipv4",
                 "private_ipv4", "public_ipv6", "interface_ip", "host_id", "image_id",
                 "username", "connection_type", "shell_type", "python_path", "comment",
                 "hold_job", "requestor")
_NODE_FIELDS = _Fields({
    **{key: (_opt_str, "a string") for key in _NODE_STRINGS},
    "state_time": (_opt_time, _TIME),
    "created_time": (_opt_time, _TIME),
    "hold_expiration": (_opt_number, "a finite non-negative number"),
    "type": (_node_type, "a label name or a list of label names"),
    "resources": (_resources, "an object of finite non-negative numbers"),
    "attributes": (_opt_object, "an object"),
    "node_properties": (_opt_object, "an object"),
    "host_keys": (_opt_list, "a list"),
    "conditions": (conditions, CONDITIONS),
})

# What the launchers read from a component registration (`zk.cache.Component`, the
# listings); Zuul reads `id` and `supported_labels` the same way.
_COMPONENT_FIELDS = _Fields({
    **{key: (_opt_str, "a string") for key in ("hostname", "state", "kind", "id", "name",
                                               "provider_name", "version")},
    "supported_labels": (_opt_str_list, "a list of label names"),
    "priority": (_opt_int, "an integer"),
    "paused": (_opt_bool, "true or false"),
    "model_api": (_opt_int, "an integer"),
})

# One event of the shared event log (`zk.events`): a time and strings.
_EVENT_FIELDS = _Fields({
    **{key: (_opt_str, "a string") for key in ("kind", "provider", "pool", "node", "label",
                                               "reason", "message")},
})


def clip(text: str, limit: int = 80) -> str:
    """`text` for a log line or an error message: a record can carry anything, at any size."""
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def _sample(value: Any) -> str:
    """A short, safe description of a bad value for the log."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 60 else f"{text[:57]}..."


# -- decoders -----------------------------------------------------------------------------

class _BadNumber:
    """Stands in for a number out of range while the parser runs; `load_json` then finds
    where it is (for the reason) and refuses the record."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


# Whether the current thread's parse met a bad number (the decoder is shared).
_SEEN = threading.local()


def _bad(problem: str) -> _BadNumber:
    _SEEN.bad = True
    return _BadNumber(problem)


def _refuse_constant(name: str) -> Any:
    return _bad(f"{name} is not a number a record may hold")


def _finite_float(text: str) -> Any:
    value = float(text)
    if math.isinf(value):  # the text overflowed (NaN has no spelling but the constant)
        return _bad(f"{clip(text, 24)} is beyond the range of a float")
    return value


def _bounded_int(text: str) -> Any:
    digits = len(text) - text.startswith("-")
    if digits > MAX_INT_DIGITS:
        return _bad(f"an integer of {digits} digits, more than the {MAX_INT_DIGITS}"
                    " a record may hold")
    return int(text)


# The number hooks run inside the C scanner, once per number: a few microseconds per record.
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float,
                            parse_int=_bounded_int)


def _bad_number(value: Any) -> str:
    """The reason for the first `_BadNumber` in `value`, with the keys leading to it
    (`conditions[0].last_transition_time: ...`); iterative, like `_deeper_than`."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, _BadNumber):
            return f"{where}: {item.problem}" if where else item.problem
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}" if where else clip(k, 40))
                         for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return "a number out of range"


def load_json(raw: bytes, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """The JSON value in a znode's data (at most `max_bytes`, UTF-8, at most `MAX_DEPTH`
    levels deep, every number finite and within range), or Malformed: the one parser for
    data other programs can write."""
    if not raw:
        raise Malformed("empty znode data")
    if len(raw) > max_bytes:
        raise Malformed(f"{len(raw)} bytes, more than the {max_bytes} a record may have")
    # One C pass marks digits and brackets: the fast parser is used unless the text has a
    # run of digits long enough to be an integer beyond 64 bits (which it would turn into
    # a float, losing Zuul's 128-bit trace ids), and the depth walk only runs on data
    # with many brackets.
    marked = raw.translate(_MARKS)
    if _LONG_DIGITS not in marked:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            # Refused: the strict parser below says why in its own words, or accepts what
            # only it takes (an escaped lone surrogate, a byte order mark).
            data = _strict(raw)
    else:
        data = _strict(raw)
    if marked.count(b"[") > MAX_DEPTH and _deeper_than(data, MAX_DEPTH):
        raise Malformed(f"JSON nested more than {MAX_DEPTH} levels deep")
    return data


def _strict(raw: bytes) -> Any:
    """The standard library's parser with every number checked as it is read (slower: a
    call per number)."""
    _SEEN.bad = False
    try:
        data = _DECODER.decode(raw.decode("utf8"))
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise Malformed("JSON nested too deeply") from None
    except ValueError as exc:
        raise Malformed(f"not JSON ({exc})") from None
    if _SEEN.bad:
        raise Malformed(clip(_bad_number(data), 160))
    return data


# `bytes.translate` table: digits become "0", both opening brackets "[", the rest " ".
_MARKS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x5B if b in (0x5B, 0x7B) else 0x20
               for b in range(256))
# 19 digits: every integer of at most 18 digits fits in 64 bits (signed or not).
_LONG_DIGITS = b"0" * 19


def load_object(raw: bytes, max_bytes: int = MAX_RECORD_BYTES) -> dict[str, Any]:
    """The JSON object in a znode's data, or Malformed."""
    data = load_json(raw, max_bytes)
    if not isinstance(data, dict):
        raise Malformed(f"expected a JSON object, got {type(data).__name__}")
    return data


def load_text(raw: bytes, max_bytes: int) -> str:
    """A znode holding plain text (not JSON): at most `max_bytes`, UTF-8, without the
    surrounding whitespace; Malformed otherwise."""
    if len(raw) > max_bytes:
        raise Malformed(f"{len(raw)} bytes, more than the {max_bytes} it may have")
    try:
        return raw.decode("utf8").strip()
    except UnicodeDecodeError as exc:
        raise Malformed(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether objects/arrays nest more than `limit` levels (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item if isinstance(v, (dict, list)))
    return False


def check_request(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` if it is a usable node request, else Malformed."""
    state = data.get("state", model.RequestState.REQUESTED)
    if not isinstance(state, str) or state not in model.REQUEST_STATES:
        raise Malformed(f"unknown request state {_sample(state)}")
    _REQUEST_FIELDS.check(data)
    node_types = data.get("node_types") or ()
    if len(node_types) > MAX_NODE_TYPES:
        raise Malformed(f"asks for {len(node_types)} nodes, more than the "
                        f"{MAX_NODE_TYPES} a request may")
    return data


def check_node(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` if it is a usable node record, else Malformed."""
    state = data.get("state")
    if not isinstance(state, str) or state not in model.NODE_STATES:
        raise Malformed(f"unknown node state {_sample(state)}")
    _NODE_FIELDS.check(data)
    return data


def check_component(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` if it is a usable component registration, else Malformed."""
    _COMPONENT_FIELDS.check(data)
    return data


def check_events(batch: Any) -> list[dict[str, Any]]:
    """`batch` if it is a usable event-log entry (a list of events, each an object with a
    `time` and string fields), else Malformed."""
    if not isinstance(batch, list):
        raise Malformed(f"expected a JSON list of events, got {type(batch).__name__}")
    for event in batch:
        if not isinstance(event, dict):
            raise Malformed(f"expected events as objects, got {type(event).__name__}")
        when = event.get("time")
        if not timestamp(when):
            raise Malformed(f"an event's time must be {_TIME}, got {_sample(when)}")
        _EVENT_FIELDS.check(event)
    return batch


def decode_request(raw: bytes) -> dict[str, Any]:
    data = load_object(raw)
    check_request(data)
    return data


def decode_node(raw: bytes) -> dict[str, Any]:
    data = load_object(raw)
    check_node(data)
    return data


R = TypeVar("R")


def guarded(decode: Callable[[bytes], R], raw: bytes) -> R:
    """Run any decoder so that every failure is `Malformed` (a last line of defence for
    decoders built on top of the checks above)."""
    try:
        return decode(raw)
    except Malformed:
        raise
    except (RecursionError, ValueError, TypeError, KeyError, AttributeError,
            UnicodeDecodeError, OverflowError) as exc:
        raise Malformed(f"{type(exc).__name__}: {exc}") from None


# -- reporting ----------------------------------------------------------------------------

class MalformedLog:
    """Logs each malformed znode once per version and counts it.

    Bounded: at most `limit` znodes are remembered; a znode rewritten (new version) and
    still malformed is reported again, one that is gone is forgotten by `forget`.
    """

    def __init__(self, logger: logging.Logger, limit: int = MALFORMED_MEMORY) -> None:
        self.log = logger
        self.limit = limit
        self.reported = 0
        self._seen: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str, str], None]] = []

    def add_listener(self, listener: Callable[[str, str], None]) -> None:
        """`listener(what, path)` is called once per newly reported record (a counter)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str, str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def report(self, what: str, path: str, version: int, reason: str) -> None:
        with self._lock:
            if self._seen.get(path) == version:
                self._seen.move_to_end(path)
                return
            self._seen[path] = version
            self._seen.move_to_end(path)
            while len(self._seen) > self.limit:
                self._seen.popitem(last=False)
            self.reported += 1
        self.log.warning("Skipping malformed %s %s: %s", what, path, reason)
        for listener in list(self._listeners):
            try:
                listener(what, path)
            except Exception:  # a metrics hook must never stop decoding
                self.log.debug("malformed-record listener failed", exc_info=True)

    def forget(self, path: str) -> None:
        with self._lock:
            self._seen.pop(path, None)

    def clear(self) -> None:
        """Forget everything (tests: every test's chroot reuses the same paths)."""
        with self._lock:
            self._seen.clear()


# The process's one report of malformed records (the codecs, caches and listings share it,
# so a record seen by the cache and by a listing is still logged once).
REPORTS = MalformedLog(logging.getLogger("nodepool_k8s.core.records"))


def describe(exc: BaseException) -> str:
    """The reason to show for a decode failure of any type."""
    return exc.reason if isinstance(exc, Malformed) else f"{type(exc).__name__}: {exc}"
