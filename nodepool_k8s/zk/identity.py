"""The installation id: which cloud objects are this installation's, and so may be deleted.

Owns: deciding the id a launcher (or `nodepool delete --now`) uses, the local file that pins
it, and `/nodepool_k8s/installation-id`, the copy recorded in ZooKeeper.

The id only ever comes from the operator's side: `installation-id` in the configuration, or
the value pinned in the launcher's local state file (`installation-id-file`) at its first
start. ZooKeeper's copy is a cross-check, never a source: anything that can write ZooKeeper
could otherwise name another installation's id (it is on that installation's namespace
labels), and this launcher would sweep that installation's namespaces as leaks while its
own stopped being provably its own. Rules, in order:

* `installation-id` configured: that is the id.
* else the state file holds one: that is the id.
* else (first start, or the local state was lost) the id derived from the ZooKeeper servers
  and chroot (`config.build.installation_id`) is the id, and the launcher pins it in the
  state file, unless ZooKeeper records another one. Then nothing is adopted: the launcher
  refuses to start and says how to pin the recorded value if it is the right one (an
  installation that had its id only in ZooKeeper, after its server list changed).
* ZooKeeper records an id other than the one in force: refuse (`InstallationIdError`),
  naming the znode, both values and the repair. Nothing has started yet, so nothing in
  the cluster is touched.
* ZooKeeper records none: the launcher records it (the next launcher, or the CLI, of the
  same installation cross-checks against it). The znode and `/nodepool_k8s` get the
  configured `zookeeper-acl` even when they already exist.

How it fails: `InstallationIdError` (permanent) for a mismatch, an unreadable or invalid
state file, or one that cannot be written; ZooKeeper errors propagate (`ZkConnectionError`
is temporary, `ZkAuthError` permanent).
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import dataclass

from nodepool_k8s.core import records
from nodepool_k8s.core.errors import PermanentError
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient

log = logging.getLogger("nodepool_k8s.zk.identity")

INSTALLATION_ID_PATH = f"{paths.OWN_ROOT}/installation-id"
# A Kubernetes label value (the id is one), at most 63 characters.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
# More than any id plus a newline: a larger state file is not ours.
_MAX_FILE_BYTES = 256
_SHOWN = 80  # characters of a foreign value quoted in an error


class InstallationIdError(PermanentError):
    """The installation id cannot be settled safely; the launcher must not start (the
    message is one line naming what to repair)."""


@dataclass(frozen=True)
class Identity:
    """The id in force and where it came from (for logs and errors)."""

    value: str
    source: str


def _decode(data: bytes) -> str | None:
    try:
        # Plain text, through the record gate (size, encoding); a label value is short.
        value = records.load_text(data, 1024)
    except records.Malformed:
        return None
    return value if _LABEL_VALUE.match(value) else None


def _shown(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip()
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


# -- the local state file ------------------------------------------------------------------

def read_pinned(path: str) -> str | None:
    """The id pinned in `path`; None when the file does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InstallationIdError(
            f"cannot read the pinned installation id {path}: {exc.strerror or exc}; fix its"
            " permissions, or set installation-id in the configuration") from exc
    value = _decode(data) if len(data) <= _MAX_FILE_BYTES else None
    if value is None:
        raise InstallationIdError(
            f"{path} does not hold a usable installation id ({_shown(data)}); write the"
            " installation's id into it (the nodepool_installation_id label of its"
            " namespaces), or set installation-id in the configuration")
    return value


