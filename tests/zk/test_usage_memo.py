"""The usage records kept per node-cache entry (`quota_guard.UsageMemo`).

Aspects: an entry's record is made once and reused while the cache holds that very entry;
a new version of the node (a new entry object) is priced afresh, tenant included; a node
without usable `resources` is priced from the label's quota each time, so a reload that
changes that quota counts at once; whole records (not cache summaries) are never kept;
entries the cache dropped are pruned once the memo outgrows what it kept.
"""

from __future__ import annotations

from typing import Any

from nodepool_k8s.core import quota
from nodepool_k8s.core.model import Node, Resources
from nodepool_k8s.zk.quota_guard import UsageMemo


class Cache:
    """A node cache as the memo sees it: id -> entry."""

    def __init__(self) -> None:
        self.items: dict[str, Node] = {}

    def get(self, node_id: str) -> Node | None:
        return self.items.get(node_id)

    def put(self, node: Node) -> Node:
        self.items[node.id] = node
        return node


def summary(node_id: str, version: int = 0, **data: Any) -> Node:
    record = {"state": "ready", "provider": "p", "pool": "main", "type": ["small"],
              "resources": {"instances": 1, "cores": 2}} | data
    return Node.from_dict(node_id, record, version, summary=True)


class Quota:
    """The label quota of nodes without resources; counts its lookups."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.asked = 0

    def __call__(self, node: quota.NodeUsage) -> Resources | None:
        self.asked += 1
        return Resources({"instances": 1, "cores": self.cores})


def test_an_entry_is_priced_once_while_the_cache_holds_it() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(9)
    node = cache.put(summary("0000000001", tenant_name="t1"))
    first = memo.record(node.id, node, fallback, cache)
    assert first.resources == Resources({"instances": 1, "cores": 2})
    assert (first.provider, first.pool, first.tenant) == ("p", "main", "t1")
    assert memo.record(node.id, node, fallback, cache) is first
    assert fallback.asked == 0  # the node's own resources: the label's quota is not needed


def test_a_new_version_of_the_node_is_priced_afresh() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(9)
    node = cache.put(summary("0000000001", tenant_name="t1"))
    memo.record(node.id, node, fallback, cache)
    reused = cache.put(summary("0000000001", version=1, tenant_name="t2"))
    assert memo.record(reused.id, reused, fallback, cache).tenant == "t2"
    # An equal record under another object (a re-read of the same version) is not
    # trusted either: only the very entry priced before is.
    again = cache.put(summary("0000000001", version=1, tenant_name="t3"))
    assert memo.record(again.id, again, fallback, cache).tenant == "t3"


def test_a_node_without_resources_follows_the_label_quota() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(4)
    node = cache.put(summary("0000000001", resources=None))
    assert memo.record(node.id, node, fallback, cache).resources["cores"] == 4
    fallback.cores = 6  # a configuration reload changed the label's quota
    assert memo.record(node.id, node, fallback, cache).resources["cores"] == 6
    assert fallback.asked == 2


def test_whole_records_are_not_kept() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(9)
    node = Node.from_dict("0000000001", {"state": "building", "provider": "p",
                                         "pool": "main", "resources": {"cores": 2}})
    first = memo.record(node.id, node, fallback, cache)
    node.tenant_name = "t9"  # a whole record may be changed in place before it is written
    assert memo.record(node.id, node, fallback, cache).tenant == "t9"
    assert first.tenant is None
    assert len(memo) == 0


def test_entries_the_cache_dropped_are_pruned() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(9)
    floor = UsageMemo.MEMO_FLOOR
    for i in range(floor):
        node = summary(f"{i:010d}")
        memo.record(node.id, node, fallback, cache)  # priced, then gone from the cache
    live = [cache.put(summary(f"{floor + i:010d}")) for i in range(10)]
    for node in live:
        memo.record(node.id, node, fallback, cache)
    assert len(memo) == len(live)
    kept = memo.record(live[0].id, live[0], fallback, cache)
    assert memo.record(live[0].id, live[0], fallback, cache) is kept


def test_equal_resources_are_shared_but_not_across_a_zeros_sign() -> None:
    memo, cache, fallback = UsageMemo(), Cache(), Quota(9)
    one, two, negative = (cache.put(summary(f"000000000{i}", resources=resources))
                          for i, resources in enumerate(
                              ({"instances": 1, "ram": 0}, {"instances": 1, "ram": 0},
                               {"instances": 1, "ram": -0.0})))
    first = memo.record(one.id, one, fallback, cache).resources
    assert memo.record(two.id, two, fallback, cache).resources is first
    signed = memo.record(negative.id, negative, fallback, cache).resources
    assert signed is not first and str(signed["ram"]) == "-0.0"
