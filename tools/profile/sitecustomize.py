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
  NODEPOOL_K8S_PROFILE_TRACEMALLOC=PREFIX
                                       tracemalloc from the start (frames per trace:
                                       NODEPOOL_K8S_PROFILE_TRACEMALLOC_FRAMES, 1); not at
                                       exit but on request: write a label to
                                       PREFIX.<pid>.ask and the launcher appends one JSON
                                       line to PREFIX.<pid>.jsonl (the growth by line since
                                       the first and the previous report, with FRAMES > 1
                                       the biggest growths' call stacks, the growth of live
                                       objects by type, the thread names), then removes the
                                       .ask file. The benchmark's
                                       `--soak-tracemalloc` does this after every round

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


def _tracemalloc(prefix: str) -> None:
    import json
    import threading
    import time
    import tracemalloc

    tracemalloc.start(int(os.environ.get("NODEPOOL_K8S_PROFILE_TRACEMALLOC_FRAMES", "1")))
    ask = f"{prefix}.{os.getpid()}.ask"
    out_path = f"{prefix}.{os.getpid()}.jsonl"
    # Our own bookkeeping and the import machinery are not the launcher's memory.
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, __file__),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
              tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
              tracemalloc.Filter(False, "<unknown>")]

    def top(now: tracemalloc.Snapshot, then: tracemalloc.Snapshot,
            limit: int = 25) -> list[dict[str, object]]:
        rows = []
        for stat in now.compare_to(then, "lineno")[:limit]:
            frame = stat.traceback[0]
            rows.append({"where": f"{frame.filename}:{frame.lineno}",
                         "size_diff_kib": round(stat.size_diff / 1024, 1),
                         "count_diff": stat.count_diff,
                         "size_kib": round(stat.size / 1024, 1), "count": stat.count})
        return rows

    def stacks(now: tracemalloc.Snapshot, then: tracemalloc.Snapshot,
               limit: int = 12) -> list[dict[str, object]]:
        return [{"size_diff_kib": round(stat.size_diff / 1024, 1),
                 "count_diff": stat.count_diff,
                 "stack": [f"{f.filename}:{f.lineno}" for f in stat.traceback]}
                for stat in now.compare_to(then, "traceback")[:limit]]

    def types() -> dict[str, int]:
        import collections
        import gc
        counts: collections.Counter[str] = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())
        return dict(counts)

    def holders(grown: list[tuple[int, str]]) -> dict[str, list[list[str]]]:
        """For the grown types outside builtins: who refers to a few of the newest
        instances (the referrer's type; for a dict, also who holds that dict)."""
        import gc
        wanted = {k for n, k in grown[:40] if n > 0 and not k.startswith("builtins.")}
        samples: dict[str, list[object]] = {}
        for obj in reversed(gc.get_objects()):
            name = f"{type(obj).__module__}.{type(obj).__qualname__}"
            if name in wanted and len(samples.setdefault(name, [])) < 3:
                samples[name].append(obj)
        out: dict[str, list[list[str]]] = {}
        for name, objs in samples.items():
            for obj in objs:
                chain = []
                for ref in gc.get_referrers(obj):
                    if ref is objs or ref is samples:
                        continue
                    kind = f"{type(ref).__module__}.{type(ref).__qualname__}"
                    if isinstance(ref, dict):
                        kind += " in " + ",".join(sorted({
                            f"{type(r).__module__}.{type(r).__qualname__}"
                            for r in gc.get_referrers(ref) if r is not samples})[:4])
                    chain.append(kind)
                out.setdefault(name, []).append(chain[:6])
            del objs[:]
        return out

    def serve() -> None:
        first: tracemalloc.Snapshot | None = None
        last: tracemalloc.Snapshot | None = None
        first_types: dict[str, int] | None = None
        while True:
            time.sleep(0.2)
            try:
                with open(ask) as f:
                    label = f.read().strip()
            except FileNotFoundError:
                continue
            snap = tracemalloc.take_snapshot().filter_traces(ignore)
            first = first or snap
            now_types = types()
            first_types = first_types or now_types
            grown = sorted(((now_types.get(k, 0) - first_types.get(k, 0), k)
                            for k in set(now_types) | set(first_types)), reverse=True)
            current, peak = tracemalloc.get_traced_memory()
            report = {"label": label, "time": time.time(),
                      "traced_kib": round(current / 1024, 1),
                      "traced_peak_kib": round(peak / 1024, 1),
                      "threads": sorted(t.name for t in threading.enumerate()),
                      "since_first": top(snap, first),
                      "since_last": top(snap, last or snap),
                      "types_since_first": [[k, n] for n, k in grown[:25] if n],
                      "holders": holders(grown),
                      "stacks_since_first": stacks(snap, first)
                      if tracemalloc.get_traceback_limit() > 1 else []}
            last = snap
            with open(out_path, "a") as out:
                out.write(json.dumps(report) + "\n")
            os.unlink(ask)
    threading.Thread(target=serve, daemon=True, name="profile-tracemalloc").start()


if _launcher():
    for variable, hook in (("NODEPOOL_K8S_PROFILE_THREADS", _threads),
                           ("NODEPOOL_K8S_PROFILE_YAPPI", _yappi),
                           ("NODEPOOL_K8S_PROFILE_ZKOPS", _zkops),
                           ("NODEPOOL_K8S_PROFILE_TRACEMALLOC", _tracemalloc)):
        if os.environ.get(variable):
            hook(os.environ[variable])
    if _AT_EXIT:
        _wrap_exit()
