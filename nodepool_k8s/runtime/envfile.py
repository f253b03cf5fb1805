"""Reading a systemd `EnvironmentFile` (KEY=VALUE lines), so that the CLI sees the values the
launcher's unit gives it.

Owns: the subset of systemd's syntax an operator writes by hand: `#` and `;` comment lines,
blank lines, `KEY=VALUE` with optional whitespace around `=`, a value in single or double
quotes (quotes removed; in double quotes `\\"` and `\\\\` are unescaped), an optional leading
`export `. A line that is none of these, a key that is not a shell name, a file that cannot
be read, is not UTF-8 or is larger than `MAX_BYTES` raises `ConfigError` naming the file
and the line.
"""

from __future__ import annotations

import re

from nodepool_k8s.core.errors import ConfigError

MAX_BYTES = 1024 * 1024
_LINE = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse(text: str, path: str = "<env-file>") -> dict[str, str]:
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        match = _LINE.match(line)
        if match is None:
            raise ConfigError(f"line {number}: expected KEY=VALUE", path)
        key, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = re.sub(r'\\(["\\])', r"\1", value)
        values[key] = value
    return values


def read(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the environment file: {exc.strerror}", path) from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"larger than {MAX_BYTES} bytes", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8", path) from None
    return parse(text, path)
