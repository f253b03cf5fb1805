"""Small engine parts without ZooKeeper: the statsd facade (null and real UDP), engine
settings from the environment, the fake provider's controls, the driver registry and the
launcher command's configuration errors."""

from __future__ import annotations

import socket
import threading

import pytest

from nodepool_k8s.runtime import stats
from nodepool_k8s.core.conditions import INITIALIZED, LAUNCHED, REGISTERED, TRUE, Condition
from nodepool_k8s.cmd import launcher as launcher_cmd
from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.driver import registry
from nodepool_k8s.driver.base import LaunchSpec, RequestInfo
from nodepool_k8s.driver.fake import FakeProvider
from nodepool_k8s.core.errors import ConfigError, LaunchError, TemporaryError
from nodepool_k8s.launcher.settings import EngineSettings


def test_stats_null_when_unconfigured() -> None:
    facade = stats.from_env({})
    assert isinstance(facade.backend, stats.NullBackend)
    facade.launch("p", "zuul", stats.RESULT_READY, 12.5)  # no error, nothing sent
    facade.leaked_nodes("p")
    assert facade.gauges({"a": 1}) == 0
    # The in-process (Prometheus) counters count without statsd.
    assert facade.counters()[(stats.PROM_LAUNCHES,
                              (("provider", "p"), ("result", "ready")))] == 1


