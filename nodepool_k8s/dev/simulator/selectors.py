"""Parsing and matching of `labelSelector` and `fieldSelector` query parameters.

Owns: the selector grammar the real API accepts — labels: `k=v`, `k==v`, `k!=v`,
`k in (a,b)`, `k notin (a,b)`, `k` (exists), `!k` (absent), `k>n`, `k<n`; fields: `path=v`,
`path==v`, `path!=v` — and evaluating a parsed selector against an object dict.
Fails with `ApiError` 400 BadRequest on syntax errors and on field paths the resource does not
support (as the real server does), so callers learn about typos instead of matching nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from nodepool_k8s.dev.simulator import errors
from nodepool_k8s.dev.simulator.resources import ResourceType

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s+(in|notin)\s*\((.*)\)\s*$")
_OP_RE = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|!=|=|>|<)\s*(.*?)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", ">", "<"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        # Numeric comparisons: the label must exist and parse as an integer.
        try:
            number = int(value) if value is not None else None
        except ValueError:
            return False
        if number is None:
            return False
        bound = int(self.values[0])
        return number > bound if self.op == ">" else number < bound


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def parse_label_selector(text: str | None) -> list[Requirement]:
    if not text or not text.strip():
        return []
    requirements = []
    for part in _split_top_level(text):
        m = _SET_RE.match(part)
        if m:
            if m.group(1):
                raise errors.bad_request(f"unable to parse requirement: {part!r}")
            values = tuple(v.strip() for v in m.group(4).split(",") if v.strip())
            requirements.append(Requirement(m.group(2), m.group(3), values))
            continue
        m = _OP_RE.match(part)
        if m:
            key, op, value = m.group(1), m.group(2), m.group(3)
            if op == "==":
                op = "="
            if op in (">", "<") and not re.fullmatch(r"-?\d+", value):
                raise errors.bad_request(
                    f"unable to parse requirement: for 'gt', 'lt' operators, the value must be "
                    f"an integer: {part!r}")
            if " " in value or "(" in value or ")" in value:
                raise errors.bad_request(f"unable to parse requirement: {part!r}")
            requirements.append(Requirement(key, op, (value,)))
            continue
        m = _EXISTS_RE.match(part)
        if m:
            requirements.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
            continue
        raise errors.bad_request(f"unable to parse requirement: {part!r}")
    return requirements


def label_matcher(text: str | None) -> Matcher:
    requirements = parse_label_selector(text)
    if not requirements:
        return lambda obj: True

    def match(obj: dict[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in requirements)
    return match


def field_value(obj: dict[str, Any], path: str) -> str:
    """The value of a dotted field path as the real server compares it (a string; "" if unset)."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def field_matcher(text: str | None, resource: ResourceType) -> Matcher:
    if not text or not text.strip():
        return lambda obj: True
    terms: list[tuple[str, bool, str]] = []
    for part in _split_top_level(text):
        m = re.match(r"^\s*([^\s!=]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise errors.bad_request(f"invalid selector: {text!r}; can't understand {part!r}")
        path, op, value = m.groups()
        if not resource.supports_field(path):
            raise errors.bad_request(
                f'field label not supported: {path}')
        terms.append((path, op == "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        for path, negate, value in terms:
            if (field_value(obj, path) == value) == negate:
                return False
        return True
    return match


def combined(label_selector: str | None, field_selector: str | None,
             resource: ResourceType) -> Matcher:
    """One matcher for both selectors; parse errors are raised now, not at match time."""
    labels = label_matcher(label_selector)
    fields = field_matcher(field_selector, resource)
    return lambda obj: labels(obj) and fields(obj)
