"""Records every layer shares: node requests, nodes, their states, and resource amounts.

Owns: the in-memory shape of the two ZooKeeper records of the Nodepool protocol and their
JSON mapping (`from_dict` / `to_dict`). The mapping is lossless: keys we do not know (Zuul's
extra `id`, future fields) are kept in `extra` and written back unchanged, and
`requestor_data` is never interpreted. Missing keys read as the protocol's defaults.
`from_dict` trusts its input's types: records from ZooKeeper pass the strict decoders in
`records` first (the codecs in `zk/nodes.py` and `zk/requests.py` do that).

`Resources` is the pure value type for quota arithmetic (cores, instances, ram, and any
extra resource keys).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import math
import sys
from dataclasses import dataclass, field
from typing import (Any, Generic, ItemsView, Iterable, Iterator, KeysView, Mapping, TypeVar,
                    ValuesView, overload)

from nodepool_k8s.core import conditions as cond

# -- states ------------------------------------------------------------------------------------


class RequestState(enum.StrEnum):
    """A node request's `state`; the values are the protocol's strings (Zuul reads them)."""

    REQUESTED = "requested"
    PENDING = "pending"
    FULFILLED = "fulfilled"
    FAILED = "failed"


class NodeState(enum.StrEnum):
    """A node's `state`; the values are the protocol's strings (Zuul and Nodepool's other
    launchers read and write them). A record in a state not listed here is malformed."""

    BUILDING = "building"
    TESTING = "testing"
    READY = "ready"
    IN_USE = "in-use"
    USED = "used"
    HOLD = "hold"
    DELETING = "deleting"
    FAILED = "failed"
    INIT = "init"
    ABORTED = "aborted"
    DELETED = "deleted"


# Value -> member: decoding looks states up here (a dict lookup, not the enum's call), and a
# value missing from it is an unknown state.
REQUEST_STATES: Mapping[str, RequestState] = {s.value: s for s in RequestState}
NODE_STATES: Mapping[str, NodeState] = {s.value: s for s in NodeState}


def request_state(value: Any) -> RequestState:
    """The member for a decoded request state; ValueError for an unknown one."""
    state = REQUEST_STATES.get(value) if isinstance(value, str) else None
    if state is None:
        raise ValueError(f"unknown request state {value!r}")
    return state


def node_state(value: Any) -> NodeState:
    """The member for a decoded node state; ValueError for an unknown one."""
    state = NODE_STATES.get(value) if isinstance(value, str) else None
    if state is None:
        raise ValueError(f"unknown node state {value!r}")
    return state


MIN_READY_REQUESTOR = "NodePool:min-ready"
# Extra key of our own pool-level min-ready requests (`<provider>/<pool>`): only that pool
# serves it; every other pool skips it (never declines). Zuul never reads these requests.
MIN_READY_POOL = "nodepool-k8s-min-ready-pool"
MIN_READY_PRIORITY = "900"
# Extra key of a request: why it waits, per pool ({pool id: {reason, message}}; Zuul keeps
# unknown keys and reads none of it). It describes the state it was written in, so every
# state change drops it (`transition.transition_request`).
WAITING_REASONS = "waiting_reasons"


def dumps(data: Mapping[str, Any]) -> bytes:
    return json.dumps(data).encode("utf8")


# -- node requests -----------------------------------------------------------------------------

_REQUEST_KEYS = ("state", "state_time", "declined_by", "node_types", "nodes", "reuse",
                 "requestor", "requestor_data", "provider", "relative_priority", "event_id",
                 "created_time", "tenant_name")


@dataclass
class NodeRequest:
    id: str
    state: RequestState = RequestState.REQUESTED
    state_time: float | None = None
    node_types: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    declined_by: list[str] = field(default_factory=list)
    reuse: bool = True
    requestor: str | None = None
    requestor_data: Any = None
    provider: str | None = None
    relative_priority: int = 0
    event_id: str | None = None
    created_time: float | None = None
    tenant_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # ZooKeeper bookkeeping, not serialised.
    version: int = -1

    def copy(self) -> "NodeRequest":
        """A copy to change and write; the original stays as it was until the write succeeds
        (the lists and `extra` are the copy's own, `requestor_data` is shared: never
        changed)."""
        return dataclasses.replace(self, node_types=list(self.node_types),
                                   nodes=list(self.nodes), declined_by=list(self.declined_by),
                                   extra=copy.deepcopy(self.extra))

    @property
    def priority(self) -> str:
        """The 3-character precedence prefix of the id ("100", "200", "900", ...)."""
        return self.id.split("-", 1)[0]

    @property
    def sequence(self) -> str:
        return self.id.split("-", 1)[-1]

    def sort_key(self) -> tuple[str, int, str]:
        return (self.priority, self.relative_priority, self.sequence)

    @classmethod
    def from_dict(cls, request_id: str, data: Mapping[str, Any],
                  version: int = -1) -> "NodeRequest":
        state = request_state(data.get("state", RequestState.REQUESTED))
        node_types = data.get("node_types") or []
        if not isinstance(node_types, list) or not all(isinstance(t, str) for t in node_types):
            raise ValueError("node_types must be a list of label names")
        rel = data.get("relative_priority") or 0
        if not isinstance(rel, int):
            raise ValueError("relative_priority must be an integer")
        return cls(
            id=request_id,
            state=state,
            state_time=data.get("state_time"),
            node_types=list(node_types),
            nodes=[str(n) for n in (data.get("nodes") or [])],
            declined_by=list(data.get("declined_by") or []),
            reuse=bool(data.get("reuse", True)),
            requestor=data.get("requestor"),
            requestor_data=data.get("requestor_data"),
            provider=data.get("provider"),
            relative_priority=rel,
            event_id=data.get("event_id"),
            created_time=data.get("created_time"),
            tenant_name=data.get("tenant_name"),
            extra={k: v for k, v in data.items() if k not in _REQUEST_KEYS},
            version=version,
        )

    def to_dict(self) -> dict[str, Any]:
        data = dict(self.extra)
        data.update({
            "state": str(self.state),
            "state_time": self.state_time,
            "declined_by": list(self.declined_by),
            "node_types": list(self.node_types),
            "nodes": list(self.nodes),
            "reuse": self.reuse,
            "requestor": self.requestor,
            "requestor_data": self.requestor_data,
            "provider": self.provider,
            "relative_priority": self.relative_priority,
            "event_id": self.event_id,
            "created_time": self.created_time,
            "tenant_name": self.tenant_name,
        })
        return data


# -- nodes -------------------------------------------------------------------------------------

_NODE_DEFAULTS: dict[str, Any] = {
    "cloud": None, "provider": None, "pool": None, "allocated_to": None, "az": None,
    "region": None, "public_ipv4": None, "private_ipv4": None, "public_ipv6": None,
    "host_id": None, "interface_ip": None, "connection_port": 22, "image_id": None,
    "launcher": None, "created_time": None, "external_id": None, "hostname": None,
    "comment": None, "user_data": None, "hold_job": None, "host_keys": [],
    "username": None, "connection_type": None, "shell_type": None, "hold_expiration": None,
    "resources": None, "slot": None, "attributes": None, "python_path": None,
    "tenant_name": None, "driver_data": None, "requestor": None, "node_properties": {},
}
# Zuul's executor iterates `host_keys` (`for key in getattr(node, 'host_keys', [])`) when it
# builds the inventory of a kubectl node: null there crashes the build. Nodepool writes an
# empty list, and an empty dict for `node_properties` (copied into Ansible variables).


# The fields the engine reads of every cached node (quota sums, cleanup, reuse, gauges):
# slots of `Node` (C-speed attributes) rather than entries of `Node.fields`, and all that a
# summary (the node cache's record) keeps besides the state, its time and the type.
SLOT_FIELDS = ("provider", "pool", "allocated_to", "tenant_name", "resources", "external_id",
               "hold_expiration", "launcher")
_SLOT_SET = frozenset(SLOT_FIELDS)
_NODE_KEYS = tuple(_NODE_DEFAULTS)

_MUTABLE_DEFAULTS = tuple((k, type(v)) for k, v in _NODE_DEFAULTS.items()
                          if isinstance(v, (list, dict)))
# Keys of a node record that are not in `fields` (nor in `extra`).
_NODE_OWN_KEYS = frozenset(("state", "state_time", "type", "ssh_port"))


_FIELD_DEFAULTS = {k: v for k, v in _NODE_DEFAULTS.items() if k not in _SLOT_SET}


def _fresh_defaults() -> dict[str, Any]:
    """A copy of the defaults whose list/dict values are not shared between nodes."""
    fields = _FIELD_DEFAULTS.copy()
    for key, kind in _MUTABLE_DEFAULTS:
        fields[key] = kind()
    return fields


F = TypeVar("F")
_MISSING: Any = object()


class _Field(Generic[F]):
    """A typed attribute of `Node` stored in `Node.fields` under the attribute's name.

    Declared without an annotation (`provider = _Field[str | None]()`), so the dataclass does
    not take it for a field, while mypy types `node.provider` (and rejects `node.providr`).
    The types are what `records.check_node` guarantees for a decoded record.
    """

    __slots__ = ("key", "default")

    def __set_name__(self, owner: type, name: str) -> None:
        if name not in _NODE_DEFAULTS:
            raise TypeError(f"{name} is not a node field")
        self.key = name
        self.default = _NODE_DEFAULTS[name]

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> "_Field[F]": ...

    @overload
    def __get__(self, obj: "Node", objtype: type | None = None) -> F: ...

    def __get__(self, obj: "Node | None", objtype: type | None = None) -> "F | _Field[F]":
        if obj is None:
            return self
        value: F = obj.fields.get(self.key, _MISSING)
        if value is _MISSING:
            return obj._default(self.key)  # type: ignore[no-any-return]
        return value

    def __set__(self, obj: "Node", value: F) -> None:
        obj.fields[self.key] = value


# Node key (an extension; Zuul ignores it): the fingerprint of the label configuration the
# node was built from (config/fingerprint.py), so a spare built from an older one is found.
CONFIG_HASH = "config_hash"

# The keys a summary keeps (`Node.from_dict(..., summary=True)`): what the engine's
# decisions read from the node cache (state, state_time and type are always kept).
SUMMARY_FIELDS = _SLOT_SET
SUMMARY_EXTRA = frozenset((CONFIG_HASH,))


class SummaryError(ValueError):
    """A node summary was asked for what it does not keep, or to be written."""


# The slots whose values repeat across a pool's nodes (a few providers, pools, tenants,
# launchers): a summary interns them, so thousands of cached nodes share one string each.
# The request a node is allocated to and its external id are unique to it: interning them
# would only churn the interpreter's table of interned strings (one insertion and one
# deletion per node), whose size then doubles once the insertions fill it (about 1 MiB of
# table, held for the life of the process, after some thousand nodes).
_INTERNED_SLOTS = frozenset(("provider", "pool", "tenant_name", "launcher"))


def _interned(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


class _SummaryExtra(dict[str, Any]):
    """A summary's `extra`: read-only (a summary is never written), one shared empty one."""

    __slots__ = ()

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise SummaryError("a node summary (the cache's) is read-only")

    __setitem__ = __delitem__ = _refuse
    update = setdefault = pop = popitem = clear = _refuse


