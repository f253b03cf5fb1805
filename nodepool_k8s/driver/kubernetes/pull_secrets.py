"""Copies of the operator's image pull Secrets into a node's namespace (`image-pull-secrets`).

Owns: reading each Secret a pod label names (and only those: nothing is listed, nothing
else copied), judging what was read (a registry credential type, a bounded size), the copy
(the source's type and data, under the same name, with the labels every object of the node
carries) and accepting a copy that already exists only when it is provably this node's.

How it fails: a named Secret that does not exist raises LaunchError `PullSecretMissing`,
one of another type, too large or unreadable raises LaunchError `PullSecretRefused` (both
not retryable: the operator must act); API errors are the client's (`errors`): temporary
ones are retried by `KubeClient.call` and then passed on, so the attempt fails and is
retried like any other phase; a 403 on reading the source is `Forbidden` (the launcher
lacks `get` there).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Mapping

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.model import PoolLabel, PullSecret
from nodepool_k8s.core.errors import LaunchError, NotFound
from nodepool_k8s.driver.kubernetes import manifests
from nodepool_k8s.driver.kubernetes.bodies import Secret
from nodepool_k8s.driver.kubernetes.client import KubeClient, Sleeper
from nodepool_k8s.driver.kubernetes.errors import Conflict, Forbidden

# Repeats of a copy's create refused with 403, and the waits before them. With `job-role:
# cluster-role` the right to create it comes from the RoleBinding made in the namespace a
# moment earlier, which the API server's authorizer learns of from a watch.
FORBIDDEN_WAITS = (0.2, 0.5, 1.0, 2.0)


def data_size(data: Mapping[str, Any]) -> int | None:
    """Bytes of keys and decoded values of a Secret's `data`; None when it is not a
    mapping of base64 strings."""
    total = 0
    for key, value in data.items():
        if not isinstance(key, str) or not isinstance(value, str):
            return None
        try:
            total += len(key.encode()) + len(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            return None
    return total


def refusal(source: Mapping[str, Any]) -> str | None:
    """Why the Secret `source` (as read) is not copied; None when it may be."""
    kind = source.get("type")
    if kind not in S.PULL_SECRET_TYPES:
        return (f"its type is {str(kind)[:80]!r}; only {' and '.join(S.PULL_SECRET_TYPES)}"
                " Secrets are copied")
    data = source.get("data")
    if not isinstance(data, Mapping) or not data:
        return "it holds no data"
    size = data_size(data)
    if size is None:
        return "its data is not a mapping of base64 values"
    if size > S.MAX_PULL_SECRET_BYTES:
        return f"its data has {size} bytes, over the {S.MAX_PULL_SECRET_BYTES} allowed"
    return None


def copy_body(namespace: str, pull: PullSecret, source: Mapping[str, Any],
              labels: Mapping[str, str]) -> Secret:
    """The copy: only the source's type and data (no annotations, owner references or
    labels of the source), our labels."""
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": pull.name, "namespace": namespace, "labels": dict(labels)},
            "type": str(source["type"]),
            "data": {str(k): str(v) for k, v in dict(source["data"]).items()}}


def _where(pull: PullSecret) -> str:
    return f"{pull.namespace}/{pull.name}"


def read_source(client: KubeClient, pull: PullSecret, sleep: Sleeper) -> dict[str, Any]:
    """The named Secret, judged usable; LaunchError when it is missing or refused."""
    try:
        source = client.call(f"read image pull Secret {_where(pull)}",
                             client.core.read_namespaced_secret, pull.name, pull.namespace,
                             sleep=sleep)
    except NotFound as exc:
        raise LaunchError(f"image pull Secret {_where(pull)} does not exist: create it there"
                          " or fix the label's image-pull-secrets",
                          reason="PullSecretMissing", retryable=False) from exc
    problem = refusal(source)
    if problem is not None:
        raise LaunchError(f"image pull Secret {_where(pull)} is not copied: {problem}",
                          reason="PullSecretRefused", retryable=False)
    return source


def copy_all(client: KubeClient, namespace: str, label: PoolLabel, labels: Mapping[str, str],
             provider_name: str, installation_id: str, node_id: str, sleep: Sleeper) -> None:
    """Copy every pull Secret of `label` into `namespace` (the node's, just created)."""
    for pull in label.image_pull_secrets:
        body = copy_body(namespace, pull, read_source(client, pull, sleep), labels)
        what = f"create secret {namespace}/{pull.name} (copy of {_where(pull)})"
        created: dict[str, Any] = {}
        for wait in (*FORBIDDEN_WAITS, None):
            try:
                created = client.call(what, client.core.create_namespaced_secret, namespace,
                                      body, sleep=sleep, created_ok=True)
                break
            except Forbidden:
                if wait is None or sleep(wait):
                    raise
        if not created:
            # A repeated create met 409: accepted only when the copy there is this node's
            # (the earlier try reached the server), never an object someone else put there.
            _require_own_copy(client, namespace, pull, provider_name, installation_id,
                              node_id, sleep)


def _require_own_copy(client: KubeClient, namespace: str, pull: PullSecret,
                      provider_name: str, installation_id: str, node_id: str,
                      sleep: Sleeper) -> None:
    try:
        existing = client.call(f"read secret {namespace}/{pull.name}",
                               client.core.read_namespaced_secret, pull.name, namespace,
                               sleep=sleep)
    except NotFound as exc:
        raise Conflict(f"secret {namespace}/{pull.name} vanished after a 409") from exc
    problem = manifests.ownership_problem(existing, provider_name, installation_id, node_id)
    if problem is not None:
        raise Conflict(f"secret {namespace}/{pull.name} exists and is not our copy:"
                       f" {problem}")
