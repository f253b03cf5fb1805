"""Builders for provider/pool/label configs and launch specs used by the kubernetes tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from nodepool_k8s.config.model import PoolConfig, PoolLabel, ProviderConfig
from nodepool_k8s.driver.base import LaunchSpec, RequestInfo


def make_label(name: str = "pod-fedora", type: str = "pod", **kw: Any) -> PoolLabel:
    if type == "pod" and "spec" not in kw:
        kw.setdefault("image", "docker.io/fedora:40")
    return PoolLabel(name=name, type=type, **kw)


def make_provider(*labels: PoolLabel, name: str = "kubespray", pool: str = "main",
                  **kw: Any) -> ProviderConfig:
    labels = labels or (make_label(), make_label("k8s-namespace", "namespace"))
    kw.setdefault("api_retries", 3)
    kw.setdefault("api_backoff", (0.01, 0.02))
    kw.setdefault("api_timeout", 5.0)
    pool_config = PoolConfig(name=pool, provider=name,
                             labels={label.name: label for label in labels})
    return ProviderConfig(name=name, driver="kubernetes", pools={pool: pool_config},
                          context=kw.pop("context", "sim"), **kw)


def make_spec(provider: ProviderConfig, label: str, node_id: str = "0000000000",
              attempt: int = 1, request: RequestInfo | None = None,
              **label_changes: Any) -> LaunchSpec:
    pool = next(iter(provider.pools.values()))
    pool_label = pool.labels[label]
    if label_changes:
        pool_label = dataclasses.replace(pool_label, **label_changes)
    return LaunchSpec(node_id=node_id, provider=provider, pool=pool, label=pool_label,
                      request=request or RequestInfo(id="200-0000000007",
                                                     labels=(label,),
                                                     tenant_name="tenant-1"),
                      attempt=attempt)
