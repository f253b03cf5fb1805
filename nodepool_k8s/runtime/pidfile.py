"""The launcher's pid file (`nodepool-launcher -p PIDFILE`, as Nodepool's launcher takes it).

Owns: writing this process's id when it starts, refusing to start while the file names
another live process, and removing the file at exit only if it still names this process
(a successor's file is never removed). The file is written to a temporary name in the same
directory and renamed over the old one, so a reader never sees half a number.

How it fails: `PidFileError` (a `ConfigError`, so the launcher exits 1 with one line) when
the directory is not writable, when the file is held by a live process, or when an existing
file cannot be read; a stale file (a pid that no longer runs, or text that is not a pid) is
replaced with a warning.
"""

from __future__ import annotations

import logging
import os
import tempfile

from nodepool_k8s.core.errors import ConfigError

log = logging.getLogger(__name__)

MAX_BYTES = 64


class PidFileError(ConfigError):
    """The pid file cannot be claimed."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _holder(path: str) -> int | None:
    """The live process the file names, if any."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PidFileError(f"cannot read the pid file: {exc.strerror}", path) from None
    try:
        pid = int(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        log.warning("Replacing pid file %s: it does not hold a process id", path)
        return None
    if pid > 0 and pid != os.getpid() and _alive(pid):
        return pid
    log.warning("Replacing stale pid file %s (process %d is not running)", path, pid)
    return None


def claim(path: str) -> None:
    """Write this process's id to `path`, unless a live process already holds it."""
    holder = _holder(path)
    if holder is not None:
        raise PidFileError(f"process {holder} is running with this pid file; stop it first"
                           " or choose another -p", path)
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, temp = tempfile.mkstemp(prefix=".pid-", dir=directory)
    except OSError as exc:
        raise PidFileError(f"cannot write the pid file: {exc.strerror}", path) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except OSError as exc:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise PidFileError(f"cannot write the pid file: {exc.strerror}", path) from None


def release(path: str) -> None:
    """Remove `path` if it still names this process; never raises."""
    try:
        with open(path, "rb") as f:
            mine = f.read(MAX_BYTES).strip() == str(os.getpid()).encode()
        if mine:
            os.unlink(path)
    except OSError as exc:
        log.warning("Could not remove pid file %s: %s", path, exc)
