"""A pool the operator paused or drained, or whose capacity awareness is off, is shown as
such: neutral, neither met nor failed.

Aspects (a launcher in process, fake driver, real ZooKeeper, min-ready 1): paused, the
pool's AtTarget reads `Paused` (status Unknown, `neutral`), not `UnderTarget`, in the
published record (the JSON of `/pool-list` and `pool-list --json`), in the table rows and
in `/metrics` (`nodepool_pool_condition_neutral` 1); drained, `Draining`; resumed, the
target is judged again. Capacity awareness off reads `Disabled`, neutral, throughout.
"""

from __future__ import annotations

from typing import Any

from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.views import pools as pool_view
from nodepool_k8s.views import prometheus
from nodepool_k8s.zk.pool_state import DRAIN, PAUSE, PoolStateStore
from tests.helpers import wait_for
from tests.launchers import LauncherFactory

CONFIG = """
labels:
  - name: small
    min-ready: 1
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 4
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
"""


def record(launcher: Launcher) -> dict[str, Any]:
    found = [r for r in launcher.engine.pool_statuses.items().values()
             if r.get("pool") == "main"]
    return dict(found[0]) if found else {}


def condition(launcher: Launcher, ctype: str) -> dict[str, Any]:
    found = [c for c in record(launcher).get("conditions") or [] if c["type"] == ctype]
    return found[0] if found else {}


def neutral_gauges(launcher: Launcher) -> dict[str, float]:
    families = prometheus.pool_families([record(launcher)])
    family = next(f for f in families if f.name == "nodepool_pool_condition_neutral")
    return {s.labels["condition"]: s.value for s in family.samples}


def test_paused_and_drained_pools_read_neutral(launchers: LauncherFactory) -> None:
    launcher = launchers(CONFIG)
    wait_for(lambda: condition(launcher, "AtTarget").get("reason") == "TargetMet", 30,
             message="the min-ready node")
    capacity = condition(launcher, "Capacity")
    assert (capacity["status"], capacity["reason"], capacity["neutral"]) \
        == ("Unknown", "Disabled", True), capacity
    assert condition(launcher, "AtTarget")["neutral"] is False
    store = PoolStateStore(launcher.zk)

    store.set("fake/main", PAUSE, "k8s upgrade", "root@vm", launcher.engine.clock.time())
    wait_for(lambda: condition(launcher, "AtTarget").get("reason") == "Paused", 30,
             message="AtTarget to read Paused")
    at_target = condition(launcher, "AtTarget")
    assert (at_target["status"], at_target["neutral"]) == ("Unknown", True), at_target
    assert "paused by root@vm (operator): k8s upgrade" in at_target["message"], at_target
    rows = pool_view.pool_rows([record(launcher)])
    assert (rows[0]["at_target"], rows[0]["capacity"]) == ("Paused", "Disabled"), rows
    gauges = neutral_gauges(launcher)
    assert gauges["AtTarget"] == gauges["Capacity"] == 1 and gauges["Quota"] == 0, gauges

    # Drained: the spare goes, and the pool says why it is not at its target.
    store.set("fake/main", DRAIN, "", "root@vm", launcher.engine.clock.time())
    wait_for(lambda: condition(launcher, "AtTarget").get("reason") == "Draining", 30,
             message="AtTarget to read Draining")
    assert condition(launcher, "AtTarget")["neutral"] is True

    store.clear("fake/main")
    wait_for(lambda: condition(launcher, "AtTarget").get("reason") == "TargetMet", 30,
             message="the target met again after the resume")
    assert condition(launcher, "AtTarget")["neutral"] is False
    assert neutral_gauges(launcher)["AtTarget"] == 0