def pin(path: str, value: str) -> None:
    """Write `value` to `path` durably: a temporary file in the same directory, synced, then
    renamed over `path`, so a crash leaves the old file or the new one, never half of one."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".installation-id-", dir=directory)
        with os.fdopen(fd, "wb") as f:
            f.write(value.encode("utf-8") + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # not a secret: the id is on every namespace's labels
        os.replace(tmp, path)
        tmp = None
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise InstallationIdError(
            f"cannot pin the installation id {value} in {path}: {exc.strerror or exc}; make"
            " its directory writable for the launcher (systemd: StateDirectory=), point"
            " installation-id-file elsewhere, or set installation-id in the configuration"
        ) from exc
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# -- deciding -----------------------------------------------------------------------------

def _mismatch(recorded: bytes, identity: Identity) -> InstallationIdError:
    return InstallationIdError(
        f"{INSTALLATION_ID_PATH} in ZooKeeper records installation id {_shown(recorded)}, but"
        f" this installation's id is {identity.value!r} ({identity.source}); refusing to use"
        " either, so that no other installation's namespaces are taken for leaks. If"
        f" {identity.value!r} is right, someone rewrote the znode: set it back to"
        f" {identity.value} (or delete it: the launcher records its id again). If the znode"
        " is right, set installation-id to it in the configuration")


def _unpinned_conflict(recorded: bytes, derived: str, state_file: str) -> InstallationIdError:
    return InstallationIdError(
        f"{INSTALLATION_ID_PATH} in ZooKeeper records installation id {_shown(recorded)},"
        f" but neither the configuration (installation-id) nor {state_file} names one, and"
        f" the id derived from the ZooKeeper servers is {derived!r}; an id is never taken"
        " from ZooKeeper alone. If the recorded id is this installation's (the"
        " nodepool_installation_id label of its namespaces), pin it: set installation-id"
        f" in the configuration, or write it to {state_file}")


def choose(configured: str | None, derived: str, state_file: str,
           recorded: bytes | None) -> tuple[Identity, bool]:
    """The id in force, and whether it still has to be pinned in `state_file`.

    `recorded`: the znode's bytes (None: no znode). Raises `InstallationIdError`."""
    if configured:
        identity, unpinned = Identity(configured, "installation-id in the configuration"), False
    else:
        pinned = read_pinned(state_file)
        if pinned is not None:
            identity, unpinned = Identity(pinned, f"pinned in {state_file}"), False
        elif recorded is not None and _decode(recorded) != derived:
            raise _unpinned_conflict(recorded, derived, state_file)
        else:
            identity = Identity(derived, "derived from the ZooKeeper servers and chroot")
            unpinned = True
    if recorded is not None and _decode(recorded) != identity.value:
        raise _mismatch(recorded, identity)
    return identity, unpinned


def settle(zk: ZkClient, *, configured: str | None, derived: str, state_file: str,
           write: bool) -> Identity:
    """The id this process uses, checked against ZooKeeper (see the module docstring).

    `write`: a launcher pins a derived id in `state_file`, records the id in ZooKeeper when
    none is recorded, and applies the configured ACL to the znode; the CLI (`write=False`)
    only reads."""
    found = zk.get(INSTALLATION_ID_PATH)
    identity, unpinned = choose(configured, derived, state_file,
                                found[0] if found is not None else None)
    if not write:
        return identity
    if found is None:
        _record(zk, identity)
    if unpinned:
        pin(state_file, identity.value)
        log.info("Pinned installation id %s in %s (%s); it no longer changes with the"
                 " ZooKeeper server list", identity.value, state_file, identity.source)
    for path in (paths.OWN_ROOT, INSTALLATION_ID_PATH):
        zk.apply_acl(path)
    return identity


def _record(zk: ZkClient, identity: Identity) -> None:
    zk.ensure_path(paths.OWN_ROOT)
    try:
        zk.create(INSTALLATION_ID_PATH, identity.value.encode("utf-8"))
        log.info("Recorded installation id %s at %s", identity.value, INSTALLATION_ID_PATH)
        return
    except errors.NodeExistsError:
        pass  # another launcher recorded one first: it must be the same
    except errors.ZkConnectionError:
        pass  # an ambiguous create: whatever is there now decides
    found = zk.get(INSTALLATION_ID_PATH)
    if found is None:
        raise errors.ZkConnectionError(f"could not record {INSTALLATION_ID_PATH}")
    if _decode(found[0]) != identity.value:
        raise _mismatch(found[0], identity)
