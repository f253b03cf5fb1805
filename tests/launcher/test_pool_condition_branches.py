"""Every reason of the published pool conditions Validated, AtTarget and Quota, reached by a
running launcher (real ZooKeeper, fake driver) and read back from ZooKeeper.

Aspects:
- a label that cannot fit even in an empty pool (more cores than `max-cores`) makes
  `Validated` False, LabelExceedsLimits, naming the label;
- min-ready above what `max-servers` lets the pool build: `AtTarget` False, UnderTarget
  (spare/wanted), and `Quota` False, AtLimit, naming the pool limit and usage;
- a provider's `max-servers` below its pool's: `Quota` AtLimit names the provider limit;
- min-ready lowered below the spares built: `AtTarget` True, OverTarget;
- `max-servers: 0` while a node is in use: `Validated` False, Disabled (neutral) and
  `AtTarget` False, Draining with the nodes left; released, TargetMet "disabled and empty".
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.zk.pool_status import POOL_STATUS, decode_pool_status, read_all
from tests.helpers import ZkConnection, replaced, wait_for
from tests.launchers import TEST_SETTINGS, LauncherFactory, make_config

# Counts in a message are published at most once per interval: short, so the test does
# not wait for the default.
SETTINGS = dataclasses.replace(TEST_SETTINGS, pool_status_interval=0.2)

BODY = """
labels:
  - name: small
    min-ready: 3
  - name: huge
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 2
        max-cores: 4
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
          - name: huge
            type: pod
            cpu: 8
            memory: 512
"""


def published(launcher: Launcher) -> dict[str, Any]:
    """The pool's record as stored in ZooKeeper (not the launcher's memory)."""
    found = [r for r in read_all(launcher.zk, POOL_STATUS, decode_pool_status).values()
             if r.get("pool") == "main"]
    return found[0] if found else {}


def reason(launcher: Launcher, ctype: str) -> tuple[str, str, str]:
    for c in published(launcher).get("conditions") or []:
        if c["type"] == ctype:
            return c["status"], c["reason"], c["message"]
    return "", "", ""


def test_limits_and_targets(launchers: LauncherFactory, zk: ZkConnection) -> None:
    launcher = launchers(BODY, settings=SETTINGS)
    wait_for(lambda: reason(launcher, "AtTarget")[2] == "spare/wanted: small 2/3"
             and reason(launcher, "Quota")[1] == "AtLimit", 30,
             message="the pool full (two spares ready) below its target")
    status, why, message = reason(launcher, "Validated")
    assert (status, why) == ("False", "LabelExceedsLimits")
    assert "huge" in message and "small" not in message
    assert reason(launcher, "AtTarget") == ("False", "UnderTarget", "spare/wanted: small 2/3")
    status, why, message = reason(launcher, "Quota")
    assert (status, why) == ("False", "AtLimit")
    assert message.startswith("pool limit binds") and "pool instances 2/2" in message

    # The provider's own limit binds first.
    tighter = replaced(BODY, "    pools:\n", "    max-servers: 1\n    pools:\n")
    launcher.reload(make_config(zk, tighter))
    wait_for(lambda: "provider instances 2/1" in reason(launcher, "Quota")[2], 30,
             message="the provider limit named")
    assert reason(launcher, "Quota")[:2] == ("False", "AtLimit")

    # Fewer wanted than built: over target, which is no fault.
    fewer = replaced(BODY, "min-ready: 3", "min-ready: 1")
    launcher.reload(make_config(zk, fewer))
    wait_for(lambda: reason(launcher, "AtTarget")[1] == "OverTarget", 30,
             message="AtTarget OverTarget")
    assert reason(launcher, "AtTarget") == ("True", "OverTarget", "spare/wanted: small 2/1")


DISABLE = """
labels:
  - name: small
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
        max-servers: 3
        labels:
          - name: small
            type: namespace
            launch-delay: 0.01
"""


def test_disabled_pool_drains(launchers: LauncherFactory, zk: ZkConnection,
                              zuul: ZuulClient) -> None:
    launcher = launchers(DISABLE, settings=SETTINGS)
    request_id = zuul.submit(["small"])
    body = zuul.wait(request_id)
    assert body is not None and body["state"] == "fulfilled"
    held = zuul.accept(request_id)
    zuul.use(held)
    launcher.reload(make_config(zk, replaced(DISABLE, "max-servers: 3", "max-servers: 0")))
    wait_for(lambda: reason(launcher, "Validated")[1] == "Disabled", 30,
             message="Validated Disabled")
    assert reason(launcher, "AtTarget") == ("False", "Draining", "1 node(s) left")
    validated = next(c for c in published(launcher)["conditions"]
                     if c["type"] == "Validated")
    assert (validated["status"], validated["neutral"]) == ("False", True)
    zuul.release(held)
    wait_for(lambda: reason(launcher, "AtTarget")[1] == "TargetMet", 30,
             message="the disabled pool empty")
    assert reason(launcher, "AtTarget") == ("True", "TargetMet", "disabled and empty")
