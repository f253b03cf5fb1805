"""Kubernetes API requests and request waits, on `/metrics` and over statsd, after real launches.

Aspects: a launcher service running in this process (Kubernetes driver against the
simulator, web app, statsd client aimed at a real UDP listener) fulfils one request and
fails one (a label no pool serves). Every HTTP request its provider sent is counted once:
`nodepool_kubernetes_api_requests_total` by verb and resource equals what the simulator
counted by verb and resource, its sum equals the simulator's total, and the statsd counters
add up to the same total. The wait of each finished request is one observation of
`nodepool_request_wait_seconds` (by result) and one statsd timer under each of
`nodepool.request.<result>`, `.provider.<p>.` and `.label.<l>.` (known labels only).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.runtime import stats
from tests.helpers import ZkConnection, wait_for
from tests.ops.conftest import StatsdListener, config_text, running_service

pytestmark = pytest.mark.slow

CONFIG = """
labels:
  - name: k8s-namespace
providers:
  - name: k8s
    driver: kubernetes
    context: sim
    boot-timeout: 60
    api-retries: 3
    api-backoff: [0.01, 0.05]
    pools:
      - name: main
        max-servers: 4
        labels:
          - name: k8s-namespace
            type: namespace
webapp:
  port: 0
  listen_address: 127.0.0.1
"""

API = "nodepool_kubernetes_api_requests_total"


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    listener = StatsdListener()
    try:
        yield listener
    finally:
        listener.close()


def test_api_requests_and_request_waits_add_up(
        tmp_path: Path, zk: ZkConnection, k8s_sim: Simulator, statsd: StatsdListener,
        zuul: ZuulClient) -> None:
    path = tmp_path / "nodepool.yaml"
    path.write_text(config_text(zk, CONFIG))
    with running_service(path, stats.from_env(statsd.env)) as running:
        fulfilled = zuul.submit(["k8s-namespace"])
        assert (zuul.wait(fulfilled, timeout=60) or {}).get("state") == "fulfilled"
        failed = zuul.submit(["no-such-label"])
        assert (zuul.wait(failed, timeout=60) or {}).get("state") == "failed"

        def ours() -> Counter[str]:
            """Our counts as the simulator keys them: `<verb> <resource>`."""
            counts: Counter[str] = Counter()
            for name, labels, value in running.samples():
                if name == API:
                    assert labels["provider"] == "k8s" and labels["code"].isdigit()
                    if labels["resource"] == "other":
                        # The API probe's `GET /version`: the simulator counts only
                        # requests for resources.
                        assert labels["verb"] == "get", labels
                        continue
                    counts[f"{labels['verb']} {labels['resource']}"] += int(value)
            return counts

        def agree() -> bool:
            # Compared between two scrapes that agree with each other: no request was in
            # flight (the simulator counts one as it arrives, we once it is answered).
            before = ours()
            seen = k8s_sim.counters
            return bool(before) and before == ours() \
                and before == Counter({k: v for k, v in seen.items() if k != "total"}) \
                and sum(before.values()) == seen["total"]
        wait_for(agree, 30, message="our API request counts to match the simulator's")
        counted = ours()
        # Sent by `KubeClient.api`'s endpoints (below `MeteredApiClient.request`) and by the
        # generated methods: both counted.
        for wanted in ("create namespaces", "create serviceaccounts/token",
                       "create resourcequotas", "create rolebindings", "watch pods",
                       "list namespaces"):
            assert counted[wanted] >= 1, counted

        def sent() -> bool:
            total = k8s_sim.counters["total"]
            over_udp = sum(v for k, v in statsd.counters().items()
                           if k.startswith("nodepool.provider.k8s.kubernetes.")
                           and not k.startswith("nodepool.provider.k8s.kubernetes.get.other."))
            return over_udp == total == sum(ours().values())
        wait_for(sent, 30, message="the statsd API counters to add up to the same total")

        metrics = running.scrape()
        waits = {k: v for k, v in metrics.items()
                 if k.startswith("nodepool_request_wait_seconds_count[")}
        assert sum(waits.values()) == 2, waits
        assert waits["nodepool_request_wait_seconds_count[('labels', 'k8s-namespace'), "
                     "('pool', 'main'), ('provider', 'k8s'), ('result', 'fulfilled')]"] == 1
        assert waits["nodepool_request_wait_seconds_count[('labels', '(unsupported)'), "
                     "('pool', 'main'), ('provider', 'k8s'), ('result', 'failed')]"] == 1

        def timed() -> dict[str, list[float]] | None:
            timers = statsd.timers()
            return timers if "nodepool.request.failed" in timers else None
        timers = wait_for(timed, 10, message="the request timers over statsd")
        for key in ("nodepool.request.fulfilled", "nodepool.request.provider.k8s.fulfilled",
                    "nodepool.request.label.k8s-namespace.fulfilled",
                    "nodepool.request.failed", "nodepool.request.provider.k8s.failed"):
            assert len(timers[key]) == 1 and timers[key][0] >= 0, (key, timers)
        assert not [k for k in timers if k.startswith("nodepool.request.label.no-such")]
