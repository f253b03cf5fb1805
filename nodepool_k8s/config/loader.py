"""Read, substitute, parse, validate and build the configuration; used on every load.

Owns: the one way a `Config` comes into being (daemon start, reload, CLI, tests): reading the
main and secure files, YAML parsing (duplicate keys are errors), `%(NODEPOOL_...)s`
substitution into the parsed strings (after parsing, so a value cannot change the YAML
structure), the secure-file override, running `schema` then `checks`, and handing the result to
`build`. Also the cheap change detection used by reload (`config_fingerprint`).

How it fails: every problem raises `ConfigError` whose `.path` names the file and whose
`.problems` are `place: message` lines (all of them for schema and semantic problems; the
first one for unreadable files and invalid YAML, with line and column). A file that is not
a regular file or is over `MAX_FILE_BYTES` is not read; a document that expands (through
YAML aliases) past `MAX_VALUES` values or `MAX_DEPTH` levels, or into itself, is refused
before anything walks it. A secure file is checked before the main file, so its problems
are reported on their own. Nothing unvalidated is ever returned.
"""

from __future__ import annotations

import os
import re
import stat
import time
from typing import Any, Mapping

import yaml

from nodepool_k8s.config import build, checks, schema
from nodepool_k8s.config.model import Config
from nodepool_k8s.core.errors import ConfigError

# (absolute path, st_mtime_ns, st_size) per file; None values when the file is missing.
Fingerprint = tuple[tuple[str, int | None, int | None], ...]

# Editors often replace a file by delete + rename; a short retry rides over that window.
READ_ATTEMPTS = 3
READ_RETRY_DELAY = 0.5
# Far more than any real configuration (a large one is a few hundred KB), little enough to
# read into memory: a bigger file, or one that is not a regular file (`-c /dev/zero`), is
# refused before it is read.
MAX_FILE_BYTES = 4 * 1024 * 1024
# Bounds on the parsed document with every alias expanded, which is what the schema, the
# checks and the build walk. A real configuration has thousands of values and a dozen
# levels; a 1 KB "billion laughs" file (anchors of aliases of anchors) has billions of
# values, and aliases can nest a document deeper than the parser's own limit, or into
# itself (`&a [*a]`).
MAX_VALUES = 1_000_000
MAX_DEPTH = 100

_TOKEN = re.compile(r"%%|%\(([^()\n]*)\)s")
# Marks where a token was; letters, digits and underscores only, so it is an ordinary plain
# scalar (or part of one) wherever the token stood.
_MARKER = "__nodepool_k8s_env_{}__"
_MARKER_RE = re.compile(r"__nodepool_k8s_env_(\d+)__")
_PLAIN_TYPES = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                          "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"})


class _Whole(str):
    """A plain (unquoted) scalar that is exactly one marker: typed once substituted."""


def _typed(text: str) -> Any:
    """`text` as YAML would read it as a plain scalar, limited to numbers, bools and null."""
    tag = yaml.resolver.Resolver().resolve(  # type: ignore[no-untyped-call]
        yaml.ScalarNode, text, (True, False))
    if tag not in _PLAIN_TYPES:
        return text
    return yaml.constructor.SafeConstructor().construct_object(yaml.ScalarNode(tag, text))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unset_problem(name: str, line: int, path: tuple[Any, ...]) -> str:
    place = schema.format_path(path) or "top level"
    if name.startswith("NODEPOOL_"):
        why = f"environment variable {name} is not set"
    else:
        why = (f"%({name})s is not substituted: only environment variables whose"
               f" names start with NODEPOOL_ are (write %%({name})s for a literal)")
    return f"{place}: {why} (line {line})"


# What a command that only talks to ZooKeeper needs of the main file (`load_connection`).
CONNECTION_KEYS = frozenset({"zookeeper-servers", "zookeeper-tls", "zookeeper-auth",
                             "zookeeper-acl", "zookeeper-timeout", "installation-id",
                             "installation-id-file"})


def load_config(path: str, secure: str | None = None,
                env: Mapping[str, str] = os.environ) -> Config:
    """Load and validate the main file (and the secure file, if given)."""
    text = _read(path)
    secure_text = _read(secure) if secure is not None else None
    sources = (os.path.abspath(path),) + ((os.path.abspath(secure),) if secure else ())
    return _load(text, path, secure_text, secure or "<secure>", env, sources)


def load_connection(path: str, secure: str | None = None,
                    env: Mapping[str, str] = os.environ) -> tuple[Config, ConfigError | None]:
    """The whole configuration if it is valid; else one built from its ZooKeeper keys alone
    (no providers, no labels) and the error the whole file gave.

    For the CLI's commands that only read or mark records: an operator recovering from a
    bad configuration push keeps `list`, `hold` and `delete`. The file must still be
    readable YAML and its ZooKeeper keys valid; otherwise the whole file's error is raised.
    """
    text = _read(path)
    secure_text = _read(secure) if secure is not None else None
    sources = (os.path.abspath(path),) + ((os.path.abspath(secure),) if secure else ())
    try:
        return _load(text, path, secure_text, secure or "<secure>", env, sources), None
    except ConfigError as whole:
        try:
            config = _load(text, path, secure_text, secure or "<secure>", env, sources,
                           only=CONNECTION_KEYS)
        except ConfigError:
            raise whole from None
        return config, whole


