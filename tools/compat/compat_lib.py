"""Shared plumbing of the compatibility checks in tools/compat (not part of the test suite).

Owns: the report (named checks, sections that turn exceptions into failures, findings),
waiting helpers, a process wrapper that always stops what it started, the stack of servers
a check needs (one ZooKeeper with a plain and a TLS port, the Kubernetes API simulator) and
configuration snippets for our launcher. Everything is stopped by `Stack.close()`, which the
scripts call from `finally`, from a signal handler and from a global deadline timer.

The scripts run under .compat-venv/bin/python (tools/compat/setup.sh), where Zuul 14.3.0 and
nodepool_k8s are importable. Nodepool 11 lives in .compat-venv/nodepool-env and is only ever
run as a separate process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from kazoo.client import KazooClient

from nodepool_k8s.dev.simulator import Simulator, SimulatorConfig
from nodepool_k8s.dev.testing.stack import SimDelays, SimulatorProcess
from nodepool_k8s.dev.testing.zookeeper import ZooKeeperServer

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]


def _compat_venv() -> Path:
    """This checkout's .compat-venv; else the venv this interpreter runs in, when it holds a
    Nodepool env (a git worktree run with another checkout's .compat-venv/bin/python)."""
    own = ROOT / ".compat-venv"
    running = Path(sys.prefix)
    if not own.exists() and (running / "nodepool-env").exists():
        return running
    return own


COMPAT_VENV = _compat_venv()
NODEPOOL_ENV = COMPAT_VENV / "nodepool-env"

# Every key Nodepool 11 writes on a node (nodepool-protocol.md B1.4).
NODEPOOL_NODE_KEYS = frozenset("""
state state_time cloud provider pool type allocated_to az region public_ipv4 private_ipv4
public_ipv6 host_id interface_ip connection_port ssh_port image_id launcher created_time
external_id hostname comment user_data hold_job host_keys username connection_type
shell_type hold_expiration resources slot attributes python_path tenant_name driver_data
requestor node_properties""".split())

# Keys Zuul's NodeRequest.fromDict / updateFromDict index directly (KeyError otherwise).
ZUUL_REQUEST_REQUIRED = ("requestor", "requestor_data", "node_types", "provider", "state",
                         "state_time", "event_id")

GREEN, RED, YELLOW, RESET = ("\033[32m", "\033[31m", "\033[33m", "\033[0m") \
    if sys.stdout.isatty() else ("", "", "", "")


# -- report ------------------------------------------------------------------------------------

class Report:
    def __init__(self, title: str) -> None:
        self.title = title
        self.results: list[tuple[str, bool, str]] = []
        self.findings: list[str] = []
        self.section_name = ""
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def _name(self, name: str) -> str:
        return f"{self.section_name}: {name}" if self.section_name else name

    def check(self, name: str, condition: Any, detail: str = "") -> bool:
        ok = bool(condition)
        full = self._name(name)
        with self._lock:
            self.results.append((full, ok, "" if ok else detail))
        mark = f"{GREEN}PASS{RESET}" if ok else f"{RED}FAIL{RESET}"
        line = f"  [{mark}] {full}"
        if not ok and detail:
            line += f"\n         {detail}"
        print(line, flush=True)
        return ok

    def fail(self, name: str, detail: str) -> None:
        self.check(name, False, detail)

    def note(self, text: str) -> None:
        """A finding worth reporting that is not a failure (e.g. a known difference)."""
        with self._lock:
            self.findings.append(text)
        print(f"  [{YELLOW}NOTE{RESET}] {text}", flush=True)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        print(f"\n== {name}", flush=True)
        outer, self.section_name = self.section_name, name
        try:
            yield
        except Exception as exc:
            tb = traceback.format_exc(limit=6)
            self.fail("completed without an exception", f"{exc!r}\n{tb}")
        finally:
            self.section_name = outer

    @property
    def failures(self) -> list[tuple[str, bool, str]]:
        return [r for r in self.results if not r[1]]

    def summary(self) -> int:
        took = time.monotonic() - self.started
        passed = sum(1 for r in self.results if r[1])
        print(f"\n==== {self.title}: {passed}/{len(self.results)} checks passed "
              f"in {took:.0f}s", flush=True)
        if self.findings:
            print("Findings / known differences:")
            for text in self.findings:
                print(f"  - {text}")
        if self.failures:
            print("Failed checks:")
            for name, _, detail in self.failures:
                print(f"  - {name}" + (f": {detail.splitlines()[0]}" if detail else ""))
            return 1
        return 0 if self.results else 1


class ErrorLogCapture(logging.Handler):
    """Collects ERROR records (and exceptions) logged by a library's loggers."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        out = []
        for record in self.records:
            text = f"{record.name}: {record.getMessage()}"
            if record.exc_info and record.exc_info[1] is not None:
                text += f" ({record.exc_info[1]!r})"
            out.append(text)
        self.records.clear()
        return out


# -- waiting -----------------------------------------------------------------------------------

def wait_for(predicate: Callable[[], T], timeout: float, message: str,
             interval: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {message}")
        time.sleep(interval)


# -- processes ---------------------------------------------------------------------------------

class Process:
    """A child process with its output in a log file; stopped gracefully, then killed."""

    def __init__(self, name: str, argv: list[str], log_path: Path,
                 env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "Process":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                     env=self.env, cwd=self.cwd, start_new_session=True)
        log.close()
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            except ProcessLookupError:
                pass
        # Children it may have left behind (same session): never a broad kill by name.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.returncode

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


# -- the stack ---------------------------------------------------------------------------------

class Stack:
    """ZooKeeper (plain + TLS ports), an optional simulator, and processes; all stoppable."""

    def __init__(self, workdir: str | None = None, keep: bool = False) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="nodepool-k8s-compat-"))
        self.keep = keep
        self.zk: ZooKeeperServer | None = None
        self.sim: Simulator | None = None
        self.sim_process: SimulatorProcess | None = None
        self.kubeconfig: str | None = None
        self.processes: list[Process] = []
        self.kazoo_clients: list[KazooClient] = []
        self._closed = False
        self._close_lock = threading.Lock()

    # lifecycle
    def start_zookeeper(self) -> ZooKeeperServer:
        self.zk = ZooKeeperServer(tls=True, workdir=str(self.workdir / "zk")).start()
        return self.zk

    def start_simulator(self, enforce_rbac: bool = True, **config: Any) -> Simulator:
        self.sim = Simulator(SimulatorConfig(tls=True, enforce_rbac=enforce_rbac,
                                             **config)).start()
        self.kubeconfig = self.sim.write_kubeconfig(self.workdir / "kubeconfig", context="sim")
        return self.sim

    def start_simulator_process(self, delays: SimDelays,
                                env: dict[str, str] | None = None) -> SimulatorProcess:
        """The simulator in its own process (`nodepool-k8s-sim`, admin kubeconfig, context
        `sim`, RBAC not enforced), so its CPU does not compete with this process's threads
        for the GIL: for measurements. Its API (`api`, `counters`) is the admin's."""
        self.sim_process = SimulatorProcess(self.workdir, env or dict(os.environ), delays)
        self.kubeconfig = str(self.sim_process.kubeconfig)
        return self.sim_process

    def process(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                cwd: str | None = None) -> Process:
        proc = Process(name, argv, self.workdir / f"{name}.log", env=env, cwd=cwd)
        self.processes.append(proc)
        return proc.start()

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                proc.stop()
        for client in self.kazoo_clients:
            with contextlib.suppress(Exception):
                client.stop()
                client.close()
        if self.sim is not None:
            with contextlib.suppress(Exception):
                self.sim.stop()
        if self.sim_process is not None:
            with contextlib.suppress(Exception):
                self.sim_process.stop(10)
        if self.zk is not None:
            with contextlib.suppress(Exception):
                self.zk.stop()
        if not self.keep:
            import shutil
            shutil.rmtree(self.workdir, ignore_errors=True)

    def install_guards(self, deadline: float) -> None:
        """Stop everything on SIGINT/SIGTERM and when the global deadline passes."""

        def abort(reason: str) -> None:
            print(f"\n!! aborting: {reason}; stopping everything", flush=True)
            self.close()
            os._exit(3)

        def on_signal(signum: int, _frame: Any) -> None:
            abort(f"signal {signum}")

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        timer = threading.Timer(deadline, abort, args=(f"global deadline of {deadline:.0f}s",))
        timer.daemon = True
        timer.start()

    # ZooKeeper helpers
    def chroot(self) -> str:
        assert self.zk is not None
        chroot = f"/compat-{uuid.uuid4().hex[:12]}"
        client = KazooClient(hosts=self.zk.hosts)
        client.start(timeout=15)
        try:
            client.ensure_path(chroot)
        finally:
            client.stop()
            client.close()
        return chroot

    def hosts(self, chroot: str, tls: bool) -> str:
        assert self.zk is not None
        port = self.zk.secure_port if tls else self.zk.port
        return f"127.0.0.1:{port}{chroot}"

    def tls_files(self) -> tuple[str, str, str]:
        """(ca, cert, key)"""
        assert self.zk is not None and self.zk.tls_files is not None
        t = self.zk.tls_files
        return t.ca, t.cert, t.key

    def zk_yaml(self, chroot: str, tls: bool) -> str:
        assert self.zk is not None
        port = self.zk.secure_port if tls else self.zk.port
        text = (f"zookeeper-servers:\n  - host: 127.0.0.1\n    port: {port}\n"
                f"    chroot: {chroot}\n")
        if tls:
            ca, cert, key = self.tls_files()
            text += f"zookeeper-tls:\n  ca: {ca}\n  cert: {cert}\n  key: {key}\n"
        return text

    def kazoo(self, chroot: str) -> KazooClient:
        """A raw plain-port kazoo client inside `chroot`, for observing znodes."""
        assert self.zk is not None
        client = KazooClient(hosts=self.hosts(chroot, tls=False))
        client.start(timeout=15)
        self.kazoo_clients.append(client)
        return client

    def state_dir(self, chroot: str) -> str:
        """Where our launchers of `chroot` (an installation of its own) pin their id."""
        return str(self.workdir / ("state-" + chroot.strip("/").replace("/", "-")))

    # our launcher
    def start_our_launcher(self, name: str, chroot: str, tls: bool, body: str,
                           extra_env: dict[str, str] | None = None) -> Process:
        config = self.workdir / f"{name}.yaml"
        config.write_text(self.zk_yaml(chroot, tls) + "zookeeper-timeout: 10\n" + body)
        env = dict(os.environ)
        env.update({"NODEPOOL_K8S_CLEANUP_INTERVAL": "2", "NODEPOOL_K8S_STALE_INIT_AGE": "5",
                    "NODEPOOL_K8S_DELETE_RETRY": "0.5", "NODEPOOL_K8S_QUOTA_RETRY": "0.5",
                    "NODEPOOL_K8S_MIN_READY_BACKOFF": "1"})
        if self.kubeconfig:
            env["KUBECONFIG"] = self.kubeconfig
        env["STATE_DIRECTORY"] = self.state_dir(chroot)
        env.update(extra_env or {})
        return self.process(name, our_command("nodepool-launcher", "nodepool_k8s.cmd.launcher")
                            + ["-c", str(config), "--no-webapp"], env=env)


def our_command(script: str, module: str) -> list[str]:
    """Our console script next to this interpreter (as installed), else `python -m`."""
    path = Path(sys.executable).with_name(script)
    return [str(path)] if path.exists() else [sys.executable, "-m", module]


def pool_components(client: KazooClient) -> list[dict[str, Any]]:
    out = []
    path = "/nodepool/components/pool"
    for child in (client.get_children(path) if client.exists(path) else []):
        with contextlib.suppress(Exception):
            data, _ = client.get(f"{path}/{child}")
            out.append(json.loads(data.decode("utf8")))
    return out


class RequestTreeWatcher(threading.Thread):
    """Samples /nodepool/requests continuously: children under request znodes and empty
    request znodes are protocol violations (Zuul's non-recursive delete and its readers)."""

    def __init__(self, client: KazooClient, interval: float = 0.05) -> None:
        super().__init__(daemon=True, name="request-tree-watcher")
        self.client = client
        self.interval = interval
        self.violations: list[str] = []
        self.samples = 0
        self.seen_ids: set[str] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        root = "/nodepool/requests"
        while not self._halt.is_set():
            try:
                children = self.client.get_children(root) if self.client.exists(root) else []
                for child in children:
                    self.seen_ids.add(child)
                    found = self.client.exists(f"{root}/{child}")
                    if found is None:
                        continue
                    if found.numChildren:
                        self.violations.append(f"{child} has {found.numChildren} children")
                    if found.dataLength == 0:
                        self.violations.append(f"{child} has empty data")
                self.samples += 1
            except Exception:
                pass
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


class NodeSampler(threading.Thread):
    """Samples /nodepool/nodes: which provider each node id belonged to (ids are unique)."""

    def __init__(self, client: KazooClient, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name="node-sampler")
        self.client = client
        self.interval = interval
        self.providers: dict[str, str | None] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        root = "/nodepool/nodes"
        while not self._halt.is_set():
            try:
                for child in (self.client.get_children(root) if self.client.exists(root)
                              else []):
                    if child in self.providers:
                        continue
                    with contextlib.suppress(Exception):
                        data, _ = self.client.get(f"{root}/{child}")
                        if data:
                            self.providers[child] = json.loads(data.decode("utf8")).get(
                                "provider")
            except Exception:
                pass
            self._halt.wait(self.interval)

    def ids_of(self, provider: str) -> set[str]:
        return {k for k, v in self.providers.items() if v == provider}

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


def check_protocol_invariants(report: Report, watcher: RequestTreeWatcher,
                              zuul_logs: ErrorLogCapture, raw: KazooClient) -> None:
    """End-of-run checks both scripts make: the request tree stayed clean, Zuul's code
    logged no errors, and no Zuul request was left behind (min-ready ones may stay)."""
    watcher.stop()
    report.check(f"no child and no empty data under any request znode "
                 f"({watcher.samples} samples)", not watcher.violations,
                 "; ".join(sorted(set(watcher.violations))[:5]))
    errors = zuul_logs.take()
    report.check("Zuul's code logged no errors", not errors, "; ".join(errors[:5]))
    leftover = [r for r in raw.get_children("/nodepool/requests") if not r.startswith("900-")]
    report.check("no Zuul request left behind", not leftover, f"{leftover}")
