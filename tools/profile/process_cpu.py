#!/usr/bin/env python3
"""CPU seconds per process of a command and everything it starts, grouped by role.

Usage (the benchmark as the command; its own arguments follow `--`):

    python3 tools/profile/process_cpu.py -- .venv/bin/python -m nodepool_k8s.testing.bench \\
        --profiles zero --labels namespace --serial 0 --launchers 0 --scale-nodes 0 \\
        --burst 0 --requests 300

It runs the command, samples /proc/<pid>/stat of the command and its descendants every
50 ms until the command exits, and prints each role's CPU (user + system): the launcher
processes, ZooKeeper, the Kubernetes API simulator, the benchmark's load generator, other.
A process's last sample counts, so up to 50 ms of a process that exits early is missed.
Startup is included: run two request counts and take the difference for a per-node figure
(doc/benchmark.md, "Sixth look"). Reading /proc costs the measured processes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE = 0.05


def read_stat(pid: str) -> tuple[str, float] | None:
    """(parent pid, CPU seconds so far) of `pid`, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[1], (int(fields[11]) + int(fields[12])) / TICKS


def read_cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def role(cmdline: str) -> str:
    if "nodepool_k8s.testing.bench" in cmdline:
        return "load generator (benchmark)"
    if "nodepool-launcher" in cmdline:
        return "launcher"
    if "zookeeper" in cmdline or cmdline.startswith("java"):
        return "zookeeper"
    if "simulator" in cmdline:
        return "kubernetes api simulator"
    return "other: " + cmdline[:60]


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    child = subprocess.Popen(args)
    root = str(child.pid)
    parents: dict[str, str] = {}
    last: dict[str, tuple[str, float]] = {}  # pid -> (cmdline, CPU seconds)
    while True:
        running = child.poll() is None
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            stat = read_stat(pid)
            if stat is None:
                continue
            parents[pid] = stat[0]
            ancestor, depth = pid, 0
            while ancestor not in (root, "0", "1") and ancestor in parents and depth < 32:
                ancestor, depth = parents[ancestor], depth + 1
            if ancestor != root:
                continue
            cmdline = read_cmdline(pid) or last.get(pid, ("", 0.0))[0]
            last[pid] = (cmdline, stat[1])
        if not running:
            break
        time.sleep(SAMPLE)
    totals: dict[str, float] = {}
    for cmdline, seconds in last.values():
        totals[role(cmdline)] = totals.get(role(cmdline), 0.0) + seconds
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        if seconds >= 0.01:
            print(f"{seconds:8.2f} s  {name}", file=sys.stderr)
    return int(child.returncode or 0)


if __name__ == "__main__":
    sys.exit(main())