def load_config_text(text: str, path: str = "<string>", secure_text: str | None = None,
                     secure_path: str = "<secure>",
                     env: Mapping[str, str] | None = None) -> Config:
    """Like `load_config` for in-memory text (tests); `path` only labels the messages."""
    return _load(text, path, secure_text, secure_path,
                 os.environ if env is None else env, ())


def config_fingerprint(path: str, secure: str | None = None) -> Fingerprint:
    """A cheap value that changes when either file is edited, replaced or removed."""
    out: list[tuple[str, int | None, int | None]] = []
    for name in (path, secure):
        if name is None:
            continue
        full = os.path.abspath(name)
        try:
            st = os.stat(full)
        except OSError:
            out.append((full, None, None))
        else:
            out.append((full, st.st_mtime_ns, st.st_size))
    return tuple(out)


def mark(text: str) -> tuple[str, list[tuple[str | None, int]]]:
    """Replace every `%(NAME)s` and `%%` in `text` with an inert marker, before parsing.

    Returns the marked text and, per marker index, (variable name, line); `%%` has the name
    None. The markers are plain identifiers, so the YAML structure is decided by the file
    alone; `resolve` puts the values into the parsed strings afterwards. A lone `%` is left
    as it is.
    """
    tokens: list[tuple[str | None, int]] = []

    def replace(match: re.Match[str]) -> str:
        tokens.append((match.group(1), text.count("\n", 0, match.start()) + 1))
        return _MARKER.format(len(tokens) - 1)

    return _TOKEN.sub(replace, text), tokens


def resolve(data: Any, tokens: list[tuple[str | None, int]], env: Mapping[str, str],
            problems: list[str], path: tuple[Any, ...] = ()) -> Any:
    """`data` with the markers of `mark` replaced, in string scalars (values and keys) only.

    An environment value is inserted as text and never parsed as YAML, so it cannot add
    keys, items, anchors or tags. An unquoted scalar that is exactly one token takes the
    type YAML gives that text as a plain scalar (int, float, bool or null; anything else
    stays a string), so `port: %(NODEPOOL_ZK_PORT)s` is a number. Markers that do not
    resolve (unset, or not a NODEPOOL_ variable) add one line to `problems`; markers in
    comments never reach here.
    """
    if isinstance(data, str):
        if not tokens or _MARKER_RE.search(data) is None:
            return data
        missing: list[str] = []

        def value(match: re.Match[str]) -> str:
            name, line = tokens[int(match.group(1))]
            if name is None:
                return "%"
            if name.startswith("NODEPOOL_") and name in env:
                found = env[name]
                if _encodable(found):
                    return found
                # os.environ keeps undecodable bytes as lone surrogates, which fail much
                # later (hashing, DNS) with a traceback instead of one clear line here.
                place = schema.format_path(path) or "top level"
                missing.append(f"{place}: environment variable {name} is not valid UTF-8"
                               f" (line {line})")
                return match.group(0)
            missing.append(_unset_problem(name, line, path))
            return match.group(0)

        text = _MARKER_RE.sub(value, data)
        problems.extend(missing)
        if isinstance(data, _Whole) and not missing:
            return _typed(text)
        return text
    if isinstance(data, dict):
        return {resolve(k, tokens, env, problems, path):
                resolve(v, tokens, env, problems, path + (k,)) for k, v in data.items()}
    if isinstance(data, list):
        return [resolve(v, tokens, env, problems, path + (i,)) for i, v in enumerate(data)]
    return data


# -- internals -----------------------------------------------------------------------------------


def _open_nonblocking(path: str, flags: int) -> int:
    # Opening a FIFO for reading would wait for a writer; non-blocking, it opens at once
    # and is refused as not a regular file. A regular file reads the same either way.
    return os.open(path, flags | os.O_NONBLOCK)


