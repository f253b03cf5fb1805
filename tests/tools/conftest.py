"""Helpers for the smoke tests of the demo, the benchmark and the local stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, tmp: Path, timeout: float = 120.0
               ) -> subprocess.CompletedProcess[str]:
    """Run `python -m module args` with TMPDIR=tmp (so every temporary file of the run and
    of its children lands there and leftovers can be found)."""
    env = dict(os.environ, TMPDIR=str(tmp))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line or environment contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for name in ("cmdline", "environ"):
            try:
                if text.encode() in (entry / name).read_bytes():
                    found.append(int(entry.name))
                    break
            except OSError:
                continue
    return found


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("nodepool-k8s-"))
