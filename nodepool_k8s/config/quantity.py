"""Kubernetes resource quantities of a verbatim pod `spec`, in the units labels use.

Owns: reading a quantity ("500m", "2", "1Gi", "512M", 3) as a number, and the requests a
pod spec asks for, so a `spec` label counts against `max-cores` / `max-ram` with what its
containers request instead of the pool's defaults: cores (cpu), ram (MiB, like `memory`),
storage (MB, like `storage`). The effective request per resource is Kubernetes': the larger
of the containers' sum and the largest init container's. A resource no container asks for
is None (the caller keeps the pool default, which the namespace's LimitRange then applies).
Pure; a malformed quantity counts as 0 (the API server rejects such a pod anyway).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES = {
    "": Decimal(1), "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
}
# spec resource name -> (label resource, divisor to the label's unit)
SPEC_RESOURCES = {"cpu": ("cpu", Decimal(1)), "memory": ("memory", Decimal(2) ** 20),
                  "ephemeral-storage": ("storage", Decimal(10) ** 6)}


def parse(value: Any) -> Decimal:
    if isinstance(value, bool):
        return Decimal(0)
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match or match[2] not in _SUFFIXES:
        return Decimal(0)
    try:
        return Decimal(match[1]) * _SUFFIXES[match[2]]
    except InvalidOperation:
        return Decimal(0)


def _requests(container: Any) -> Mapping[str, Any]:
    if not isinstance(container, dict):
        return {}
    requests = (container.get("resources") or {}).get("requests")
    return requests if isinstance(requests, dict) else {}


def spec_requests(spec: Mapping[str, Any]) -> dict[str, float | None]:
    """{cpu, memory (MiB), storage (MB)}: what the spec's containers request, or None."""
    containers = spec.get("containers") or []
    init = spec.get("initContainers") or []
    out: dict[str, float | None] = {}
    for name, (resource, unit) in SPEC_RESOURCES.items():
        asked = [c for c in list(containers) + list(init) if name in _requests(c)]
        if not asked:
            out[resource] = None
            continue
        total = sum((parse(_requests(c).get(name, 0)) for c in containers), Decimal(0))
        largest_init = max((parse(_requests(c).get(name, 0)) for c in init),
                           default=Decimal(0))
        amount = max(total, largest_init) / unit
        out[resource] = float(amount)
    return out
