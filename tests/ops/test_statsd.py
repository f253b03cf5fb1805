"""statsd metrics as a statsd server receives them (a real UDP listener on 127.0.0.1).

Aspects: a launcher process with STATSD_HOST/STATSD_PORT pointed at the listener reports,
for a scripted run on the fake driver, Nodepool's key names with the right values: launch
timers and counters by result, provider and (sanitised) requestor; node gauges overall (all
eleven states), per provider and per label; addressable requests per pool; max_servers and
(sanitised) tenant limits; the global gauges are reported more than once (their rate limit,
at most one report a second, is checked in test_gauges.py).
Two launchers elect one stats leader (kazoo Election at /nodepool/elections/stats, contender
data `<hostname>-<pid>`); only the leader reports the global gauges, and when it stops the
other takes over.
"""

from __future__ import annotations

import signal
import urllib.request

import pytest
from kazoo.client import KazooClient
from prometheus_client.parser import text_string_to_metric_families

from nodepool_k8s.core import model
from nodepool_k8s.launcher.reporting.gauges import MIN_INTERVAL
from nodepool_k8s.runtime.stats import RecordingBackend, Stats
from nodepool_k8s.zk import paths
from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from tests.helpers import ZkConnection, wait_for
from tests.launchers import LauncherFactory
from tests.ops.conftest import BASE, LauncherProcesses, StatsdListener, free_port

pytestmark = pytest.mark.slow

SCRIPTED = (BASE + """          - name: broken
            type: pod
            fail: true
tenant-resource-limits:
  - tenant-name: example.org
    max-servers: 5
    max-cores: 10
""").replace("  - name: slow\nproviders:", "  - name: slow\n  - name: broken\nproviders:")


def test_scripted_run_over_udp(launcher_process: LauncherProcesses, statsd: StatsdListener,
                               zk: ZkConnection) -> None:
    proc = launcher_process(SCRIPTED, env=statsd.env)
    # Configuration gauges, from every launcher at start.
    wait_for(lambda: "nodepool.provider.fake.max_servers" in statsd.gauges(), 10,
             message="max_servers gauge")
    gauges = statsd.gauges()
    assert gauges["nodepool.provider.fake.max_servers"] == 10
    assert gauges["nodepool.tenant_limits.example_org.instances"] == 5
    assert gauges["nodepool.tenant_limits.example_org.cores"] == 10
    assert not any(k.startswith("nodepool.tenant_limits.example_org.ram") for k in gauges), \
        "unlimited values are not sent"

    with ZuulClient(zk.hosts, system_id="zuul.example:1") as zuul:
        used = zuul.submit(["small"], tenant_name="example.org")
        assert (zuul.wait(used) or {}).get("state") == "fulfilled"
        nodeset = zuul.accept(used)
        zuul.use(nodeset)
        broken = zuul.submit(["broken"])
        assert (zuul.wait(broken) or {}).get("state") == "failed"
        waiting = zuul.submit(["slow"])
        wait_for(lambda: (zuul.get_request(waiting) or {}).get("state") == "pending", 10)

        def settled() -> bool:
            g = statsd.gauges()
            return (g.get("nodepool.nodes.in-use") == 1
                    and g.get("nodepool.nodes.building") == 1
                    and g.get("nodepool.provider.fake.pool.main.addressable_requests") == 2)
        wait_for(settled, 15, message="gauges for one in-use and one building node")
        gauges = statsd.gauges()
        for state in model.NODE_STATES:
            assert f"nodepool.nodes.{state}" in gauges
            assert f"nodepool.provider.fake.nodes.{state}" in gauges
            for label in ("small", "slow", "broken"):
                assert f"nodepool.label.{label}.nodes.{state}" in gauges
        assert gauges["nodepool.provider.fake.nodes.in-use"] == 1
        assert gauges["nodepool.label.small.nodes.in-use"] == 1
        assert gauges["nodepool.label.slow.nodes.building"] == 1
        assert gauges["nodepool.nodes.ready"] == 0
        assert gauges["nodepool.label.small.nodes.ready"] == 0

        counters, timers = statsd.counters(), statsd.timers()
        for key in ("nodepool.launch.ready", "nodepool.launch.provider.fake.ready",
                    "nodepool.launch.requestor.zuul_example_1.ready",
                    "nodepool.launch.error.nodepool",
                    "nodepool.launch.provider.fake.error.nodepool",
                    "nodepool.launch.requestor.zuul_example_1.error.nodepool"):
            assert counters.get(key) == 1, (key, counters)
            assert len(timers[key]) == 1 and timers[key][0] >= 0

        zuul.release(nodeset)
        wait_for(lambda: statsd.gauges().get("nodepool.nodes.in-use") == 0
                 and statsd.gauges().get("nodepool.nodes.used") == 0
                 and statsd.gauges().get("nodepool.nodes.deleting") == 0, 15,
                 message="the used node deleted")
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
    # Every report sends nodepool.nodes.building once: the leader reported the changes
    # more than once. (Their rate limit, one report a second, is checked on the reporter
    # itself in test_gauges.py, on a clock the test moves.)
    assert len(statsd.gauge_history("nodepool.nodes.building")) >= 2


