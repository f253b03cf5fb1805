"""`stats.from_env`: statsd settings from the environment are operator input.

A non-numeric or out-of-range STATSD_PORT, or a STATSD_HOST that is not valid UTF-8, used to
stop the launcher with a traceback (or, for port 999999, be accepted and send nothing);
now each is one ConfigError line. A host that does not resolve is logged and the launcher
runs without statsd metrics instead of not at all.
"""

from __future__ import annotations

import logging

import pytest

from nodepool_k8s.runtime import stats
from nodepool_k8s.core.errors import ConfigError


@pytest.mark.parametrize("env, message", [
    ({"STATSD_HOST": "localhost", "STATSD_PORT": "abc"}, "STATSD_PORT: 'abc' is not a port"),
    ({"STATSD_HOST": "localhost", "STATSD_PORT": "999999"}, "is not a port (1-65535)"),
    ({"STATSD_HOST": "localhost", "STATSD_PORT": "0"}, "is not a port"),
    ({"STATSD_HOST": "st" + b"\xff".decode("utf-8", "surrogateescape")},
     "STATSD_HOST: not valid UTF-8"),
])
def test_values_that_can_never_work_are_config_errors(env: dict[str, str],
                                                      message: str) -> None:
    with pytest.raises(ConfigError) as info:
        stats.from_env(env)
    assert message in str(info.value)


def test_an_unresolvable_host_means_no_metrics_not_no_launcher(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="nodepool_k8s.runtime.stats")
    facade = stats.from_env({"STATSD_HOST": "statsd.invalid", "STATSD_PORT": "8125"})
    assert isinstance(facade, stats.Stats)
    assert any("running without statsd metrics" in r.getMessage() for r in caplog.records)


def test_a_good_setting_and_none_at_all() -> None:
    assert isinstance(stats.from_env({"STATSD_HOST": "127.0.0.1", "STATSD_PORT": "8125"}),
                      stats.Stats)
    assert isinstance(stats.from_env({}), stats.Stats)
