"""Discovery documents: /version, /api, /api/v1, /apis, /apis/{group}[/{version}].

Owns: describing the served resources (from `resources.RESOURCES`) the way kubectl and other
discovery clients expect — APIVersions, APIGroupList, APIGroup and APIResourceList with verbs,
scope, kind, short names and subresources. Pure functions; they return None for unknown
groups so the caller answers 404.
"""

from __future__ import annotations

import platform
from typing import Any

from nodepool_k8s.dev.simulator.resources import (AUTHN_GROUP, GROUP_VERSIONS, RESOURCES,
                                                  ResourceType)

_SUBRESOURCE_VERBS = {"status": ("get", "patch", "update"), "token": ("create",)}


def version(server_version: tuple[int, int, int]) -> dict[str, Any]:
    major, minor, patch = server_version
    return {
        "major": str(major), "minor": str(minor),
        "gitVersion": f"v{major}.{minor}.{patch}+nodepool-k8s-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.0", "compiler": "gc",
        "platform": f"linux/{'arm64' if platform.machine() == 'aarch64' else 'amd64'}",
    }


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": server_address}]}


def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for r in RESOURCES:
        if r.group and r.version not in groups.setdefault(r.group, []):
            groups[r.group].append(r.version)
    return groups


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(name, versions) for name, versions in _groups().items()]}


def api_group(name: str) -> dict[str, Any] | None:
    versions = _groups().get(name)
    if versions is None:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _entry(r: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": r.plural, "singularName": r.singular_name,
                             "namespaced": r.namespaced, "kind": r.kind, "verbs": list(r.verbs)}
    if r.short_names:
        entry["shortNames"] = list(r.short_names)
    if r.categories:
        entry["categories"] = list(r.categories)
    return entry


def _subresource_entry(r: ResourceType, sub: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": f"{r.plural}/{sub}", "singularName": "",
                             "namespaced": r.namespaced, "kind": r.kind,
                             "verbs": list(_SUBRESOURCE_VERBS[sub])}
    if sub == "token":
        entry.update({"group": AUTHN_GROUP, "version": "v1", "kind": "TokenRequest"})
    return entry


def resource_list(group_version: str) -> dict[str, Any] | None:
    served = GROUP_VERSIONS.get(group_version)
    if served is None:
        return None
    entries = []
    for r in served:
        entries.append(_entry(r))
        entries += [_subresource_entry(r, sub) for sub in r.subresources]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version,
            "resources": entries}