def _read(path: str) -> str:
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            with open(path, encoding="utf-8", opener=_open_nonblocking) as handle:
                info = os.fstat(handle.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise ConfigError("cannot read the file: not a regular file", path)
                if info.st_size > MAX_FILE_BYTES:
                    raise ConfigError(_too_big(info.st_size), path)
                text = handle.read(MAX_FILE_BYTES + 1)  # bounded: it may grow meanwhile
            if len(text) > MAX_FILE_BYTES:
                raise ConfigError(_too_big(len(text)), path)
            return text
        except FileNotFoundError:
            if attempt == READ_ATTEMPTS:
                raise ConfigError("cannot read the file: it does not exist", path) from None
            time.sleep(READ_RETRY_DELAY)
        except UnicodeDecodeError as exc:
            raise ConfigError(f"cannot read the file: not UTF-8 text ({exc.reason} at byte"
                              f" {exc.start})", path) from None
        except OSError as exc:
            raise ConfigError(f"cannot read the file: {exc.strerror or exc}", path) from None
    raise AssertionError("unreachable")


def _too_big(size: int) -> str:
    return (f"cannot read the file: it has more than {MAX_FILE_BYTES} bytes ({size}),"
            " too many for a configuration")


def _check_expansion(data: Any, path: str) -> None:
    """Refuse a document that expands to more than `MAX_VALUES` values (keys, items and
    scalars; an alias counts as often as it is used) or nests more than `MAX_DEPTH` levels.

    Aliases share one parsed object, so each collection is measured once, by identity, and
    its size reused at every reference: the check takes time in proportion to the file, not
    to its expansion, and refuses an alias bomb in milliseconds. Iterative, so depth alone
    cannot exhaust the stack."""
    measured: dict[int, tuple[int, int]] = {}  # id -> (values, depth)
    open_ids: set[int] = set()  # collections being measured: meeting one again is a cycle
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        item, finish = stack.pop()
        key = id(item)
        members = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        if finish:
            values, depth = 1, 1
            for member in members:
                size, levels = (measured[id(member)] if isinstance(member, (dict, list))
                                else (1, 0))
                values, depth = values + size, max(depth, levels + 1)
            if values > MAX_VALUES:
                raise ConfigError(f"config expands to more than {MAX_VALUES} values"
                                  " (YAML aliases?)", path)
            if depth > MAX_DEPTH:
                raise ConfigError(f"config nests more than {MAX_DEPTH} levels deep", path)
            measured[key] = (values, depth)
            open_ids.discard(key)
        elif key in open_ids:
            raise ConfigError("config contains itself (a YAML alias inside its own anchor)",
                              path)
        elif key not in measured:
            open_ids.add(key)
            stack.append((item, True))
            stack.extend((m, False) for m in members if isinstance(m, (dict, list)))


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML loading that rejects duplicate keys (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # keys merged in with `<<` may legitimately be overridden
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_line
            except TypeError:
                continue  # unhashable key: the base class reports it
            if seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first_line[key] + 1})",
                    key_node.start_mark)
            first_line[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_str(self, node: yaml.ScalarNode) -> Any:
        text = super().construct_yaml_str(node)
        # Plain style is None in PyYAML's parser and "" in libyaml's.
        if not node.style and _MARKER_RE.fullmatch(text):
            return _Whole(text)
        return text


_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "syntax error"
        context = ""
        if exc.context and exc.problem and exc.context_mark is not None:
            context = (f" ({exc.context} at line {exc.context_mark.line + 1},"
                       f" column {exc.context_mark.column + 1})")
        return f"invalid YAML{where}: {problem}{context}"
    return f"invalid YAML: {exc}"


def _parse(text: str, path: str, env: Mapping[str, str]) -> Any:
    marked, tokens = mark(text)
    try:
        data = yaml.load(marked, Loader=_Loader)  # noqa: S506 - a safe loader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_problem(exc), path) from None
    if isinstance(data, (dict, list)):
        _check_expansion(data, path)  # before anything walks it, `resolve` first
    problems: list[str] = []
    data = resolve(data, tokens, env, problems)
    if problems:
        raise ConfigError(problems, path)
    return data


def _load(text: str, path: str, secure_text: str | None, secure_path: str,
          env: Mapping[str, str], sources: tuple[str, ...],
          only: frozenset[str] | None = None) -> Config:
    data = _parse(text, path, env)
    if data is None:
        data = {}  # an empty file; the schema then says what is missing
    if only is not None and isinstance(data, dict):
        data = {key: value for key, value in data.items() if key in only}
    warnings: list[str] = []
    override: dict[str, Any] = {}
    if secure_text is not None:
        secure = _parse(secure_text, secure_path, env)
        secure = {} if secure is None else secure
        normalised, problems = schema.validate_secure(secure)
        if not problems:
            problems, secure_warnings = checks.check_secure(normalised)
            warnings += [f"{secure_path}: {w}" for w in secure_warnings]
        if problems:
            raise ConfigError(problems, secure_path)
        override = {k: secure[k] for k in schema.SECURE_KEYS if k in secure}
    merged = {**data, **override} if isinstance(data, dict) else data
    normalised, problems = schema.validate(merged)
    if problems:
        raise ConfigError(problems, path)
    errors, main_warnings = checks.check(normalised, skip=override)
    if errors:
        raise ConfigError(errors, path)
    warnings += [f"{path}: {w}" for w in main_warnings]
    return build.build_config(normalised, sources=sources, warnings=tuple(warnings))
