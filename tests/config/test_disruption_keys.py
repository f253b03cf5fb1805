"""The spare-removal keys: `disruption-budgets`, `surplus-delay`, `max-age` (label, pool
label, pool default) and `drift-budget` as a drift-only budget.

Aspects: counts and shares build into `DisruptionBudget`s (all reasons when none named);
`drift-budget` becomes a drift-only budget closed outside its window; max-age resolves pool
label, then the pool's default; a share above 100%, a word, an unknown reason and a window
without its duration are errors at load naming the key.
"""

from __future__ import annotations

import pytest

from nodepool_k8s.config import schema as S
from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import Config, DisruptionBudget
from nodepool_k8s.core.errors import ConfigError

BASE = """
zookeeper-servers: [{host: localhost}]
labels:
  - name: small
    max-age: 3600
  - name: big
    max-age: 60
providers:
  - name: fake
    driver: fake
    pools:
      - name: main
POOL
        labels:
          - name: small
            max-age: 600
          - name: big
"""


def load(pool: str) -> Config:
    lines = "".join(f"        {line}\n" for line in pool.strip().splitlines())
    return load_config_text(BASE.replace("POOL\n", lines))


def test_keys_build() -> None:
    config = load("""
surplus-delay: 120
default-label-max-age: 86400
drift-budget: {max-nodes: 2, schedule: "0 2 * * *", duration: 1h}
disruption-budgets:
  - nodes: 20%
    reasons: [surplus]
  - nodes: 3
""")
    pool = config.providers["fake"].pools["main"]
    assert pool.surplus_delay == 120
    assert pool.label_max_age == {"small": 600, "big": 86400}
    assert config.labels["small"].max_age == 3600
    assert pool.disruption_budgets == (
        DisruptionBudget(reasons=("surplus",), max_percent=20.0),
        DisruptionBudget(max_nodes=3),
        DisruptionBudget(reasons=("drift",), max_nodes=2, schedule="0 2 * * *",
                         duration=3600.0, outside_window=0))
    assert DisruptionBudget().reasons == S.DISRUPTION_REASONS


def test_defaults() -> None:
    pool = load("priority: 100").providers["fake"].pools["main"]
    assert pool.surplus_delay == S.SURPLUS_DELAY
    assert pool.disruption_budgets == ()
    assert pool.label_max_age == {"small": 600}


@pytest.mark.parametrize("budget, error", [
    ("{nodes: 101%}", "disruption-budgets[0].nodes: a percentage must be between"),
    ("{nodes: many}", "disruption-budgets[0].nodes: expected a node count or a percentage"),
    ("{nodes: 1, reasons: [boredom]}", "disruption-budgets[0].reasons[0]: expected one of"),
    ("{nodes: 1, schedule: '0 1 * * *'}",
     "disruption-budgets[0].duration: schedule and duration must be given together"),
    ("{nodes: 1, schedule: '0 25 * * *', duration: 1h}",
     "disruption-budgets[0].schedule: not a 5-field cron schedule"),
])
def test_bad_budgets(budget: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load(f"disruption-budgets: [{budget}]")
