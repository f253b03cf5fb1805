"""Start and stop the whole local stack: ZooKeeper, the simulated Kubernetes API, launchers.

Owns: a `Stack` that runs, as child processes on 127.0.0.1, a real ZooKeeper (Debian's
package, see `testing.zookeeper`), the Kubernetes API simulator (`nodepool-k8s-sim`, in its
own process so that its CPU is not the launcher's) and any number of real
`nodepool-launcher` processes, plus the clients the demo, the benchmark and tests need:
ZooKeeper chroots, a Zuul-like client (`ZuulClient`), the `nodepool` CLI, the simulator's
API (admin token) and its call counters (`/debug/counters`), and per-process CPU and memory
from /proc.

Clean-up guarantees: everything lives in one temporary directory (ZooKeeper's data, the
kubeconfig, configurations, logs, and TMPDIR of every child), removed by `stop()`. Children
get SIGTERM from the kernel if this process dies (PR_SET_PDEATHSIG; the kernel sends it
when the *thread* that started the child ends, so start children from the main thread or
another thread that outlives them), and `stop()` stops
launchers with SIGTERM (graceful: exit 0 expected), then the simulator, then ZooKeeper,
escalating to SIGKILL after a timeout. `stop()` is idempotent and never raises; it returns
the problems it saw (a launcher that did not exit 0, say).

Failure modes: `StackError` when a child does not start or exits early (with the tail of
its log); `ZooKeeperUnavailable` from the ZooKeeper server.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

import yaml

from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer, four_letter

# nodepool_k8s/dev/testing/stack.py: three levels below the repository (etc/ is at its top).
REPO = Path(__file__).resolve().parents[3]
DEMO_CONFIG = REPO / "etc" / "demo" / "nodepool.yaml"
DEMO_PROVIDER = "k8s-demo"
SIM_CONTEXT = "sim"
_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


class StackError(RuntimeError):
    """A part of the stack did not start, or misbehaved."""


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGTERM this child when its parent dies (Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def command(script: str, module: str) -> list[str]:
    """The console script next to this interpreter, or `python -m module` without it."""
    path = Path(sys.executable).with_name(script)
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.02, check: Callable[[], None] | None = None) -> Any:
    """Poll `predicate` until truthy; `check()` may raise to abort early (a child died)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if check is not None:
            check()
        if time.monotonic() >= deadline:
            raise StackError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@dataclass(frozen=True)
class SimDelays:
    """The simulator's controller delays, seconds."""

    schedule: float = 0.0
    start: float = 0.0
    token: float = 0.0
    namespace_delete: float = 0.0
    pod_delete: float = 0.0
    latency: float = 0.0  # added to every API request (a real server's round trip)
    # (`SimulatorProcess` sends the larger of this and its own `latency` argument)

    def args(self) -> list[str]:
        return ["--schedule-delay", str(self.schedule), "--start-delay", str(self.start),
                "--token-delay", str(self.token),
                "--namespace-delete-delay", str(self.namespace_delete),
                "--pod-delete-delay", str(self.pod_delete)]

    def describe(self) -> str:
        if self == ZERO_DELAYS:
            return "zero"
        return (f"schedule {self.schedule:g}s, start {self.start:g}s, token {self.token:g}s, "
                f"ns delete {self.namespace_delete:g}s"
                + (f", latency {self.latency:g}s" if self.latency else ""))


ZERO_DELAYS = SimDelays()
# What a small real cluster roughly does when images are cached.
REALISTIC_DELAYS = SimDelays(schedule=0.2, start=1.0, token=0.1, namespace_delete=0.5,
                             pod_delete=0.0)


@dataclass(frozen=True)
class ProcStats:
    cpu_seconds: float
    rss_kib: int
    peak_rss_kib: int
    threads: int = 0


