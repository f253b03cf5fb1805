"""The installation id recorded in ZooKeeper.

Owns: `/nodepool_k8s/installation-id`, written once by the first launcher of an
installation that does not set `installation-id` in its configuration. Every launcher and
the CLI use the recorded value from then on, so the labels that prove a cloud object is
ours stay the same when the ZooKeeper host list changes (a server added or replaced),
which would change an id derived from the hosts.

Failure modes: a recorded value that is not a usable label value (a hand edit) is logged
with its path and ignored in favour of the derived one; ZooKeeper errors propagate
(`ZkConnectionError` is temporary: the caller retries or fails its start).
"""

from __future__ import annotations

import logging
import re

from nodepool_k8s import records
from nodepool_k8s.zk import errors, paths
from nodepool_k8s.zk.client import ZkClient

log = logging.getLogger("nodepool_k8s.zk.identity")

INSTALLATION_ID_PATH = f"{paths.OWN_ROOT}/installation-id"
# A Kubernetes label value (the id is one), at most 63 characters.
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")


def _decode(data: bytes) -> str | None:
    try:
        # Plain text, through the record gate (size, encoding); a label value is short.
        value = records.load_text(data, 1024)
    except records.Malformed:
        return None
    return value if _LABEL_VALUE.match(value) else None


def recorded_installation_id(zk: ZkClient) -> str | None:
    """The recorded id, or None when none (or an unusable one) is recorded."""
    found = zk.get(INSTALLATION_ID_PATH)
    if found is None:
        return None
    value = _decode(found[0])
    if value is None:
        log.warning("Ignoring %s: not a usable installation id (%d bytes)",
                    INSTALLATION_ID_PATH, len(found[0]))
    return value


def resolve_installation_id(zk: ZkClient, derived: str) -> str:
    """The recorded id; records `derived` first when none is recorded yet."""
    value = recorded_installation_id(zk)
    if value is not None:
        return value
    if zk.get(INSTALLATION_ID_PATH) is not None:
        return derived  # unusable record (logged): leave it for the operator to fix
    zk.ensure_path(paths.OWN_ROOT)
    try:
        zk.create(INSTALLATION_ID_PATH, derived.encode("utf-8"))
        log.info("Recorded installation id %s at %s", derived, INSTALLATION_ID_PATH)
        return derived
    except errors.NodeExistsError:
        # Another launcher recorded one first: use that.
        return recorded_installation_id(zk) or derived
    except errors.ZkConnectionError:
        # Ambiguous create: whatever is there now (ours or another's) is the answer.
        return recorded_installation_id(zk) or derived