def test_stats_udp_names() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    port = sock.getsockname()[1]
    facade = stats.from_env({"STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(port)})
    facade.launch("kube", "zuul.example:1", stats.RESULT_READY, 42)
    facade.leaked_nodes("kube")
    packets = {sock.recv(4096).decode() for _ in range(7)}
    sock.close()
    assert "nodepool.launch.ready:42.000000|ms" in packets
    assert "nodepool.launch.ready:1|c" in packets
    assert "nodepool.launch.provider.kube.ready:1|c" in packets
    assert "nodepool.launch.requestor.zuul_example_1.ready:1|c" in packets
    assert "nodepool.provider.kube.leaked.nodes:1|c" in packets


def test_stats_never_raise() -> None:
    class Broken:
        def timing(self, *a: object) -> None:
            raise OSError("down")

        incr = gauge = timing

    facade = stats.Stats(Broken())  # type: ignore[arg-type]
    facade.launch("p", None, stats.RESULT_UNKNOWN, 1)
    facade.leaked_nodes("p")
    facade.malformed("node")
    # A broken statsd loses its packets, never the in-process counters.
    assert sum(facade.counters().values()) == 3


def test_settings_from_env() -> None:
    settings = EngineSettings.from_env({"NODEPOOL_K8S_CLEANUP_INTERVAL": "2.5",
                                        "NODEPOOL_K8S_LAUNCH_WORKERS": "4"})
    assert settings.cleanup_interval == 2.5 and settings.launch_workers == 4
    with pytest.raises(ConfigError):
        EngineSettings.from_env({"NODEPOOL_K8S_STALE_INIT_AGE": "soon"})


@pytest.mark.parametrize("name,raw", [
    ("CLEANUP_INTERVAL", "nan"),  # NaN: the full cleanup pass would never be due
    ("CLEANUP_INTERVAL", "inf"),
    ("CLEANUP_INTERVAL", "0"),  # a busy loop
    ("LEAK_SWEEP_INTERVAL", "-5"),
    ("STOP_TIMEOUT", "1e300"),  # overflows threading's timeouts
    ("DELETE_WORKERS", "0"),  # crashed the launcher at start
    ("LAUNCH_WORKERS", "-1"),
    ("GUARD_ATTEMPTS", "2.5"),
    ("DELETE_RETRY", "600"),  # more than DELETE_RETRY_MAX (300)
])
def test_settings_refuse_nan_inf_zero_and_negatives(name: str, raw: str) -> None:
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_" + name):
        EngineSettings.from_env({"NODEPOOL_K8S_" + name: raw})


def test_settings_check_every_way_in() -> None:
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_DELETE_WORKERS"):
        EngineSettings(delete_workers=0)
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_QUOTA_RETRY"):
        EngineSettings().replace(quota_retry=float("nan"))
    # Where 0 means "off" it is accepted.
    settings = EngineSettings.from_env({"NODEPOOL_K8S_RECLAIM_INTERVAL": "0",
                                        "NODEPOOL_K8S_STOP_TIMEOUT": "0"})
    assert settings.reclaim_interval == 0 and settings.stop_timeout == 0


def test_quota_yield_defaults_to_a_short_wait_and_may_be_switched_off() -> None:
    assert EngineSettings().quota_yield == 1.0
    assert EngineSettings.from_env({"NODEPOOL_K8S_QUOTA_YIELD": "0"}).quota_yield == 0
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_QUOTA_YIELD"):
        EngineSettings.from_env({"NODEPOOL_K8S_QUOTA_YIELD": "-1"})


def test_delete_grace_defaults_to_a_wait_and_may_be_switched_off() -> None:
    assert EngineSettings().delete_grace == 30.0
    assert EngineSettings.from_env({"NODEPOOL_K8S_DELETE_GRACE": "0"}).delete_grace == 0
    with pytest.raises(ConfigError, match="NODEPOOL_K8S_DELETE_GRACE"):
        EngineSettings.from_env({"NODEPOOL_K8S_DELETE_GRACE": "-1"})


def provider_config(**label_kw: object) -> ProviderConfig:
    label = PoolLabel(name="small", type="namespace", **label_kw)  # type: ignore[arg-type]
    pool = PoolConfig(name="main", provider="fake", labels={"small": label})
    return ProviderConfig(name="fake", driver="fake", pools={"main": pool})


def spec(config: ProviderConfig, attempt: int = 1) -> LaunchSpec:
    pool = config.pools["main"]
    return LaunchSpec(node_id="0000000007", provider=config, pool=pool,
                      label=pool.labels["small"], request=RequestInfo(id="200-0000000001"),
                      attempt=attempt)


def test_fake_provider_launch_fail_cancel_delete() -> None:
    config = provider_config()
    fake = FakeProvider(config)
    seen: list[str] = []
    types: list[str] = []

    def progress(external_id: str, *updates: Condition) -> None:
        seen.append(external_id)
        types.extend(c.type for c in updates if c.status == TRUE)

    result = fake.launch(spec(config), threading.Event(), progress)
    assert set(seen) == {"main-0000000007"} and result.connection_type == "namespace"
    assert types == [LAUNCHED, REGISTERED, INITIALIZED]  # as the Kubernetes driver does
    assert result.connection_port["namespace"] == "main-0000000007"
    assert fake.resource_ids() == {"main-0000000007"}
    fake.fail_next(1, TemporaryError("api down"), op="delete")
    with pytest.raises(TemporaryError):
        fake.delete("main-0000000007")
    fake.delete("main-0000000007")
    fake.delete("main-0000000007")  # missing is success
    fake.fail_next(1)
    with pytest.raises(LaunchError):
        fake.launch(spec(config, attempt=2), threading.Event())
    assert fake.launch(spec(config, attempt=2), threading.Event()).external_id == \
        "main-0000000007-2"
    slow = provider_config(fake_launch_delay=60.0)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(LaunchError) as info:
        FakeProvider(slow).launch(spec(slow), cancel)
    assert info.value.reason == "Cancelled"
    failing = provider_config(fake_fail=True)
    with pytest.raises(LaunchError):
        FakeProvider(failing).launch(spec(failing), threading.Event())
    assert fake.call_names().count("launch") == 3


def test_driver_registry() -> None:
    provider = registry.make_provider(provider_config())
    assert isinstance(provider, FakeProvider)
    assert set(registry.DRIVERS) == {"fake", "kubernetes"}
    bad = ProviderConfig(name="x", driver="nope", pools={})
    with pytest.raises(ConfigError):
        registry.make_provider(bad)


def test_launcher_command_rejects_bad_config(tmp_path: object,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Keep the test process's logging (and pytest's capture) as it is.
    monkeypatch.setattr(launcher_cmd.logconfig, "setup", lambda *a, **k: None)
    path = f"{tmp_path}/broken.yaml"
    with open(path, "w") as f:
        f.write("providers: [oops\n")
    assert launcher_cmd.main(["-c", path]) == 1
    assert "broken.yaml" in capsys.readouterr().err


def test_stats_keys_are_sanitised() -> None:
    """Names from configuration and from requestors cannot break the statsd line protocol
    (`name:value|type`, one per line) or add key levels through `:`/`|`/newlines."""
    from nodepool_k8s.runtime import stats as st
    keys = st.launch_keys("prov|x\nnodepool.evil:1|c", "zuul\n|c:5", "ready")
    keys += [st.label_nodes_key("lab|el\n", "ready"), st.provider_nodes_key("p:x", "used"),
             st.addressable_requests_key("p\r", "po|ol"), st.tenant_limit_key("t.x\n", "ram"),
             st.malformed_key("node\n")]
    for key in keys:
        assert not set(key) & set(":|\n\r@# "), key
    assert keys[0] == "nodepool.launch.ready"
    assert keys[2] == "nodepool.launch.requestor.zuul__c_5.ready"
    # Nodepool-compatible where names are ordinary: dots in labels stay.
    assert st.label_nodes_key("ubuntu-22.04", "ready") == "nodepool.label.ubuntu-22.04.nodes.ready"


def test_one_backoff_formula() -> None:
    from nodepool_k8s.launcher.settings import next_backoff
    delays = [0.0]
    for _ in range(6):
        delays.append(next_backoff(delays[-1], 5.0, 60.0))
    assert delays[1:] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
