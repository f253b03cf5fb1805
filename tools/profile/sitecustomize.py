"""Profiling hooks for a benchmark's launcher processes (not part of the package).

Put this directory first on PYTHONPATH when running `tools/benchmark`; in a process whose
command line names `nodepool-launcher`, each of these environment variables switches on
one measurement, written when the launcher exits (it leaves through `os._exit`, which is
wrapped for that):

  NODEPOOL_K8S_PROFILE_THREADS=PREFIX  native thread id -> thread name, for per-thread
                                       CPU from /proc (`thread_cpu.py`)  -> PREFIX.<pid>
  NODEPOOL_K8S_PROFILE_YAPPI=PREFIX    yappi profile of every thread, CPU clock (or the
                                       clock in NODEPOOL_K8S_PROFILE_CLOCK, e.g. wall)
                                       -> PREFIX.<pid>.pstat (read with pstats)
  NODEPOOL_K8S_PROFILE_ZKOPS=PREFIX    ZooKeeper requests sent, by type and path pattern
                                       -> PREFIX.<pid>

yappi slows pure-Python code several times over: use it to rank, and the per-thread CPU
(no overhead) to size. See doc/benchmark.md, "Reproducing and profiling".
"""

from __future__ import annotations

import os
import sys

_AT_EXIT = []


def _launcher() -> bool:
    return "nodepool-launcher" in " ".join(sys.argv)


def _wrap_exit() -> None:
    original = os._exit

    def _exit(code: int) -> None:
        for dump in _AT_EXIT:
            try:
                dump()
            except Exception as exc:  # noqa: BLE001 - never keep the process alive
                print(f"profile dump failed: {exc!r}", file=sys.stderr)
        original(code)
    os._exit = _exit


def _threads(prefix: str) -> None:
    import threading
    import time

    path = f"{prefix}.{os.getpid()}"

    def record() -> None:
        seen: dict[int, str] = {}
        while True:
            changed = False
            for thread in threading.enumerate():
                native = thread.native_id
                if native and seen.get(native) != thread.name:
                    seen[native] = thread.name
                    changed = True
            if changed:
                with open(path, "w") as out:
                    out.writelines(f"{k} {v}\n" for k, v in seen.items())
            time.sleep(0.1)
    threading.Thread(target=record, daemon=True, name="profile-thread-names").start()


def _yappi(prefix: str) -> None:
    import yappi

    yappi.set_clock_type(os.environ.get("NODEPOOL_K8S_PROFILE_CLOCK", "cpu"))
    yappi.start(builtins=False, profile_threads=True)

    def dump() -> None:
        yappi.stop()
        yappi.get_func_stats().save(f"{prefix}.{os.getpid()}.pstat", type="pstat")
    _AT_EXIT.append(dump)


def _zkops(prefix: str) -> None:
    import collections
    import re

    from kazoo.client import KazooClient

    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    original = KazooClient._call

    def pattern(path: str | None) -> str:
        return re.sub(r"\d{6,}", "N", re.sub(r"[0-9a-f]{32}", "H", path or ""))

    def call(self: KazooClient, request: object, async_object: object) -> object:
        name = type(request).__name__
        ops = getattr(request, "operations", None)
        if ops is not None:
            kinds = sorted({f"{type(o).__name__}:{pattern(getattr(o, 'path', ''))}"
                            for o in ops})
            counts[(f"{name}[{len(ops)}]", ",".join(kinds))] += 1
        else:
            watched = " (watch)" if getattr(request, "watcher", None) else ""
            counts[(name, pattern(getattr(request, "path", None)) + watched)] += 1
        return original(self, request, async_object)
    KazooClient._call = call

    def dump() -> None:
        with open(f"{prefix}.{os.getpid()}", "w") as out:
            for (name, what), count in counts.most_common():
                out.write(f"{count:8d} {name} {what}\n")
    _AT_EXIT.append(dump)


if _launcher():
    for variable, hook in (("NODEPOOL_K8S_PROFILE_THREADS", _threads),
                           ("NODEPOOL_K8S_PROFILE_YAPPI", _yappi),
                           ("NODEPOOL_K8S_PROFILE_ZKOPS", _zkops)):
        if os.environ.get(variable):
            hook(os.environ[variable])
    if _AT_EXIT:
        _wrap_exit()
