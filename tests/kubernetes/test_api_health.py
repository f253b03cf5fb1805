"""A provider's view of its API server (`api_health`) and the trust it follows on its own.

Aspects (the probe set to a long interval: only real calls act here):
- after the cluster's CA was rotated, a call fails verification and the provider reads
  `TLSUntrusted`; a kubeconfig rewritten to skip verification instead is not followed
  (the call still fails, a WARNING says a reload is needed);
- once the kubeconfig holds the new CA, the next call finds the change on disk, trusts the
  new CA and succeeds at once (no probe, no reload), and the provider reads `Reachable`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from nodepool_k8s.core.errors import TemporaryError
from nodepool_k8s.dev.simulator import Simulator
from nodepool_k8s.driver.kubernetes.provider import KubernetesProvider
from tests.kubernetes.conftest import ProviderFactory


def health(provider: KubernetesProvider) -> tuple[bool | None, str]:
    found = provider.api_health()
    assert found is not None
    return found.healthy, found.reason


def test_a_rotated_ca_is_followed_and_skipping_verification_is_not(
        sim: Simulator, make_k8s_provider: ProviderFactory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", context="sim")
    provider = make_k8s_provider(sim, kubeconfig=kubeconfig, api_probe_interval=3600.0)
    provider.list_resources()
    assert health(provider) == (True, "Reachable")

    sim.rotate_ca()
    with pytest.raises(TemporaryError, match="CERTIFICATE_VERIFY_FAILED"):
        provider.list_resources()
    assert health(provider) == (False, "TLSUntrusted")

    # Somebody "fixes" it by switching verification off: never followed in place.
    doc = yaml.safe_load(Path(kubeconfig).read_text())
    cluster = doc["clusters"][0]["cluster"]
    del cluster["certificate-authority-data"]
    cluster["insecure-skip-tls-verify"] = True
    Path(kubeconfig).write_text(yaml.safe_dump(doc))
    with caplog.at_level(logging.WARNING, logger="nodepool_k8s"):
        with pytest.raises(TemporaryError, match="CERTIFICATE_VERIFY_FAILED"):
            provider.list_resources()
    assert any("not followed by a running provider" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert health(provider) == (False, "TLSUntrusted")

    # The new CA written into the kubeconfig: the failing call itself picks it up.
    sim.write_kubeconfig(kubeconfig, context="sim")
    assert provider.list_resources() == []
    assert health(provider) == (True, "Reachable")