def contenders(client: KazooClient) -> list[str]:
    names = sorted(client.get_children(paths.STATS_ELECTION),
                   key=lambda n: n.rsplit("__lock__", 1)[-1])
    return [client.get(f"{paths.STATS_ELECTION}/{n}")[0].decode() for n in names]


def test_one_stats_leader(launchers: LauncherFactory, kazoo_client: KazooClient) -> None:
    first_stats, second_stats = RecordingBackend(), RecordingBackend()
    first = launchers(stats=Stats(first_stats), hostname="alpha")
    assert first.gauges.min_interval == MIN_INTERVAL  # a launcher's reports are rate limited
    wait_for(lambda: first.gauges.leading, 10, message="first launcher leads")
    second = launchers(stats=Stats(second_stats), hostname="beta")
    wait_for(lambda: len(contenders(kazoo_client)) == 2, 10, message="two contenders")
    ids = contenders(kazoo_client)
    assert ids[0].startswith("alpha-") and ids[1].startswith("beta-")
    assert ids[0].split("-")[-1].isdigit()  # <hostname>-<pid>
    # Both report their own limits; only the leader the global gauges.
    for backend in (first_stats, second_stats):
        assert "nodepool.provider.fake.max_servers" in backend.keys("gauge")
    wait_for(lambda: "nodepool.nodes.ready" in first_stats.keys("gauge"), 10,
             message="leader reports")
    assert not second.gauges.leading
    assert not [k for k in second_stats.keys("gauge") if k.startswith("nodepool.nodes.")]

    first.stop()
    wait_for(lambda: second.gauges.leading, 10, message="second launcher takes over")
    wait_for(lambda: "nodepool.nodes.ready" in second_stats.keys("gauge"), 10,
             message="new leader reports")
    assert contenders(kazoo_client) == [ids[1]]


def test_metrics_add_up_over_udp_and_on_the_metrics_page(
        launcher_process: LauncherProcesses, statsd: StatsdListener, zk: ZkConnection) -> None:
    """Every failure once under Nodepool's error.* keys, once more by reason in its own
    branch, the same counts on /metrics, and phases that add up to the whole launch."""
    port = free_port()
    proc = launcher_process(SCRIPTED, env=statsd.env, args=(),
                            webapp=f"webapp:\n  port: {port}\n  listen_address: 127.0.0.1\n")
    with ZuulClient(zk.hosts) as zuul:
        for labels in (["small"], ["broken"], ["small"], ["broken"]):
            request_id = zuul.submit(labels)
            assert (zuul.wait(request_id) or {}).get("state") in ("fulfilled", "failed")

    def prometheus() -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return {f"{sample.name}{sorted(sample.labels.items())}": sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples}

    def total(values: dict[str, float], prefix: str) -> float:
        return sum(v for k, v in values.items() if k.startswith(prefix))

    def add_up() -> bool:
        counters, metrics = statsd.counters(), prometheus()
        failed = total(counters, "nodepool.launch.provider.fake.error.")
        ready = counters.get("nodepool.launch.provider.fake.ready", 0)
        launches = sum(v for k, v in metrics.items() if k.startswith("nodepool_launch_total["))
        errors = sum(v for k, v in metrics.items()
                     if k.startswith("nodepool_launch_total[") and "'error." in k)
        return (failed >= 2 and ready == 2
                and total(counters, "nodepool.launch.provider.fake.reason.") == failed
                and total(counters, "nodepool.launch.error.") == failed
                and launches == failed + ready and errors == failed
                and total(metrics, "nodepool_launch_errors_total[") == failed
                and total(metrics, "nodepool_node_launch_seconds_count[") == ready)
    wait_for(add_up, 20, message="statsd and /metrics to agree")

    metrics = prometheus()
    assert not [k for k in metrics if "phase', 'total'" in k]
    phases = sum(v for k, v in metrics.items() if k.startswith("nodepool_node_phase_seconds_sum[")
                 and "'deletion'" not in k)
    assert phases == pytest.approx(total(metrics, "nodepool_node_launch_seconds_sum["))
    proc.signal(signal.SIGTERM)
    assert proc.wait() == 0