def proc_stats(pid: int) -> ProcStats | None:
    """CPU (user + system, all threads) and memory of a live process, from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    mem = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            mem[key] = int(value.split()[0])
    return ProcStats(cpu, mem.get("VmRSS", 0), mem.get("VmHWM", 0), mem.get("Threads", 0))


class ManagedProcess:
    """A child process with its log file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path,
                 env: Mapping[str, str]) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, env=dict(env),
                                          start_new_session=True,
                                          preexec_fn=_die_with_parent)
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise StackError(f"{self.name} exited with {self.popen.returncode}:\n"
                             f"{self.log_tail()}")

    def stats(self) -> ProcStats | None:
        return proc_stats(self.pid) if self.alive() else None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0, sig: int = signal.SIGTERM) -> int:
        """Signal, wait up to `timeout`, then SIGKILL. Returns the exit status."""
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(sig)
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.returncode = self.popen.returncode
        return self.returncode


class SimulatorProcess(ManagedProcess):
    """`nodepool-k8s-sim` in its own process; its API reachable with the admin kubeconfig."""

    def __init__(self, workdir: Path, env: Mapping[str, str], delays: SimDelays = ZERO_DELAYS,
                 error_rate: float = 0.0, latency: float = 0.0, seed: int = 0,
                 name: str = "simulator") -> None:
        self.kubeconfig = workdir / f"{name}.kubeconfig"
        ready = workdir / f"{name}.ready"
        argv = command("nodepool-k8s-sim", "nodepool_k8s.dev.simulator") + [
            "--kubeconfig", str(self.kubeconfig), "--ready-file", str(ready),
            "--context", SIM_CONTEXT, "--error-rate", str(error_rate),
            "--latency", str(max(latency, delays.latency)), "--seed", str(seed)] \
            + delays.args()
        super().__init__(name, argv, workdir / f"{name}.log", env)
        self.delays = delays
        try:
            wait_until(ready.exists, 60, "the simulator to listen", check=self.check_alive)
        except BaseException:
            self.stop(5)
            raise
        doc = yaml.safe_load(self.kubeconfig.read_text())
        cluster = doc["clusters"][0]["cluster"]
        self.url: str = cluster["server"]
        self.token: str = doc["users"][0]["user"]["token"]
        self._ssl: ssl.SSLContext | None = None
        if self.url.startswith("https:"):
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            self._ssl = ssl.create_default_context(cadata=ca)

    def api(self, path: str, timeout: float = 10.0) -> Any:
        """GET a path of the simulated API as the admin; the decoded JSON."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout, context=self._ssl) as answer:
            return json.loads(answer.read())

    def counters(self) -> dict[str, int]:
        """API calls by "verb resource" and "total" since the simulator started."""
        counts: dict[str, int] = self.api("/debug/counters")
        return counts

    def namespaces(self, label_selector: str | None = None) -> list[str]:
        query = "" if not label_selector else "?labelSelector=" + \
            urllib.parse.quote(label_selector)
        doc = self.api("/api/v1/namespaces" + query)
        return [item["metadata"]["name"] for item in doc.get("items", [])]


class LauncherProcess(ManagedProcess):
    """One `nodepool-launcher -c CONFIG --no-webapp` process (with `webapp`: serving the
    web app on the configuration's port)."""

    def __init__(self, name: str, config: Path, workdir: Path, env: Mapping[str, str],
                 chroot: str, webapp: bool = False) -> None:
        argv = command("nodepool-launcher", "nodepool_k8s.cmd.launcher") + [
            "-c", str(config)] + ([] if webapp else ["--no-webapp"])
        super().__init__(name, argv, workdir / f"{name}.log", env)
        self.config = config
        self.chroot = chroot


class FloorProcess(LauncherProcess):
    """The protocol-only launcher (`testing.floor`) on a launcher configuration: the floor
    the benchmark's bursts are compared with. No Kubernetes work, no web app; measured and
    stopped like a launcher."""

    def __init__(self, name: str, config: Path, workdir: Path, env: Mapping[str, str],
                 chroot: str) -> None:
        argv = [sys.executable, "-m", "nodepool_k8s.dev.testing.floor", "-c", str(config)]
        ManagedProcess.__init__(self, name, argv, workdir / f"{name}.log", env)
        self.config = config
        self.chroot = chroot


class Stack:
    """The local stack; use as a context manager or call `stop()` in a `finally`."""

    def __init__(self, workdir: str | None = None, keep: bool = False,
                 prefix: str = "nodepool-k8s-stack-") -> None:
        self._own_dir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix))
        self.keep = keep
        self.zk: ZooKeeperServer | None = None
        self.sim: SimulatorProcess | None = None
        self.launchers: list[LauncherProcess] = []
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._counter = 0
        self.problems: list[str] = []
        self.env = dict(os.environ, TMPDIR=str(self.workdir), PYTHONUNBUFFERED="1")

    # -- parts ----------------------------------------------------------------------------
    def start_zookeeper(self) -> ZooKeeperServer:
        if self.zk is None:
            self.zk = ZooKeeperServer(workdir=str(self.workdir / "zookeeper"),
                                      preexec_fn=_die_with_parent).start()
        return self.zk

    def start_simulator(self, delays: SimDelays = ZERO_DELAYS, error_rate: float = 0.0,
                        latency: float = 0.0, seed: int = 0) -> SimulatorProcess:
        """Start the simulator (replacing a running one: stop its launchers first)."""
        if self.sim is not None:
            self.sim.stop(10)
        self.sim = SimulatorProcess(self.workdir, self.env, delays, error_rate, latency, seed,
                                    name=f"simulator-{self._next()}")
        return self.sim

    def _next(self) -> int:
        with self._lock:
            self._counter += 1
            return self._counter

    @property
    def zk_port(self) -> int:
        if self.zk is None:
            raise StackError("ZooKeeper is not started")
        return self.zk.port

    def new_chroot(self, name: str = "nodepool") -> str:
        """A fresh chroot name; the launcher creates it on connect."""
        return f"/{name}-{uuid.uuid4().hex[:8]}"

    def config_env(self, chroot: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment the launcher and the CLI need for a `%(NODEPOOL_...)s` config."""
        if self.sim is None:
            raise StackError("the simulator is not started")
        # Each chroot is an installation of its own: its launchers pin their installation
        # id in a state directory of its own (as systemd's StateDirectory= gives one).
        state = self.workdir / f"state-{chroot.strip('/').replace('/', '-') or 'root'}"
        env = dict(self.env, NODEPOOL_ZK_HOST="127.0.0.1", NODEPOOL_ZK_PORT=str(self.zk_port),
                   NODEPOOL_ZK_CHROOT=chroot, NODEPOOL_WEBAPP_PORT="0",
                   KUBECONFIG=str(self.sim.kubeconfig), STATE_DIRECTORY=str(state))
        env.update(extra or {})
        return env

    def write_config(self, text: str, name: str = "nodepool") -> Path:
        path = self.workdir / f"{name}-{self._next()}.yaml"
        path.write_text(text)
        return path

    def start_launcher(self, chroot: str, config: Path = DEMO_CONFIG,
                       env: Mapping[str, str] | None = None,
                       webapp: bool = False) -> LauncherProcess:
        """Start one launcher process (not waiting for it; see `wait_launchers`)."""
        launcher = LauncherProcess(f"launcher-{self._next()}", config, self.workdir,
                                   self.config_env(chroot, env), chroot, webapp)
        self.launchers.append(launcher)
        return launcher

    def start_floor(self, chroot: str, config: Path = DEMO_CONFIG,
                    env: Mapping[str, str] | None = None) -> FloorProcess:
        """Start the protocol-only launcher (stopped like a launcher; see `wait_launchers`)."""
        floor = FloorProcess(f"floor-{self._next()}", config, self.workdir,
                             self.config_env(chroot, env), chroot)
        self.launchers.append(floor)
        return floor

    def wait_pools(self, chroot: str, count: int, timeout: float = 60.0) -> None:
        """Wait until at least `count` pool registrations of `chroot` exist."""
        from nodepool_k8s.zk import paths

        with self.zk_client(chroot) as zk:
            wait_until(lambda: len(zk.get_children(paths.POOL_COMPONENTS) or []) >= count,
                       timeout, f"{count} pool(s) to register", interval=0.05)

    def wait_launchers(self, chroot: str, count: int, timeout: float = 60.0) -> list[int]:
        """Wait until `count` launchers of `chroot` run; returns their ZooKeeper session ids."""
        running = [p for p in self.launchers if p.chroot == chroot]

        def check() -> None:
            for proc in running:
                proc.check_alive()

        from nodepool_k8s.zk import paths

        with self.zk_client(chroot) as zk:
            def sessions() -> list[int] | None:
                names = zk.get_children(paths.LAUNCHER_COMPONENTS) or []
                found = []
                for name in names:
                    got = zk.get(f"{paths.LAUNCHER_COMPONENTS}/{name}")
                    if got is None:
                        continue
                    try:
                        state = json.loads(got[0]).get("state")
                    except ValueError:
                        continue
                    if state == "running":
                        found.append(got[1].ephemeral_owner)
                pools = zk.get_children(paths.POOL_COMPONENTS) or []
                return found if len(found) >= count and pools else None
            ids: list[int] = wait_until(sessions, timeout, f"{count} launcher(s) to run",
                                        interval=0.05, check=check)
        return ids

    def stop_launchers(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM every launcher; their exit codes (a non-zero one is recorded a problem)."""
        codes = []
        for proc in self.launchers:
            was_alive = proc.alive()
            code = proc.stop(timeout)
            codes.append(code)
            if code != 0:
                how = "exited early" if not was_alive else "did not stop cleanly"
                self.problems.append(f"{proc.name} {how} (exit status {code}):\n"
                                     f"{proc.log_tail(1500)}")
        self.launchers = []
        return codes

    # -- clients --------------------------------------------------------------------------
    def zk_hosts(self, chroot: str = "") -> str:
        return f"127.0.0.1:{self.zk_port}{chroot}"

    class _ZkSession:
        def __init__(self, hosts: str) -> None:
            from nodepool_k8s.zk.client import ZkClient, ZkSettings
            self.client = ZkClient(ZkSettings(hosts=hosts, timeout=10.0))

        def __enter__(self) -> Any:
            stop = threading.Event()
            timer = threading.Timer(30, stop.set)
            timer.start()
            try:
                if not self.client.start(stop):
                    raise StackError("could not connect to ZooKeeper")
            finally:
                timer.cancel()
            return self.client

        def __exit__(self, *exc: object) -> None:
            self.client.stop()

    def zk_client(self, chroot: str) -> "Stack._ZkSession":
        """`with stack.zk_client(chroot) as zk:` a started `ZkClient` (ours, not kazoo)."""
        return Stack._ZkSession(self.zk_hosts(chroot))

    def zuul(self, chroot: str) -> Any:
        """A connected `ZuulClient` for `chroot`, closed by `stop()` if still open."""
        from nodepool_k8s.dev.testing.zuul_client import ZuulClient
        client = ZuulClient(self.zk_hosts(chroot))
        with self._lock:
            self._clients.append(client)
        return client

    def nodepool(self, chroot: str, *args: str, config: Path = DEMO_CONFIG,
                 env: Mapping[str, str] | None = None,
                 timeout: float = 60.0) -> tuple[subprocess.CompletedProcess[str], float]:
        """Run the `nodepool` CLI; (completed process, wall seconds)."""
        argv = command("nodepool", "nodepool_k8s.cmd.nodepoolcmd") + ["-c", str(config),
                                                                      *args]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=self.config_env(chroot, env), stdin=subprocess.DEVNULL)
        return done, time.monotonic() - started

    def zk_four_letter(self, word: str) -> str:
        return four_letter(self.zk_port, word)

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything that was started, remove the work dir; the problems seen.

        Bounded (each child gets SIGKILL after its timeout); in the main thread a second
        Ctrl-C or SIGTERM while stopping is ignored, so the clean-up is not cut short."""
        if self._stopped:
            return self.problems
        self._stopped = True
        shielded: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                shielded[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            self._stop_all()
        finally:
            for signum, handler in shielded.items():
                signal.signal(signum, handler)
        return self.problems

    def _stop_all(self) -> None:
        for client in self._clients:
            try:
                client.close()
            except Exception:
                pass
        self._clients = []
        try:
            self.stop_launchers()
        except Exception as exc:  # pragma: no cover - defensive
            self.problems.append(f"stopping launchers failed: {exc!r}")
        if self.sim is not None:
            try:
                self.sim.stop(10)
            except Exception as exc:  # pragma: no cover - defensive
                self.problems.append(f"stopping the simulator failed: {exc!r}")
        if self.zk is not None:
            try:
                self.zk.stop()
            except Exception as exc:  # pragma: no cover - defensive
                self.problems.append(f"stopping ZooKeeper failed: {exc!r}")
        if self._own_dir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class _SignalState:
    previous: dict[int, Any]
    # Set by the handler: a KeyboardInterrupt raised inside a library call (kazoo's, say)
    # may surface as another error (the connection it was using closed); this tells.
    signalled: threading.Event = field(default_factory=threading.Event)


def watchdog(seconds: float, fired: threading.Event) -> threading.Timer:
    """A started timer that sets `fired` and sends this process SIGINT after `seconds`
    (a real signal interrupts blocking waits of the main thread, unlike
    `_thread.interrupt_main`). Cancel it when done."""
    def fire() -> None:
        fired.set()
        os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


class interruptible:
    """`with interruptible():` SIGTERM and SIGHUP raise KeyboardInterrupt like Ctrl-C does,
    so `finally` blocks stop the stack, and `signalled` says whether one arrived. Only in
    the main thread; restores the old handlers."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __enter__(self) -> "interruptible":
        self._state = _SignalState({})
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._state.previous[sig] = signal.signal(sig, self._raise_interrupt)
        return self

    def _raise_interrupt(self, signum: int, frame: Any) -> None:
        self._state.signalled.set()
        raise KeyboardInterrupt(f"signal {signum}")

    @property
    def signalled(self) -> bool:
        return self._state.signalled.is_set()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._state.previous.items():
            signal.signal(sig, handler)


