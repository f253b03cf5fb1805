#!/usr/bin/env python3
"""CPU seconds per thread of a running `nodepool-launcher`, grouped by thread name.

Usage: start this, then a benchmark run with NODEPOOL_K8S_PROFILE_THREADS=PREFIX and
tools/profile first on PYTHONPATH (see sitecustomize.py here):

    python3 tools/profile/thread_cpu.py /tmp/threads &
    NODEPOOL_K8S_PROFILE_THREADS=/tmp/threads PYTHONPATH=tools/profile:. \\
        tools/benchmark --profiles zero --labels namespace --serial 0 --launchers 0 \\
        --scale-nodes 0 --burst 0 --requests 300

A second argument, a `pgrep -f` pattern (e.g. `/tmp/before/etc/demo/benchmark`), picks
the launcher when others run on the machine.

It waits for the first launcher process, samples /proc/<pid>/task/*/stat every 0.1 s
until the process exits, and prints each thread group's CPU and share (numbered thread
names such as launch-<provider>_3 are summed). Reading /proc costs the launcher nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time


# Which process: the first whose command line matches (a second argument narrows it, e.g.
# to one tree's configuration path when other launchers run on the machine).
PATTERN = sys.argv[2] if len(sys.argv) > 2 else "nodepool-launcher"


def launcher_pid() -> int:
    while True:
        found = subprocess.run(["pgrep", "-f", PATTERN], capture_output=True,
                               text=True, check=False).stdout.split()
        pids = [int(p) for p in found if int(p) != os.getpid()]
        if pids:
            return pids[0]
        time.sleep(0.05)


def main() -> int:
    prefix = sys.argv[1] if len(sys.argv) > 1 else "/tmp/threads"
    pid = launcher_pid()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu: dict[int, float] = {}
    while os.path.exists(f"/proc/{pid}"):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            break
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as stat:
                    text = stat.read()
            except OSError:
                continue
            fields = text[text.rfind(")") + 2:].split()
            cpu[int(task)] = (int(fields[11]) + int(fields[12])) / ticks
        time.sleep(0.1)
    names = {pid: "main"}
    try:
        with open(f"{prefix}.{pid}") as mapping:
            for line in mapping:
                native, name = line.rstrip("\n").split(" ", 1)
                names[int(native)] = name
    except OSError:
        print(f"no thread names in {prefix}.{pid}: grouped by id", file=sys.stderr)
    groups: dict[str, float] = {}
    for task, seconds in cpu.items():
        name = re.sub(r"_\d+$", "_N", names.get(task, f"thread {task}"))
        groups[name] = groups.get(name, 0.0) + seconds
    total = sum(groups.values()) or 1.0
    for name, seconds in sorted(groups.items(), key=lambda item: -item[1]):
        if seconds:
            print(f"{seconds:8.2f} s {100 * seconds / total:5.1f} %  {name}")
    print(f"{sum(groups.values()):8.2f} s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
