"""Helpers for the configuration tests: a small valid base config and load shortcuts."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodepool_k8s.config.loader import load_config_text
from nodepool_k8s.config.model import Config
from nodepool_k8s.config.schema import format_path
from nodepool_k8s.core.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "etc" / "nodepool.yaml"

_BASE: dict[str, Any] = {
    "zookeeper-servers": [{"host": "localhost"}],
    "labels": [{"name": "ns"}, {"name": "pod"}, {"name": "custom"}, {"name": "fake"}],
    "tenant-resource-limits": [{"tenant-name": "t1"}],
    "providers": [
        {"name": "k8s", "driver": "kubernetes", "pools": [{
            "name": "main", "allow-verbatim-spec": True, "labels": [
                {"name": "ns", "type": "namespace"},
                {"name": "pod", "type": "pod", "image": "busybox"},
                {"name": "custom", "type": "pod",
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
            ]}]},
        {"name": "fake", "driver": "fake", "pools": [{"name": "fake", "labels": [
            {"name": "fake"},
        ]}]},
    ],
}

# Where each kind of section lives in `base()`: (keys to walk, the place as errors print it).
PLACES: dict[str, tuple[tuple[Any, ...], str]] = {
    "top": ((), ""),
    "zk": (("zookeeper-servers", 0), "zookeeper-servers[0]"),
    "label": (("labels", 0), "labels[0]"),
    "webapp": (("webapp",), "webapp"),
    "tenant": (("tenant-resource-limits", 0), "tenant-resource-limits[0]"),
    "provider": (("providers", 0), "providers[0]"),
    "pool": (("providers", 0, "pools", 0), "providers[0].pools[0]"),
    "nslabel": (("providers", 0, "pools", 0, "labels", 0), "providers[0].pools[0].labels[0]"),
    "podlabel": (("providers", 0, "pools", 0, "labels", 1), "providers[0].pools[0].labels[1]"),
    "speclabel": (("providers", 0, "pools", 0, "labels", 2), "providers[0].pools[0].labels[2]"),
    "fakeprovider": (("providers", 1), "providers[1]"),
    "fakepool": (("providers", 1, "pools", 0), "providers[1].pools[0]"),
    "fakelabel": (("providers", 1, "pools", 0, "labels", 0), "providers[1].pools[0].labels[0]"),
}


def base() -> dict[str, Any]:
    """A valid configuration (no warnings) with one section of every kind."""
    return copy.deepcopy(_BASE)


def at(data: dict[str, Any], place: str) -> dict[str, Any]:
    node: Any = data
    for key in PLACES[place][0]:
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    section: dict[str, Any] = node
    return section


def where(place: str, key: str) -> str:
    """How errors print `key` of the section `place`, e.g. `providers[0].pools[0].name`."""
    return format_path(PLACES[place][0] + (key,))


def prefix(place: str) -> str:
    """How errors print the section `place` itself, e.g. `providers[0].pools[0]`."""
    return format_path(PLACES[place][0])


def dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def load(data: Any, **kw: Any) -> Config:
    return load_config_text(dump(data), path="test.yaml", env=kw.pop("env", {}), **kw)


def problems(data: Any, **kw: Any) -> list[str]:
    """The problems of an invalid config (fails the test if it loads)."""
    with pytest.raises(ConfigError) as info:
        load(data, **kw)
    assert info.value.path == "test.yaml"
    return info.value.problems


def assert_problem(data: Any, place: str, fragment: str = "") -> None:
    found = problems(data)
    assert any(p.startswith(place + ": ") and fragment in p for p in found), (
        f"no problem at {place!r} containing {fragment!r}; got {found}")


# Every configuration with a kubernetes provider and no `zookeeper-acl` warns that its node
# records' tokens are world-readable (tests/config/test_zk_access.py checks that warning).
OPEN_ACL_WARNING = "test.yaml: zookeeper-acl: warning: off: "


def warnings(data: Any) -> list[str]:
    """The warnings of `data`, less the open-ACL one (see OPEN_ACL_WARNING)."""
    return [w for w in load(data).warnings if not w.startswith(OPEN_ACL_WARNING)]
