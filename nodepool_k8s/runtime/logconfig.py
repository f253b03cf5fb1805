"""Logging set-up for the daemon and the CLI.

Owns: reading an operator's logging file (`-l`: `.yaml`/`.yml`/`.json` as a dictConfig,
anything else as an INI fileConfig, like Nodepool) or installing the default: one line per
record on stderr, `%(asctime)s %(levelname)s %(name)s: %(message)s`. A broken logging file
raises `ConfigError` naming the file, before the daemon starts doing work.

`annotate(log, event_id=..., request_id=..., node_id=...)` returns an adapter whose lines
carry Nodepool's `[e: ...] [node_request: ...] [node: ...]` prefixes, so one job can be
followed through the log.
"""

from __future__ import annotations

import json
import logging
import logging.config
from typing import Any, MutableMapping

import yaml

from nodepool_k8s.core.errors import ConfigError

DEFAULT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup(path: str | None = None, debug: bool = False) -> None:
    if path is None:
        logging.basicConfig(level=logging.DEBUG if debug else logging.INFO,
                            format=DEFAULT_FORMAT, force=True)
        # The kubernetes client logs whole request bodies (tokens) at DEBUG: never enable it.
        logging.getLogger("kubernetes").setLevel(logging.INFO)
        logging.getLogger("kazoo").setLevel(logging.WARNING if not debug else logging.INFO)
        return
    try:
        if path.endswith((".yaml", ".yml", ".json")):
            with open(path) as f:
                data = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
            if not isinstance(data, dict):
                raise ConfigError("logging config must be a mapping", path)
            # As for INI files: loggers made before this call (module-level ones, kazoo's)
            # keep logging unless the file itself says to disable them.
            data.setdefault("disable_existing_loggers", False)
            logging.config.dictConfig(data)
        else:
            logging.config.fileConfig(path, disable_existing_loggers=False)
    except ConfigError:
        raise
    except Exception as exc:  # any parse or handler error: report the file, do not start
        raise ConfigError(f"invalid logging configuration: {exc}", path) from exc


class _Annotated(logging.LoggerAdapter[logging.Logger]):
    def __init__(self, logger: logging.Logger, prefix: str) -> None:
        super().__init__(logger, {})
        self.prefix = prefix

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"{self.prefix}{msg}", kwargs


def annotate(logger: logging.Logger, event_id: str | None = None,
             request_id: str | None = None,
             node_id: str | None = None) -> logging.LoggerAdapter[logging.Logger]:
    parts = []
    if event_id:
        parts.append(f"[e: {event_id}]")
    if request_id:
        parts.append(f"[node_request: {request_id}]")
    if node_id:
        parts.append(f"[node: {node_id}]")
    prefix = " ".join(parts) + (" " if parts else "")
    return _Annotated(logger, prefix)
