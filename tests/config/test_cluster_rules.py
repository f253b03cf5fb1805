"""A configuration that validates must give objects the Kubernetes API server accepts.

Aspects: names, label keys and values, and the other pod fields a label sets are checked at
validation with the API server's rules (an error naming the key path), instead of every
launch failing with 422 Invalid; including the Python-only pitfalls (a trailing newline that
`$` lets through).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.config.common import assert_problem, at, base, prefix

POD = prefix("podlabel")  # "providers[0].pools[0].labels[1]"
POOL = prefix("pool")


def _pod_label(data: dict[str, Any], **keys: Any) -> dict[str, Any]:
    label: dict[str, Any] = at(data, "podlabel")
    label.update(keys)
    return label


# -- names and metadata ------------------------------------------------------------------------


def test_pod_label_name_with_a_trailing_newline_is_refused() -> None:
    # `name: |` in YAML gives "pod\n"; the pod would be named that, and refused (422).
    data = base()
    data["labels"].append({"name": "pod\n"})
    _pod_label(data, name="pod\n")
    assert_problem(data, f"{POD}.name", "lowercase DNS-1123 subdomain")


def test_pool_name_with_a_trailing_newline_is_refused() -> None:
    data = base()
    at(data, "pool")["name"] = "main\n"
    assert_problem(data, f"{POOL}.name", "lowercase DNS-1123 label")


@pytest.mark.parametrize("section,key,value", [
    ("node-selector", "disk", "ssd\n"),
    ("node-selector", "disk\n", "ssd"),
    ("labels", "team\n", "a"),
    ("annotations", "note\n", "a"),
])
def test_metadata_with_a_trailing_newline_is_refused(section: str, key: str,
                                                     value: str) -> None:
    data = base()
    _pod_label(data, **{section: {key: value}})
    # A key with a newline is printed JSON-quoted: the problem stays on one line.
    place = f'{POD}.{section}["{key[:-1]}\\n"]' if "\n" in key else f"{POD}.{section}.{key}"
    assert_problem(data, place)


@pytest.mark.parametrize("section", ["labels", "annotations", "node-selector"])
def test_metadata_key_with_an_empty_prefix_is_refused(section: str) -> None:
    data = base()
    _pod_label(data, **{section: {"/team": "a"}})
    assert_problem(data, f'{POD}.{section}["/team"]', "not a valid Kubernetes key")


@pytest.mark.parametrize("key", ["tolerations", "node-requirements"])
def test_scheduling_key_with_an_empty_prefix_is_refused(key: str) -> None:
    data = base()
    entry = {"key": "/gpu", "operator": "Exists"}
    _pod_label(data, **{key: [entry]})
    assert_problem(data, f"{POD}.{key}[0].key", "'/gpu' is not a valid")
