"""`installation-id` (top level) and `token-lifetime` (provider): defaults, overrides, errors.

Aspects: the derived installation id is stable for one ZooKeeper installation (server order
and host case do not matter), differs per chroot and per ensemble, and reaches every
provider; an explicit id wins and must be a label value; `token-lifetime` defaults to a day,
and below 600 s is a config error naming the place.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodepool_k8s.config import schema as S
from nodepool_k8s.core.errors import ConfigError
from tests.config.common import at, base, load, where


def _zk(*servers: dict[str, Any]) -> dict[str, Any]:
    data = base()
    data["zookeeper-servers"] = list(servers)
    return data


def test_installation_id_is_derived_from_the_zookeeper_installation() -> None:
    one = load(_zk({"host": "zk1", "chroot": "/np"}, {"host": "ZK2", "port": 2181,
                                                      "chroot": "/np"}))
    same = load(_zk({"host": "zk2", "chroot": "/np"}, {"host": "zk1", "chroot": "/np"}))
    other_chroot = load(_zk({"host": "zk1", "chroot": "/np2"},
                            {"host": "zk2", "chroot": "/np2"}))
    other_ensemble = load(_zk({"host": "zk3", "chroot": "/np"},
                              {"host": "zk2", "chroot": "/np"}))
    assert one.installation_id == same.installation_id
    assert one.installation_id.startswith("zk-") and len(one.installation_id) == 15
    assert len({one.installation_id, other_chroot.installation_id,
                other_ensemble.installation_id}) == 3
    # Every provider carries it: `nodepool delete --now` builds providers from config alone.
    assert {p.installation_id for p in one.providers.values()} == {one.installation_id}


def test_installation_id_can_be_set() -> None:
    data = base()
    data["installation-id"] = "ci-prod.east_1"
    config = load(data)
    assert config.installation_id == "ci-prod.east_1"
    assert config.providers["k8s"].installation_id == "ci-prod.east_1"


@pytest.mark.parametrize("value", ["-bad", "has space", "x" * 64, "ends-", 12])
def test_installation_id_must_be_a_label_value(value: Any) -> None:
    data = base()
    data["installation-id"] = value
    with pytest.raises(ConfigError) as info:
        load(data)
    assert "installation-id:" in str(info.value)


def test_token_lifetime_default_and_override() -> None:
    assert S.TOKEN_LIFETIME == 86400
    assert load(base()).providers["k8s"].token_lifetime == 86400
    data = base()
    at(data, "provider")["token-lifetime"] = 600
    assert load(data).providers["k8s"].token_lifetime == 600


@pytest.mark.parametrize("value", [599, 0, -1])
def test_token_lifetime_below_600_is_an_error_naming_the_place(value: int) -> None:
    data = base()
    at(data, "provider")["token-lifetime"] = value
    with pytest.raises(ConfigError) as info:
        load(data)
    message = str(info.value)
    assert f"test.yaml: {where('provider', 'token-lifetime')}: must be at least 600" in message
    assert f"got {value}" in message