def run_guarded(stack: "Stack", what: str, timeout: float,
                body: Callable[[], T]) -> tuple[int, T | None, list[str]]:
    """Run `body` with the stack up, bounded by `timeout`, and always stop the stack.

    Ctrl-C, SIGTERM and SIGHUP stop everything (status 130); overrunning `timeout` or any
    failure reports it with the launchers' log tails (status 1). Returns the status, what
    `body` returned (None unless it finished), and the problems `stack.stop()` found.
    """
    timed_out = threading.Event()
    status, result = 1, None
    problems: list[str] = []
    with interruptible() as guard:
        # Every wait inside `body` is bounded already; this is the backstop.
        timer = watchdog(timeout, timed_out)
        try:
            result = body()
            status = 0
        except KeyboardInterrupt:
            status = _interrupted(what, timeout, timed_out)
        except Exception as exc:  # report whatever broke, then clean up
            if guard.signalled:  # the interrupt broke a library call on its way out
                status = _interrupted(what, timeout, timed_out)
            else:
                print(f"\n{what} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
                for proc in stack.launchers:
                    print(f"--- last lines of {proc.name}'s log ---\n{proc.log_tail()}",
                          file=sys.stderr)
        finally:
            timer.cancel()
            problems = stack.stop()
    return status, result, problems


def _interrupted(what: str, timeout: float, timed_out: threading.Event) -> int:
    """Report an interrupt: the watchdog's (a failure, 1) or a signal's (130)."""
    if timed_out.is_set():
        print(f"\n{what} FAILED: over its time limit ({timeout:g}s)", file=sys.stderr)
        return 1
    print("\ninterrupted: stopping everything", file=sys.stderr)
    return 130
