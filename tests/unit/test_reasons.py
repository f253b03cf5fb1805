"""Reasons are codes of the one registry (`core.conditions.REASONS`): every reason the
production code writes into a condition, an event, a decline or a launch failure is one,
never an exception's class name; the driver's API failures map onto codes."""

from __future__ import annotations

import ast
import pathlib

import pytest

import nodepool_k8s
from nodepool_k8s.core import conditions as cond
from nodepool_k8s.core.errors import NodepoolError, NotFound, PermanentError, TemporaryError
from nodepool_k8s.driver.kubernetes import capacity, credentials
from nodepool_k8s.driver.kubernetes import errors as api_errors

ROOT = pathlib.Path(nodepool_k8s.__file__).parent
# Production modules (the simulator and test helpers under dev/ are not).
MODULES = sorted(p for p in ROOT.rglob("*.py") if "dev" not in p.relative_to(ROOT).parts)

# Calls whose `reason` keyword is a reason code (others take free text: a maintenance
# window's, a delete's "why", an HTTP reason phrase).
REASON_KEYWORD_CALLS = {"LaunchError", "ProviderUnavailable", "__init__", "record",
                        "record_batched", "record_outcome", "LaunchOutcome"}
# Calls whose positional argument at this index is a reason code.
REASON_POSITIONAL = {"Condition": 2, "_condition": 2, "_cond": 1, "Decline": 0}
# The fake driver's `_condition(type, reason, message)` (its conditions are all True).
REASON_POSITIONAL_IN = {("driver/fake.py", "_condition"): 1}


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _written_reasons() -> tuple[list[tuple[str, str]], list[str]]:
    """(module:line, literal) of every reason code written; the places that compute one
    from a class name."""
    literals: list[tuple[str, str]] = []
    class_names: list[str] = []
    for path in MODULES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            name = _name(node.func)
            values: list[ast.expr] = []
            for kw in node.keywords:
                if kw.arg == "reason":
                    if any(isinstance(n, ast.Attribute) and n.attr == "__name__"
                           for n in ast.walk(kw.value)):
                        class_names.append(where)
                    if name in REASON_KEYWORD_CALLS:
                        values.append(kw.value)
            index = REASON_POSITIONAL_IN.get((str(path.relative_to(ROOT)), name),
                                             REASON_POSITIONAL.get(name))
            if index is not None and len(node.args) > index:
                values.append(node.args[index])
            literals += [(where, v.value) for v in values
                         if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return literals, class_names


def test_every_reason_written_is_a_registry_code() -> None:
    literals, class_names = _written_reasons()
    assert len(literals) > 40  # the scan finds the call sites it is meant to check
    assert [(w, r) for w, r in literals if r not in cond.REASONS] == []
    assert class_names == []


def test_every_reason_has_advice() -> None:
    assert all(text.strip() for text in cond.REASONS.values())
    assert set(cond.POOL_REASONS) <= set(cond.REASONS)


def test_provider_reported_pool_reasons_are_codes() -> None:
    for code in (capacity.SUFFICIENT, capacity.CONSTRAINED, capacity.NONE_AVAILABLE,
                 credentials.ACCEPTED, credentials.REJECTED):
        assert code in cond.REASONS


@pytest.mark.parametrize("error,code", [
    (api_errors.QuotaExceeded("q"), "QuotaExceeded"),
    (api_errors.Unauthorized("u"), "Unauthorized"),
    (NotFound("n"), "NotFound"),
    (api_errors.Conflict("c"), "Conflict"),
    (api_errors.Forbidden("f"), "Forbidden"),
    (api_errors.Invalid("i"), "Invalid"),
    (api_errors.Gone("g"), "ApiError"),
    (TemporaryError("t"), "ApiError"),
    (PermanentError("p"), "Unknown"),
    (NodepoolError("x"), "Unknown"),
])
def test_api_failures_map_to_codes(error: NodepoolError, code: str) -> None:
    assert api_errors.reason_code(error) == code and code in cond.REASONS