_NO_EXTRA = _SummaryExtra()  # every summary's `fields` and `extra`


@dataclass(slots=True)
class Node:
    """A node record: the one type for nodes in every layer.

    A whole record (`summary` False: from `zk.nodes`, listings, the CLI, the web app) keeps
    every key and writes back unknown ones unchanged (`extra`). A summary (`summary` True:
    the node cache's entries, ten thousand of them in a launcher) keeps only
    `SUMMARY_FIELDS` (the slot fields, strings interned) and `SUMMARY_EXTRA` (the config
    hash, in `summary_hash`); its `fields` and `extra` are one empty read-only dict shared
    by all summaries, so it costs no more than the cache's former slim class did. Reading
    another field of it raises `SummaryError` and so does `to_dict`, so a summary is never
    written over the whole record: decisions take candidates from the cache, then lock and
    re-read. The fields every decision reads (`SLOT_FIELDS`) are slots of every node.
    """

    id: str
    state: NodeState = NodeState.INIT
    state_time: float | None = None
    type: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=_fresh_defaults)
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = -1
    summary: bool = False
    # SLOT_FIELDS: typed slots (the other fields are `_Field`s over `fields`).
    provider: str | None = None
    pool: str | None = None
    allocated_to: str | None = None
    tenant_name: str | None = None
    resources: dict[str, float] | None = None
    external_id: str | None = None
    hold_expiration: float | None = None
    launcher: str | None = None
    # A summary's `config_hash` (a whole record keeps it in `extra`, see the property).
    summary_hash: str | None = field(default=None, repr=False)

    # Every key of `_NODE_DEFAULTS` as a typed attribute over `fields` (a test checks that
    # none is missing). Types as `records.check_node` guarantees them for decoded records.
    cloud = _Field[str | None]()
    az = _Field[str | None]()
    region = _Field[str | None]()
    public_ipv4 = _Field[str | None]()
    private_ipv4 = _Field[str | None]()
    public_ipv6 = _Field[str | None]()
    host_id = _Field[str | None]()
    interface_ip = _Field[str | None]()
    # An int (SSH) or, for Kubernetes nodes, a dict with the API endpoint and token.
    connection_port = _Field[Any]()
    image_id = _Field[str | None]()
    created_time = _Field[float | None]()
    hostname = _Field[str | None]()
    comment = _Field[str | None]()
    user_data = _Field[Any]()
    hold_job = _Field[str | None]()
    host_keys = _Field[list[Any] | None]()
    username = _Field[str | None]()
    connection_type = _Field[str | None]()
    shell_type = _Field[str | None]()
    slot = _Field[Any]()
    attributes = _Field[dict[str, Any] | None]()
    python_path = _Field[str | None]()
    driver_data = _Field[Any]()
    requestor = _Field[str | None]()
    node_properties = _Field[dict[str, Any] | None]()

    def _default(self, key: str) -> Any:
        """A field missing from `fields` (a summary's, or one removed by hand)."""
        if self.summary:
            raise SummaryError(f"node {self.id}: {key} is not kept in a node summary (the"
                               " cache); read the node record")
        default = _NODE_DEFAULTS[key]
        if isinstance(default, (list, dict)):  # not shared between nodes
            default = self.fields[key] = type(default)()
        return default

    def copy(self) -> "Node":
        """A copy of a whole record to change and write; the original stays as it was until
        the write succeeds (`fields` and `extra` are the copy's own)."""
        if self.summary:
            raise SummaryError(f"node {self.id}: a node summary (the cache's) is not copied"
                               " to be written; lock and re-read the node")
        return dataclasses.replace(self, type=list(self.type), fields=copy.deepcopy(self.fields),
                                   extra=copy.deepcopy(self.extra))

    def set(self, **values: Any) -> "Node":
        for key, value in values.items():
            if key not in _NODE_DEFAULTS:
                raise KeyError(f"unknown node field {key!r}")
            if key in _SLOT_SET:
                setattr(self, key, value)
            else:
                self.fields[key] = value
        return self

    @property
    def label(self) -> str | None:
        return self.type[0] if self.type else None

    @property
    def config_hash(self) -> str | None:
        """The label configuration's fingerprint the node was built from (`CONFIG_HASH`)."""
        if self.summary:
            return self.summary_hash
        value = self.extra.get(CONFIG_HASH)
        return value if isinstance(value, str) else None

    # Lifecycle conditions live in the extra key `conditions` (see nodepool_k8s.core.conditions).
    @property
    def conditions(self) -> list[cond.Condition]:
        return cond.parse(self.extra.get(cond.KEY))

    @conditions.setter
    def conditions(self, value: Iterable[cond.Condition]) -> None:
        self.extra[cond.KEY] = cond.serialise(value)

    def set_condition(self, condition: cond.Condition) -> None:
        self.conditions = cond.update(self.conditions, condition)

    @property
    def failure_reason(self) -> str | None:
        """The reason of the False condition that explains a failure, if any."""
        failed = cond.failure(self.conditions)
        return failed.reason if failed else None

    @classmethod
    def from_dict(cls, node_id: str, data: Mapping[str, Any], version: int = -1,
                  summary: bool = False) -> "Node":
        state = node_state(data.get("state"))
        node_type = data.get("type") or []
        if isinstance(node_type, str):
            node_type = [node_type]
        if summary:
            return cls._summary(node_id, state, data, node_type, version)
        fields = _fresh_defaults()
        extra: dict[str, Any] = {}
        slots: dict[str, Any] = {}
        for key, value in data.items():
            if key in fields:
                fields[key] = value
            elif key in _SLOT_SET:
                slots[key] = value
            elif key not in _NODE_OWN_KEYS:
                extra[key] = value
        if "connection_port" not in data and "ssh_port" in data:
            fields["connection_port"] = data["ssh_port"]
        return cls(id=node_id, state=state, state_time=data.get("state_time"),
                   type=list(node_type), fields=fields, extra=extra, version=version,
                   **slots)

    @classmethod
    def _summary(cls, node_id: str, state: NodeState, data: Mapping[str, Any],
                 node_type: list[str], version: int) -> "Node":
        slots = {key: _interned(data[key]) if key in _INTERNED_SLOTS else data[key]
                 for key in SLOT_FIELDS if key in data}
        config_hash = data.get(CONFIG_HASH)
        return cls(id=node_id, state=state, state_time=data.get("state_time"),
                   type=list(tuple(_interned(t) for t in node_type)), fields=_NO_EXTRA,
                   extra=_NO_EXTRA, version=version, summary=True,
                   summary_hash=sys.intern(config_hash) if isinstance(config_hash, str)
                   else None, **slots)

    def to_dict(self) -> dict[str, Any]:
        if self.summary:
            raise SummaryError(f"node {self.id}: a node summary (the cache's) is not a whole"
                               " record and is never written; lock and re-read the node")
        data = dict(self.extra)
        fields = self.fields
        for key in _NODE_KEYS:  # the protocol's key order, as Nodepool writes it
            data[key] = getattr(self, key) if key in _SLOT_SET else \
                fields.get(key, _NODE_DEFAULTS[key])
        data["state"] = str(self.state)
        data["state_time"] = self.state_time
        data["type"] = list(self.type)
        # Old Zuuls read ssh_port; keep it a duplicate of connection_port.
        data["ssh_port"] = self.fields.get("connection_port")
        return data


