"""Drift replacement of spare nodes after a configuration change.

Aspects: every node records the hash of the label configuration it was built from; after a
reload that changes the label, the ready, unallocated spares are replaced, one at a time
with `drift-budget: {max-nodes: 1}` (the deletions of two drifted spares never overlap),
never more nodes than max-servers; nodes in use and held are untouched and keep their old
hash; `nodepool list --detail --json` reports `drifted`; nodes without a recorded hash are
never replaced. Pure budget arithmetic and the fingerprint's stability are unit-tested.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from typing import Any

from kazoo.client import KazooClient

from nodepool_k8s.core import model
from nodepool_k8s.config.fingerprint import config_hashes, drifted, label_hash
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import DisruptionBudget
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.launcher.upkeep import disruption
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import ZkConnection, replaced, wait_for
from tests.launcher.test_min_ready import settle
from tests.launchers import LauncherFactory, make_config

MAX_SERVERS = 6
BODY = f"""
labels:
  - name: small
    min-ready: 4
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: {MAX_SERVERS}
        drift-budget:
          max-nodes: 1
        labels:
          - name: small
            type: namespace
            launch-delay: 0.02
"""


def _nodes(client: KazooClient) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for child in client.get_children(paths.NODES):
        try:
            out[child] = json.loads(client.get(paths.node_path(child))[0])
        except Exception:
            continue  # deleted meanwhile
    return out


def _fulfilled(zuul: ZuulClient) -> str:
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    return request_id


def test_spares_replaced_one_at_a_time_in_use_and_held_untouched(
        launchers: LauncherFactory, zk: ZkConnection, zuul: ZuulClient,
        kazoo_client: KazooClient) -> None:
    # One provider object across the reload (the launcher replaces a provider whose
    # configuration changed): its call log and injected failures span both configurations.
    fake = FakeProvider(make_config(zk, BODY).providers["fake"])
    launcher = launchers(BODY, provider_factory=lambda cfg, clock: fake)
    settle(launcher, kazoo_client, 4)
    old_hash = label_hash(launcher.config.providers["fake"].pools["main"].labels["small"],
                          launcher.config.providers["fake"].pools["main"])
    assert {n["config_hash"] for n in _nodes(kazoo_client).values()} == {old_hash}
    # One node in use (locked by Zuul), one held.
    in_use = zuul.accept(_fulfilled(zuul))
    zuul.use(in_use)
    held = zuul.accept(_fulfilled(zuul))
    zuul.use(held)
    zuul.hold(held)
    settle(launcher, kazoo_client, 4)
    kept = {in_use.nodes[0].id, held.nodes[0].id}
    # The first drift deletion fails three times: it stays `deleting` for a while, and
    # with a budget of one no other drifted spare may be deleted meanwhile.
    fake.fail_next(3, TemporaryError("slow cloud"), op="delete")
    calls_before = len(fake.calls)
    new_text = replaced(BODY, "launch-delay: 0.02", "launch-delay: 0.03")
    launcher.reload(make_config(zk, new_text))
    new_hash = label_hash(launcher.config.providers["fake"].pools["main"].labels["small"],
                          launcher.config.providers["fake"].pools["main"])
    assert new_hash != old_hash

    def replaced_all() -> bool:
        nodes = _nodes(kazoo_client)
        spares = [n for i, n in nodes.items() if i not in kept
                  and n["state"] == model.NodeState.READY and not n["allocated_to"]]
        return len(spares) == 4 and all(n["config_hash"] == new_hash for n in spares)
    wait_for(replaced_all, 60, interval=0.05, message="every spare rebuilt")
    nodes = _nodes(kazoo_client)
    for node_id in kept:
        assert nodes[node_id]["config_hash"] == old_hash
    assert nodes[in_use.nodes[0].id]["state"] == model.NodeState.IN_USE
    assert nodes[held.nodes[0].id]["state"] == model.NodeState.HOLD
    # Deletions of drifted spares never overlapped: once the next one starts, the one
    # before is never retried again.
    deletes = [arg for name, arg in fake.calls[calls_before:]
               if name == "delete"]
    order = [d for i, d in enumerate(deletes) if i == 0 or deletes[i - 1] != d]
    assert len(order) == len(set(order)) == 4, deletes
    assert deletes[:4] == [deletes[0]] * 4  # the slow one, retried before any other
    assert fake.peak_resources() <= MAX_SERVERS
    zuul.release(in_use)


def test_cli_reports_drifted(launchers: LauncherFactory, zk: ZkConnection) -> None:
    launcher = launchers(BODY)
    config = launcher.config
    pool = config.providers["fake"].pools["main"]
    hashes = config_hashes(config)
    assert drifted("fake", "main", "small", label_hash(pool.labels["small"], pool),
                   hashes) is False
    assert drifted("fake", "main", "small", "0" * 16, hashes) is True
    assert drifted("fake", "main", "gone", "0" * 16, hashes) is None
    assert drifted("fake", "main", "small", None, hashes) is None


def test_budget_arithmetic() -> None:
    assert disruption.budget_limit(DisruptionBudget(max_nodes=2), 10) == 2
    assert disruption.budget_limit(DisruptionBudget(max_percent=25), 10) == 2
    assert disruption.budget_limit(DisruptionBudget(max_nodes=5, max_percent=10), 10) == 1
    assert disruption.budget_limit(DisruptionBudget(max_percent=10), 3) == 1
    assert disruption.budget_limit(DisruptionBudget(), 7) is None
    assert disruption.budget_limit(DisruptionBudget(max_nodes=0), 7) == 0


ONE_LABEL = textwrap.dedent("""
    zookeeper-servers:
      - host: 127.0.0.1
    labels:
      - name: small
    providers:
      - name: fake
        driver: fake
        pools:
          - name: main
            labels:
              - name: small
                type: namespace
    """)


def test_fingerprint_is_stable_and_sensitive() -> None:
    text = ONE_LABEL
    first = load_config_text(text)
    again = load_config_text(text)
    changed = load_config_text(replaced(text, "type: namespace",
                                        "type: namespace\n            launch-delay: 1"))

    def h(c: Any) -> str:
        pool = c.providers["fake"].pools["main"]
        return label_hash(pool.labels["small"], pool)
    assert h(first) == h(again)
    assert h(first) != h(changed)


def test_a_key_left_unset_is_not_part_of_the_fingerprint() -> None:
    """A release that adds an optional label key (unset by default) must not make every
    spare built by the release before look drifted; setting the key does change it."""
    text = ONE_LABEL
    pool = load_config_text(text).providers["fake"].pools["main"]
    label = pool.labels["small"]
    assert label.image_pull_secrets == () and label.dynamic_labels == {}
    # The same label as a release without these two keys would have built it.
    older = dataclasses.replace(label, image_pull_secrets=None,  # type: ignore[arg-type]
                                dynamic_labels=None)
    assert label_hash(label, pool) == label_hash(older, pool)
    relabelled = dataclasses.replace(label, dynamic_labels={"team": "ci"})
    assert label_hash(relabelled, pool) != label_hash(label, pool)


def test_min_ready_and_boot_timeout_are_not_part_of_the_fingerprint() -> None:
    """Keeping more spares, or waiting longer for one, builds no node differently."""
    text = ONE_LABEL
    pool = load_config_text(text).providers["fake"].pools["main"]
    label = pool.labels["small"]
    more = dataclasses.replace(label, min_ready=label.min_ready + 3,
                               boot_timeout=label.boot_timeout + 60)
    assert label_hash(more, pool) == label_hash(label, pool)
