"""Profiling hooks for a benchmark's launcher processes (not part of the package).

Put this directory first on PYTHONPATH when running `tools/benchmark`; in a process whose
command line names `nodepool-launcher`, each of these environment variables switches on
one measurement, written when the launcher exits (it leaves through `os._exit`, which is
wrapped for that):

  NODEPOOL_K8S_PROFILE_THREADS=PREFIX  native thread id -> thread name, for per-thread
                                       CPU from /proc (`thread_cpu.py`)  -> PREFIX.<pid>
  NODEPOOL_K8S_PROFILE_YAPPI=PREFIX    yappi profile of every thread, CPU clock (or the
                                       clock in NODEPOOL_K8S_PROFILE_CLOCK, e.g. wall)
                                       -> PREFIX.<pid>.pstat (read with pstats), and
                                       one per thread, by group (numbered names as _N):
                                       PREFIX.<pid>.<group>.<ctx>.pstat
  NODEPOOL_K8S_PROFILE_ZKOPS=PREFIX    ZooKeeper requests sent, by type and path pattern
                                       (refused ones once more, as FAILED)
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
  NODEPOOL_K8S_PROFILE_MEMSTATS=PREFIX what tracemalloc does not show, without tracing:
                                       on request (PREFIX.<pid>.ask, answered in
                                       PREFIX.<pid>.jsonl like tracemalloc's) the RSS, the
                                       collector's generations and thresholds, what every
                                       generation's collections freed so far (and the RSS
                                       around each full collection), and pymalloc's arenas
                                       (`sys._debugmallocstats`), glibc's heap
                                       (`mallinfo2`), the resident memory by kind
                                       of mapping (/proc/self/smaps). With
                                       NODEPOOL_K8S_PROFILE_MEMSTATS_COLLECT=1 each report
                                       also forces a full collection with DEBUG_SAVEALL:
                                       the garbage it found by type (and the referrers'
                                       types of a few) and the RSS after freeing it. That
                                       changes what it measures: use it for what, an
                                       untouched run for how much. The benchmark's
                                       `--soak-memstats N` does this after every N-th round

yappi slows pure-Python code several times over: use it to rank, and the per-thread CPU
(no overhead) to size. See doc/benchmark.md, "Reproducing and profiling".
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

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
    import re
    import threading

    import yappi

    yappi.set_clock_type(os.environ.get("NODEPOOL_K8S_PROFILE_CLOCK", "cpu"))
    # Threads by their names (launch-<provider>_3, node-cache), not their class.
    yappi.set_context_name_callback(lambda: threading.current_thread().name)
    yappi.start(builtins=False, profile_threads=True)

    def dump() -> None:
        yappi.stop()
        yappi.get_func_stats().save(f"{prefix}.{os.getpid()}.pstat", type="pstat")
        # And one profile per thread, named by its group (numbered names summed, as
        # thread_cpu.py does): PREFIX.<pid>.<group>.<ctx>.pstat; pstats.Stats(*files)
        # merges a group's.
        for thread in yappi.get_thread_stats():
            name = re.sub(r"_\d+$", "_N", str(thread.name))
            stats = yappi.get_func_stats(filter={"ctx_id": thread.id})
            if not stats.empty():
                safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
                stats.save(f"{prefix}.{os.getpid()}.{safe}.{thread.id}.pstat", type="pstat")
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
        if ops is not None:
            failed = (f"FAILED {name}[{len(ops)}]", ",".join(kinds))
        else:
            failed = (f"FAILED {name}", pattern(getattr(request, "path", None)))

        def answered(result: Any) -> None:
            # A refused request (or a transaction with a refused operation) is counted a
            # second time under FAILED: a failed write is still a write. A multi-read's
            # missing znode shows as FAILED too.
            try:
                if not result.successful():
                    counts[failed] += 1
                    return
                value = result.get_nowait()
                if isinstance(value, list) and any(isinstance(v, Exception) for v in value):
                    counts[failed] += 1
            except Exception:
                pass
        async_object.rawlink(answered)
        return original(self, request, async_object)
    KazooClient._call = call

    def dump() -> None:
        with open(f"{prefix}.{os.getpid()}", "w") as out:
            for (name, what), count in counts.most_common():
                out.write(f"{count:8d} {name} {what}\n")
    _AT_EXIT.append(dump)


def _tracemalloc(prefix: str) -> None:
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

    first: tracemalloc.Snapshot | None = None
    last: tracemalloc.Snapshot | None = None
    first_types: dict[str, int] | None = None

    def report(label: str) -> dict[str, object]:
        nonlocal first, last, first_types
        snap = tracemalloc.take_snapshot().filter_traces(ignore)
        first = first or snap
        now_types = types()
        first_types = first_types or now_types
        grown = sorted(((now_types.get(k, 0) - first_types.get(k, 0), k)
                        for k in set(now_types) | set(first_types)), reverse=True)
        current, peak = tracemalloc.get_traced_memory()
        answer = {"label": label, "time": time.time(),
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
        return answer
    _answer_requests(ask, out_path, "profile-tracemalloc", report)


def _answer_requests(ask: str, out_path: str, name: str,
                     report: Callable[[str], dict[str, object]]) -> None:
    """On a thread: whenever the file `ask` appears, append `report(its label)` as one JSON
    line to `out_path` and remove `ask` (the benchmark waits for that)."""
    import json
    import threading
    import time

    def serve() -> None:
        while True:
            time.sleep(0.2)
            try:
                with open(ask) as f:
                    label = f.read().strip()
            except FileNotFoundError:
                continue
            with open(out_path, "a") as out:
                out.write(json.dumps(report(label)) + "\n")
            os.unlink(ask)
    threading.Thread(target=serve, daemon=True, name=name).start()


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _mallocstats() -> dict[str, int]:
    """pymalloc's totals from `sys._debugmallocstats()` (it writes to the C stderr, which
    is borrowed for the call); {} while tracemalloc traces (its hooks hide pymalloc)."""
    import re
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^#?\s*([A-Za-z# ][^=]*?)\s*=\s*([\d,]+)\s*$", line)
        if m:
            key = re.sub(r"\s+", " ", m.group(1).strip("# "))
            if key not in out and not key[0].isdigit():
                out[key] = int(m.group(2).replace(",", ""))
    return out


_MALLINFO: list[object] = []


def _mallinfo() -> dict[str, int]:
    """glibc's heap totals (`mallinfo2`, all arenas): what pymalloc's arenas do not hold
    (objects over 512 bytes, C libraries' own memory) lives here; {} without glibc."""
    import ctypes

    if not _MALLINFO:
        class Info(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = Info
        except (OSError, AttributeError):
            return {}
        _MALLINFO.append(libc.mallinfo2)
    info = _MALLINFO[0]()  # type: ignore[operator]
    return {"heap_kib": info.arena // 1024, "mmapped_kib": info.hblkhd // 1024,
            "in_use_kib": info.uordblks // 1024, "free_kib": info.fordblks // 1024,
            "free_chunks": info.ordblks, "top_free_kib": info.keepcost // 1024}


def _smaps() -> dict[str, int]:
    """Resident KiB by kind of mapping (/proc/self/smaps), told apart by name, size and
    alignment: the brk heap (glibc's main arena), glibc's per-thread arenas (aligned to
    64 MiB), thread stacks (8 MiB), other anonymous memory (pymalloc's arenas, which the
    kernel merges when adjacent, large blocks glibc maps on their own, the interpreter's
    frame stacks) and files (code, shared libraries)."""
    out: dict[str, int] = {}
    kind = "?"
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    size_kib = (hi - lo) // 1024
                    name = head[5] if len(head) > 5 else ""
                    if name == "[heap]":
                        kind = "brk heap"
                    elif name == "[stack]":
                        kind = "main stack"
                    elif name.startswith("/") or name.startswith("["):
                        kind = "files" if name.startswith("/") else name
                    elif lo % (64 << 20) == 0:
                        kind = "glibc thread arenas"  # aligned to their 64 MiB reservation
                    elif size_kib == 8192:
                        kind = "thread stacks"
                    else:
                        kind = "other anonymous"
                elif head[0] == "Rss:":
                    out[kind] = out.get(kind, 0) + int(head[1])
    except OSError:
        return {}
    return out


def _memstats(prefix: str) -> None:
    import collections
    import gc
    import threading
    import time

    ask = f"{prefix}.{os.getpid()}.ask"
    out_path = f"{prefix}.{os.getpid()}.jsonl"
    census = os.environ.get("NODEPOOL_K8S_PROFILE_MEMSTATS_COLLECT") == "1"
    collections_by_gen = [0, 0, 0]
    collected_by_gen = [0, 0, 0]
    full: list[dict[str, float]] = []
    started: dict[str, float] = {}

    def callback(phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            if generation == 2:
                started["rss"] = _rss_kib()
                started["t"] = time.monotonic()
            return
        collections_by_gen[generation] += 1
        collected_by_gen[generation] += info["collected"]
        if generation == 2 and "rss" in started:
            full.append({"t": round(time.time(), 1), "collected": info["collected"],
                         "rss_before_kib": started["rss"], "rss_after_kib": _rss_kib(),
                         "ms": round((time.monotonic() - started["t"]) * 1000, 1)})
            del full[:-50]
    gc.callbacks.append(callback)

    def garbage() -> dict[str, object]:
        before = _rss_kib()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            found = gc.collect()
        finally:
            gc.set_debug(0)
        kinds = collections.Counter(
            f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
        where: dict[str, list[str]] = {}
        for obj in gc.garbage:
            name = f"{type(obj).__module__}.{type(obj).__qualname__}"
            if name.startswith("builtins.") and name not in (
                    "builtins.frame", "builtins.function", "builtins.cell"):
                continue
            if len(where.setdefault(name, [])) < 3:
                if name == "builtins.frame":
                    where[name].append(f"{obj.f_code.co_filename}:{obj.f_lineno} "
                                       f"{obj.f_code.co_name}")
                elif name == "builtins.function":
                    where[name].append(f"{obj.__code__.co_filename}:"
                                       f"{obj.__code__.co_firstlineno} {obj.__qualname__}")
                elif name == "builtins.cell":
                    where[name].append(type(obj.cell_contents).__qualname__
                                       if obj.cell_contents is not None else "None")
                else:
                    where[name].append(repr(obj)[:160])
        gc.garbage.clear()
        gc.collect()
        return {"found": found, "rss_before_kib": before, "rss_after_kib": _rss_kib(),
                "types": kinds.most_common(40), "samples": where,
                "malloc_after": _mallocstats(), "libc_after": _mallinfo()}

    def owner(obj: object) -> str:
        """Who holds `obj`: the referrers' types, through a dict to its owner's type."""
        names = []
        for ref in gc.get_referrers(obj):
            if isinstance(ref, list) and ref is largest_seen:
                continue
            kind = type(ref).__qualname__
            if isinstance(ref, dict):
                for holder in gc.get_referrers(ref):
                    if getattr(holder, "__dict__", None) is ref:
                        kind = f"{type(holder).__module__}.{type(holder).__qualname__}"
                        kind += "." + next((k for k, v in ref.items() if v is obj), "?")
                        break
            else:
                attrs = getattr(ref, "__dict__", None)
                if isinstance(attrs, dict):
                    kind = f"{type(ref).__module__}.{type(ref).__qualname__}." + next(
                        (k for k, v in attrs.items() if v is obj), "?")
            names.append(kind)
            if len(names) >= 4:
                break
        return ", ".join(names)

    largest_seen: list[object] = []

    def largest(limit: int = 15, floor: int = 32 * 1024) -> list[dict[str, object]]:
        """The biggest containers (their own size: a dict's or list's table, which glibc
        holds once over 512 bytes) and strings, with who holds them."""
        kinds = (dict, list, set, frozenset, collections.deque, str, bytes, bytearray)
        big: dict[int, object] = {}
        for obj in gc.get_objects():
            # Containers of atomic values only (a dict of str to float) are not tracked
            # by the collector: they are found through whoever holds them.
            for o in (obj, *gc.get_referents(obj)):
                if isinstance(o, kinds) and sys.getsizeof(o) >= floor:
                    big[id(o)] = o
        found = sorted(((sys.getsizeof(o), i, o) for i, o in big.items()),
                       key=lambda t: t[0], reverse=True)[:limit]
        big.clear()
        largest_seen[:] = [o for _, _, o in found]
        try:
            return [{"kib": size // 1024, "type": type(o).__qualname__, "len": len(o),
                     "held_by": owner(o)} for size, _, o in found]
        finally:
            largest_seen.clear()
            del found

    def report(label: str) -> dict[str, object]:
        answer = {"label": label, "time": time.time(), "rss_kib": _rss_kib(),
                  "gc_count": gc.get_count(), "gc_threshold": gc.get_threshold(),
                  "gc_stats": gc.get_stats(), "gc_freeze_count": gc.get_freeze_count(),
                  "gc_objects": [len(gc.get_objects(g)) for g in range(3)],
                  "collections": list(collections_by_gen),
                  "collected": list(collected_by_gen),
                  "full_collections": list(full),
                  "threads": len(threading.enumerate()),
                  "malloc": _mallocstats(), "libc": _mallinfo(), "smaps": _smaps(),
                  "largest": largest()}
        if census:
            answer["garbage"] = garbage()
        return answer
    _answer_requests(ask, out_path, "profile-memstats", report)


if _launcher():
    for variable, hook in (("NODEPOOL_K8S_PROFILE_THREADS", _threads),
                           ("NODEPOOL_K8S_PROFILE_YAPPI", _yappi),
                           ("NODEPOOL_K8S_PROFILE_ZKOPS", _zkops),
                           ("NODEPOOL_K8S_PROFILE_TRACEMALLOC", _tracemalloc),
                           ("NODEPOOL_K8S_PROFILE_MEMSTATS", _memstats)):
        if os.environ.get(variable):
            hook(os.environ[variable])
    if _AT_EXIT:
        _wrap_exit()
