"""ValidatingAdmissionPolicy and its bindings, for the policies this project ships.

Owns: matching a write against every ValidatingAdmissionPolicyBinding and its policy
(`matchConstraints` and the binding's `matchResources`: resourceRules, excludeResourceRules,
namespaceSelector, objectSelector), evaluating the policy's `validations` and refusing the
write when one is false and the binding's `validationActions` include `Deny`, with the real
server's message: `<kind> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with
binding '<binding>' denied request: <message>` (403 with `reason: Forbidden`, else 422
Invalid, the real default).

Expressions are CEL, of which a small subset is modelled: literals (strings, integers,
true/false/null, lists), the variables `object`, `oldObject` and `request`, field selection
and indexing, `has()`, `size()`, `.startsWith()`, `.endsWith()`, `.contains()`, `!`, `&&`,
`||`, `==`, `!=`, `<`, `<=`, `>`, `>=` and `in`. A policy using anything else (other CEL,
`paramKind`, `matchConditions`, `variables`, `auditAnnotations`) is refused at creation with
422 naming what the simulator does not model, so a test can never pass against a policy that
is silently not enforced. Evaluation errors (a missing field) follow `failurePolicy`
(default Fail: refused). Only CREATE and UPDATE are admitted; DELETE and CONNECT are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from nodepool_k8s.dev.simulator import errors

Obj = dict[str, Any]
Causes = list[tuple[str, str, str]]

GROUP = "admissionregistration.k8s.io"
POLICIES = "validatingadmissionpolicies"
BINDINGS = "validatingadmissionpolicybindings"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")
_UNMODELLED_SPEC = ("paramKind", "matchConditions", "variables", "auditAnnotations")
_UNMODELLED_BINDING = ("paramRef",)


class CelError(Exception):
    """An expression outside the modelled subset, or one that does not parse."""


class _EvalError(Exception):
    """An expression that fails at run time (CEL: "no such key", a type mismatch)."""


# -- the CEL subset: tokens, parser, evaluator ------------------------------------------------

_TOKEN = re.compile(r"""\s*(?:
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<int>\d+)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>&&|\|\||==|!=|<=|>=|[<>!()\[\].,])
)""", re.VERBOSE)
_VARIABLES = ("object", "oldObject", "request")
_METHODS = ("startsWith", "endsWith", "contains", "size")
_RELATIONS = ("==", "!=", "<", "<=", ">", ">=", "in")

Node = tuple[Any, ...]


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise CelError(f"unexpected {text[pos:pos + 10]!r} at {pos}")
        pos = match.end()
        if match["string"] is not None:
            body = match["string"][1:-1]
            out.append(("lit", re.sub(r"\\(.)", r"\1", body)))
        elif match["int"] is not None:
            out.append(("lit", int(match["int"])))
        elif match["name"] is not None:
            word = match["name"]
            if word in ("true", "false"):
                out.append(("lit", word == "true"))
            elif word == "null":
                out.append(("lit", None))
            elif word == "in":
                out.append(("op", "in"))
            else:
                out.append(("name", word))
        else:
            out.append(("op", match["op"]))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def _peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, op: str | None = None) -> tuple[str, Any]:
        token = self._peek()
        if token is None or (op is not None and token != ("op", op)):
            raise CelError(f"expected {op or 'more'} at token {self.pos}")
        self.pos += 1
        return token

    def _at(self, op: str) -> bool:
        return self._peek() == ("op", op)

    def parse(self) -> Node:
        node = self._or()
        if self._peek() is not None:
            raise CelError(f"unexpected {self._peek()[1]!r}")  # type: ignore[index]
        return node

    def _or(self) -> Node:
        node = self._and()
        while self._at("||"):
            self._take()
            node = ("or", node, self._and())
        return node

    def _and(self) -> Node:
        node = self._relation()
        while self._at("&&"):
            self._take()
            node = ("and", node, self._relation())
        return node

    def _relation(self) -> Node:
        node = self._unary()
        token = self._peek()
        if token is not None and token[0] == "op" and token[1] in _RELATIONS:
            self._take()
            node = ("rel", token[1], node, self._unary())
        return node

    def _unary(self) -> Node:
        if self._at("!"):
            self._take()
            return ("not", self._unary())
        return self._member()

    def _member(self) -> Node:
        node = self._primary()
        while True:
            if self._at("."):
                self._take()
                kind, name = self._take()
                if kind != "name":
                    raise CelError("expected a field name after '.'")
                if self._at("("):
                    if name not in _METHODS:
                        raise CelError(f"the simulator does not model the CEL function"
                                       f" {name}()")
                    node = ("call", name, node, self._arguments())
                else:
                    node = ("field", node, name)
            elif self._at("["):
                self._take()
                index = self._or()
                self._take("]")
                node = ("index", node, index)
            else:
                return node

    def _arguments(self) -> list[Node]:
        self._take("(")
        args: list[Node] = []
        while not self._at(")"):
            args.append(self._or())
            if not self._at(")"):
                self._take(",")
        self._take(")")
        return args

    def _primary(self) -> Node:
        kind, value = self._take()
        if kind == "lit":
            return ("lit", value)
        if (kind, value) == ("op", "("):
            node = self._or()
            self._take(")")
            return node
        if (kind, value) == ("op", "["):
            items: list[Node] = []
            while not self._at("]"):
                items.append(self._or())
                if not self._at("]"):
                    self._take(",")
            self._take("]")
            return ("list", items)
        if kind == "name" and value in ("has", "size") and self._at("("):
            args = self._arguments()
            if len(args) != 1 or (value == "has" and args[0][0] != "field"):
                what = "field selection" if value == "has" else "argument"
                raise CelError(f"{value}() takes one {what}")
            return (value, args[0])
        if kind == "name" and value in _VARIABLES:
            return ("var", value)
        raise CelError(f"the simulator does not model {value!r} in CEL expressions")


def compile_expression(text: str) -> Node:
    """The parsed expression; CelError when it is outside the modelled subset."""
    return _Parser(text).parse()


def _select(value: Any, key: Any) -> Any:
    if isinstance(value, dict):
        if key not in value:
            raise _EvalError(f"no such key: {key}")
        return value[key]
    if isinstance(value, list) and isinstance(key, int) and not isinstance(key, bool):
        if not 0 <= key < len(value):
            raise _EvalError(f"index out of bounds: {key}")
        return value[key]
    raise _EvalError(f"cannot select {key!r} from {type(value).__name__}")


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "in":
        if not isinstance(right, (list, dict)):
            raise _EvalError("'in' needs a list or map")
        return left in right
    if type(left) is not type(right) or not isinstance(left, (int, str)):
        raise _EvalError(f"no such overload: {type(left).__name__} {op} {type(right).__name__}")
    return bool({"<": left < right, "<=": left <= right, ">": left > right,
                 ">=": left >= right}[op])


def evaluate(node: Node, variables: Obj) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "var":
        return variables.get(node[1])
    if kind == "list":
        return [evaluate(item, variables) for item in node[1]]
    if kind == "field":
        return _select(evaluate(node[1], variables), node[2])
    if kind == "index":
        return _select(evaluate(node[1], variables), evaluate(node[2], variables))
    if kind == "has":
        _, target, name = node[1]
        holder = evaluate(target, variables)
        return isinstance(holder, dict) and name in holder
    if kind == "size":
        value = evaluate(node[1], variables)
        if not isinstance(value, (str, list, dict)):
            raise _EvalError("size() needs a string, list or map")
        return len(value)
    if kind == "not":
        value = evaluate(node[1], variables)
        if not isinstance(value, bool):
            raise _EvalError("'!' needs a bool")
        return not value
    if kind in ("and", "or"):
        # CEL's && and || are commutative about errors; modelled left to right, which only
        # matters for expressions that fail on one side.
        left = evaluate(node[1], variables)
        if not isinstance(left, bool):
            raise _EvalError(f"'{'&&' if kind == 'and' else '||'}' needs bools")
        if left == (kind == "or"):
            return left
        right = evaluate(node[2], variables)
        if not isinstance(right, bool):
            raise _EvalError(f"'{'&&' if kind == 'and' else '||'}' needs bools")
        return right
    if kind == "rel":
        return _compare(node[1], evaluate(node[2], variables), evaluate(node[3], variables))
    if kind == "call":
        name, target, args = node[1], evaluate(node[2], variables), \
            [evaluate(a, variables) for a in node[3]]
        if name == "size" and not args and isinstance(target, (str, list, dict)):
            return len(target)
        if name in ("startsWith", "endsWith", "contains") and isinstance(target, str) \
                and len(args) == 1 and isinstance(args[0], str):
            return {"startsWith": target.startswith, "endsWith": target.endswith,
                    "contains": target.__contains__}[name](args[0])
        raise _EvalError(f"no such overload: {name}")
    raise _EvalError(f"unknown node {kind}")  # pragma: no cover - the parser makes none


# -- validation of the objects ------------------------------------------------------------------

def _unmodelled(path: str, key: str) -> tuple[str, str, str]:
    return (f"{path}.{key}", "FieldValueNotSupported",
            f"Unsupported value: the simulator does not model {key}")


def _selector_causes(path: str, selector: Any) -> Causes:
    if selector is None:
        return []
    if not isinstance(selector, dict):
        return [(path, "FieldValueInvalid", "Invalid value: must be a label selector")]
    causes: Causes = []
    for i, req in enumerate(selector.get("matchExpressions") or []):
        if not isinstance(req, dict) or req.get("operator") not in (
                "In", "NotIn", "Exists", "DoesNotExist"):
            causes.append((f"{path}.matchExpressions[{i}].operator", "FieldValueNotSupported",
                           'Unsupported value: supported values: "In", "NotIn", "Exists",'
                           ' "DoesNotExist"'))
    return causes


def _match_causes(path: str, match: Any, required: bool) -> Causes:
    if match is None:
        return [(path, "FieldValueRequired", "Required value")] if required else []
    if not isinstance(match, dict):
        return [(path, "FieldValueInvalid", "Invalid value: must be an object")]
    causes: Causes = []
    rules = match.get("resourceRules")
    if required and not rules:
        causes.append((f"{path}.resourceRules", "FieldValueRequired", "Required value"))
    for section in ("resourceRules", "excludeResourceRules"):
        for i, rule in enumerate(match.get(section) or []):
            where = f"{path}.{section}[{i}]"
            if not isinstance(rule, dict):
                causes.append((where, "FieldValueInvalid", "Invalid value: must be an object"))
                continue
            for key in ("apiGroups", "apiVersions", "operations", "resources"):
                if not rule.get(key):
                    causes.append((f"{where}.{key}", "FieldValueRequired", "Required value"))
            for op in rule.get("operations") or []:
                if op not in OPERATIONS:
                    causes.append((f"{where}.operations", "FieldValueNotSupported",
                                   f'Unsupported value: "{op}"'))
    causes += _selector_causes(f"{path}.namespaceSelector", match.get("namespaceSelector"))
    causes += _selector_causes(f"{path}.objectSelector", match.get("objectSelector"))
    return causes


def policy_causes(obj: Obj) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    causes: Causes = [_unmodelled("spec", key) for key in _UNMODELLED_SPEC if spec.get(key)]
    if spec.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
        causes.append(("spec.failurePolicy", "FieldValueNotSupported",
                       'Unsupported value: supported values: "Fail", "Ignore"'))
    causes += _match_causes("spec.matchConstraints", spec.get("matchConstraints"), True)
    validations = spec.get("validations")
    if not validations:
        causes.append(("spec.validations", "FieldValueRequired", "Required value"))
    for i, validation in enumerate(validations or []):
        where = f"spec.validations[{i}]"
        if not isinstance(validation, dict) or not isinstance(validation.get("expression"),
                                                              str):
            causes.append((f"{where}.expression", "FieldValueRequired", "Required value"))
            continue
        if validation.get("messageExpression"):
            causes.append(_unmodelled(where, "messageExpression"))
        if validation.get("reason", "Invalid") not in (
                "Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge"):
            causes.append((f"{where}.reason", "FieldValueNotSupported",
                           f'Unsupported value: "{validation.get("reason")}"'))
        try:
            compile_expression(validation["expression"])
        except CelError as exc:
            causes.append((f"{where}.expression", "FieldValueInvalid",
                           f"Invalid value: {validation['expression']!r}: {exc}"))
    return causes


def binding_causes(obj: Obj) -> Causes:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    causes: Causes = [_unmodelled("spec", key) for key in _UNMODELLED_BINDING if spec.get(key)]
    if not spec.get("policyName"):
        causes.append(("spec.policyName", "FieldValueRequired", "Required value"))
    actions = spec.get("validationActions")
    if not actions:
        causes.append(("spec.validationActions", "FieldValueRequired", "Required value"))
    for action in actions or []:
        if action not in ("Deny", "Warn", "Audit"):
            causes.append(("spec.validationActions", "FieldValueNotSupported",
                           f'Unsupported value: "{action}": supported values: "Audit",'
                           ' "Deny", "Warn"'))
    causes += _match_causes("spec.matchResources", spec.get("matchResources"), False)
    return causes


# -- admission -----------------------------------------------------------------------------------

def _selector_matches(selector: Any, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for req in selector.get("matchExpressions") or []:
        key, op, values = req.get("key"), req.get("operator"), req.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _has(values: Any, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def _rule_matches(rule: Obj, attrs: "Attributes") -> bool:
    return (_has(rule.get("apiGroups"), attrs.group)
            and _has(rule.get("apiVersions"), attrs.version)
            and _has(rule.get("operations"), attrs.operation)
            and _has(rule.get("resources"), attrs.plural))


def _matches(match: Any, attrs: "Attributes") -> bool:
    if not isinstance(match, dict):
        return True
    rules = match.get("resourceRules")
    if rules is not None and not any(_rule_matches(r, attrs) for r in rules):
        return False
    if any(_rule_matches(r, attrs) for r in match.get("excludeResourceRules") or []):
        return False
    if attrs.namespace_labels is not None and not _selector_matches(
            match.get("namespaceSelector"), attrs.namespace_labels):
        return False
    labels = ((attrs.obj or attrs.old or {}).get("metadata") or {}).get("labels") or {}
    return _selector_matches(match.get("objectSelector"), labels)


@dataclass(frozen=True)
class Attributes:
    """One write as admission sees it."""

    operation: str  # CREATE | UPDATE
    group: str
    version: str
    plural: str
    kind: str
    namespace: str | None
    name: str
    obj: Obj | None
    old: Obj | None
    user: Obj
    # The labels of the object's namespace (a namespace's own for namespaces); None for
    # other cluster-scoped objects, which every namespaceSelector matches.
    namespace_labels: dict[str, str] | None


def _request(attrs: Attributes) -> Obj:
    return {"operation": attrs.operation, "namespace": attrs.namespace or "",
            "name": attrs.name, "userInfo": attrs.user,
            "resource": {"group": attrs.group, "version": attrs.version,
                         "resource": attrs.plural},
            "kind": {"group": attrs.group, "version": attrs.version, "kind": attrs.kind}}


def _denied(attrs: Attributes, policy: str, binding: str, message: str,
            reason: str) -> errors.ApiError:
    why = (f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request:"
           f" {message}")
    if reason == "Forbidden":
        return errors.forbidden(attrs.plural, attrs.name, why, attrs.group)
    code = {"Unauthorized": 401, "RequestEntityTooLarge": 413}.get(reason, 422)
    qualified = f"{attrs.plural}.{attrs.group}" if attrs.group else attrs.plural
    return errors.ApiError(code, reason or "Invalid",
                           f'{qualified} "{attrs.name}" is invalid: : {why}',
                           {"name": attrs.name, "kind": attrs.plural})


def admit(attrs: Attributes, lookup: Callable[[str, str], Obj | None],
          bindings: list[Obj]) -> None:
    """Raise the policy's ApiError when a bound policy denies the write `attrs`.

    `lookup(plural, name)` reads a cluster-scoped object (the policies)."""
    if attrs.operation not in ("CREATE", "UPDATE"):
        return
    variables = {"object": attrs.obj, "oldObject": attrs.old, "request": _request(attrs)}
    for binding in sorted(bindings, key=lambda b: b["metadata"]["name"]):
        spec = binding.get("spec") or {}
        if "Deny" not in (spec.get("validationActions") or []):
            continue
        policy = lookup(POLICIES, str(spec.get("policyName") or ""))
        if policy is None:
            continue  # the real server ignores a binding to a missing policy
        policy_spec = policy.get("spec") or {}
        if not (_matches(policy_spec.get("matchConstraints"), attrs)
                and _matches(spec.get("matchResources"), attrs)):
            continue
        for validation in policy_spec.get("validations") or []:
            expression = validation["expression"]
            try:
                passed = evaluate(compile_expression(expression), variables)
                if not isinstance(passed, bool):
                    raise _EvalError("the expression is not a bool")
            except _EvalError as exc:
                if policy_spec.get("failurePolicy", "Fail") == "Ignore":
                    continue
                raise _denied(attrs, policy["metadata"]["name"], binding["metadata"]["name"],
                              f"expression '{expression}' resulted in error: {exc}",
                              "Invalid") from None
            if not passed:
                message = validation.get("message") or f"failed expression: {expression}"
                raise _denied(attrs, policy["metadata"]["name"], binding["metadata"]["name"],
                              message, validation.get("reason") or "Invalid")