@dataclass(frozen=True)
class NodeView:
    """A node as read from ZooKeeper plus whether anyone holds its lock (listings, views)."""

    node: Node
    locked: bool


# -- resources ---------------------------------------------------------------------------------

class Resources(Mapping[str, float]):
    """An immutable bag of resource amounts with quota arithmetic.

    Missing keys read as `default`: 0 for amounts (usage, demand) and infinity for limits.
    """

    __slots__ = ("_values", "_default")

    def __init__(self, values: Mapping[str, float] | None = None,
                 default: float = 0.0) -> None:
        self._values = {k: float(v) for k, v in (values or {}).items()}
        self._default = default

    @classmethod
    def limits(cls, values: Mapping[str, float | None] | None = None) -> "Resources":
        return cls({k: (math.inf if v is None else v) for k, v in (values or {}).items()},
                   default=math.inf)

    def __getitem__(self, key: str) -> float:
        return self._values.get(key, self._default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    # The dict's own views: Mapping's generic ones call __getitem__ per key, and quota
    # sums run over every node's resources on each allocation decision.
    def keys(self) -> KeysView[str]:
        return self._values.keys()

    def values(self) -> ValuesView[float]:
        return self._values.values()

    def items(self) -> ItemsView[str, float]:
        return self._values.items()

    def __repr__(self) -> str:
        return f"Resources({self._values!r}, default={self._default})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resources):
            return NotImplemented
        keys = set(self._values) | set(other._values)
        return self._default == other._default and all(self[k] == other[k] for k in keys)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._values.items())), self._default))

    def _combine(self, other: Mapping[str, float], sign: float) -> "Resources":
        if isinstance(other, Resources):
            theirs, odefault = other._values, other._default
        else:
            theirs, odefault = dict(other), 0.0
        mine, default = self._values, self._default
        out = {k: mine.get(k, default) + sign * theirs.get(k, odefault)
               for k in mine.keys() | theirs.keys()}
        return Resources(out, default=self._default + sign * odefault
                         if not (math.isinf(self._default) and math.isinf(odefault))
                         else self._default)

    def __add__(self, other: Mapping[str, float]) -> "Resources":
        return self._combine(other, 1.0)

    def __sub__(self, other: Mapping[str, float]) -> "Resources":
        return self._combine(other, -1.0)

    def exceeded_keys(self, limit: "Resources") -> list[str]:
        return sorted(k for k in set(self._values) | set(limit._values) if self[k] > limit[k])

    def as_dict(self) -> dict[str, float | int]:
        """Plain numbers for JSON (whole numbers as int), as stored in a node's `resources`."""
        return {k: (int(v) if float(v).is_integer() else v) for k, v in self._values.items()}

    @classmethod
    def total(cls, items: Iterable[Mapping[str, float]]) -> "Resources":
        acc = cls()
        for item in items:
            acc = acc + item
        return acc
