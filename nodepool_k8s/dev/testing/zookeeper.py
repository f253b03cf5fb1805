"""Run a throwaway ZooKeeper server from Debian's `zookeeper` package.

Owns: starting `org.apache.zookeeper.server.ZooKeeperServerMain` as a child process on
127.0.0.1 with a free port and a private data directory, optionally with a TLS port backed by
a throwaway CA made with openssl, and stopping it again. Used by the test fixtures, the demo
and the benchmark; the launcher itself never imports this module.

Failure modes: `ZooKeeperUnavailable` when Java or the jar is missing, or when the server
does not report `Mode:` through the `srvr` four-letter command before the deadline (`ruok`
answers before the server can serve sessions, so it is not used).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

JAVA_DIR = Path("/usr/share/java")
ZK_JAR = JAVA_DIR / "zookeeper.jar"
# Debian's zookeeper.jar manifest lists the netty jars it needs for plain sockets but not the
# ones Netty's TLS server factory loads; without them a secureClientPort fails at start.
EXTRA_JARS = (
    "netty-codec.jar",
    "netty-resolver.jar",
    "netty-transport-native-unix-common.jar",
)
# Debian ships ZooKeeper without an SLF4J binding, so the server's own errors (an
# OutOfMemoryError that stops it, for one) vanish; slf4j-simple at WARN puts them in
# zookeeper.log when libslf4j-java is installed.
LOG_JARS = ("slf4j-simple.jar",)
LOG_FLAGS = ["-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
             "-Dorg.slf4j.simpleLogger.showDateTime=true"]
# A standalone server holds every node record twice or more while it writes its log and
# answers large reads: 256 MiB ran out at 10,000 node records of 3 KB (a realistic token
# and CA each) and the server stopped serving, so the benchmark's scale phase gets room.
HEAP = "-Xmx768m"


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper could not be started or did not become ready."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throwaway CA and a certificate it signed (usable by server and client)."""

    ca: str
    cert: str
    key: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def four_letter(port: int, word: str, timeout: float = 1.0) -> str:
    """Send a four-letter command to a plain client port and return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def make_tls_files(directory: str) -> TlsFiles:
    """Create a CA and a 127.0.0.1/localhost certificate signed by it, with openssl."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca_crt = d / "ca.key", d / "ca.pem"
    key, csr, crt = d / "zk.key", d / "zk.csr", d / "zk.pem"
    ext = d / "ext.cnf"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", "/CN=nodepool-k8s-test-ca", "-keyout", str(ca_key), "-out", str(ca_crt))
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
        "-keyout", str(key), "-out", str(csr))
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(crt))
    return TlsFiles(ca=str(ca_crt), cert=str(crt), key=str(key))


class ZooKeeperServer:
    """A standalone ZooKeeper child process; use as a context manager or call start/stop."""

    def __init__(self, tls: bool = False, workdir: str | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> None:
        """`preexec_fn` runs in the child before exec (the demo stack sets a death signal)."""
        self.tls = tls
        self._preexec_fn = preexec_fn
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="nodepool-k8s-zk-")
        self.port = 0
        self.secure_port = 0
        self.tls_files: TlsFiles | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- public -----------------------------------------------------------------------------
    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (for CPU and memory readings)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def secure_hosts(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    def start(self, timeout: float = 60.0) -> "ZooKeeperServer":
        if not ZK_JAR.exists():
            raise ZooKeeperUnavailable(
                f"{ZK_JAR} not found: install Debian's zookeeper package (tools/test-setup.sh)")
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable("java not found: install a JRE (tools/test-setup.sh)")
        data = Path(self.workdir) / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        lines = [
            "tickTime=500",
            "initLimit=10",
            "syncLimit=5",
            f"dataDir={data}",
            "clientPortAddress=127.0.0.1",
            f"clientPort={self.port}",
            "maxClientCnxns=0",
            "4lw.commands.whitelist=*",
            "admin.enableServer=false",
            # Sessions of killed test launchers should expire quickly.
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
            "forceSync=no",
        ]
        if self.tls:
            self.tls_files = make_tls_files(os.path.join(self.workdir, "tls"))
            self.secure_port = free_port()
            lines += [
                f"secureClientPort={self.secure_port}",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                "ssl.keyStore.type=PEM",
                f"ssl.keyStore.location={self._combined_pem()}",
                "ssl.trustStore.type=PEM",
                f"ssl.trustStore.location={self.tls_files.ca}",
                "ssl.clientAuth=need",
                # A TLS client is authenticated as `x509:<subject DN of its certificate>`
                # (usable in ACLs); the plain port stays anonymous.
                "authProvider.x509="
                "org.apache.zookeeper.server.auth.X509AuthenticationProvider",
            ]
        cfg = Path(self.workdir) / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        classpath = ":".join([str(ZK_JAR)] + [
            str(JAVA_DIR / j) for j in EXTRA_JARS + LOG_JARS if (JAVA_DIR / j).exists()])
        log = open(Path(self.workdir) / "zookeeper.log", "wb")
        self._proc = subprocess.Popen(
            [java, HEAP, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *LOG_FLAGS,
             "-Dzookeeper.admin.enableServer=false",
             "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=self._preexec_fn)
        log.close()
        self._wait_ready(timeout)
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --------------------------------------------------------------------------
    def _combined_pem(self) -> str:
        assert self.tls_files is not None
        path = Path(self.workdir) / "tls" / "server-keystore.pem"
        path.write_text(Path(self.tls_files.key).read_text()
                        + Path(self.tls_files.cert).read_text())
        return str(path)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with {self._proc.returncode}: {self._log_tail()}")
            try:
                if "Mode:" in four_letter(self.port, "srvr"):
                    if not self.tls or self._port_open(self.secure_port):
                        return
            except OSError as exc:
                last_error = str(exc)
            time.sleep(0.05)
        self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper not ready after {timeout}s ({last_error})")

    @staticmethod
    def _port_open(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_tail(self) -> str:
        try:
            return (Path(self.workdir) / "zookeeper.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""


class ZooKeeperEnsemble:
    """Three `QuorumPeerMain` servers on free loopback ports, for failover tests.

    `leader()` names the index of the current leader (from `srvr`), `kill(i)` SIGKILLs one
    server and `restart(i)` brings it back with its data. A short tickTime keeps elections
    to about a second. Failure: `ZooKeeperUnavailable` when the quorum does not form.
    """

    SIZE = 3

    def __init__(self, workdir: str | None = None) -> None:
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="nodepool-k8s-zk3-")
        self.client_ports = [free_port() for _ in range(self.SIZE)]
        self._peer_ports = [(free_port(), free_port()) for _ in range(self.SIZE)]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * self.SIZE

    @property
    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.client_ports)

    def start(self, timeout: float = 90.0) -> "ZooKeeperEnsemble":
        for index in range(self.SIZE):
            self._start_one(index)
        self.wait_quorum(timeout)
        return self

    def _config(self, index: int) -> Path:
        base = Path(self.workdir) / f"server-{index + 1}"
        data = base / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "myid").write_text(f"{index + 1}\n")
        lines = [
            "tickTime=200", "initLimit=20", "syncLimit=10", f"dataDir={data}",
            "clientPortAddress=127.0.0.1", f"clientPort={self.client_ports[index]}",
            "maxClientCnxns=0", "4lw.commands.whitelist=*", "admin.enableServer=false",
            "minSessionTimeout=1000", "maxSessionTimeout=60000", "forceSync=no",
            "cnxTimeout=1000",
        ]
        lines += [f"server.{i + 1}=127.0.0.1:{peer}:{election}"
                  for i, (peer, election) in enumerate(self._peer_ports)]
        cfg = base / "zoo.cfg"
        cfg.write_text("\n".join(lines) + "\n")
        return cfg

    def _start_one(self, index: int) -> None:
        java = shutil.which("java")
        if java is None or not ZK_JAR.exists():
            raise ZooKeeperUnavailable("java or the zookeeper jar is missing (tools/test-setup.sh)")
        cfg = self._config(index)
        log = open(cfg.parent / "zookeeper.log", "ab")
        self._procs[index] = subprocess.Popen(
            [java, "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             "-Dzookeeper.admin.enableServer=false", "-cp", str(ZK_JAR),
             "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def mode(self, index: int) -> str | None:
        """"leader", "follower" or None (down, or not serving yet)."""
        try:
            answer = four_letter(self.client_ports[index], "srvr")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def leader(self) -> int | None:
        modes = [self.mode(i) for i in range(self.SIZE)]
        return modes.index("leader") if "leader" in modes else None

    def wait_quorum(self, timeout: float = 60.0) -> int:
        """Wait until every running server serves and one leads; the leader's index."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = [i for i, p in enumerate(self._procs) if p is not None
                       and p.poll() is None]
            modes = [self.mode(i) for i in running]
            if modes and all(modes) and modes.count("leader") == 1:
                return running[modes.index("leader")]
            time.sleep(0.05)
        raise ZooKeeperUnavailable(f"no quorum after {timeout}s")

    def kill(self, index: int) -> None:
        proc, self._procs[index] = self._procs[index], None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def restart(self, index: int, timeout: float = 60.0) -> None:
        """Start server `index` again and wait until it serves (a JVM that dies at start,
        e.g. on a port taken meanwhile, is started again)."""
        self.kill(index)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._start_one(index)
            proc = self._procs[index]
            while time.monotonic() < deadline and proc is not None and proc.poll() is None:
                if self.mode(index):
                    return
                time.sleep(0.05)
            self.kill(index)
        raise ZooKeeperUnavailable(f"server {index + 1} did not rejoin within {timeout}s")

    def stop(self) -> None:
        for index in range(self.SIZE):
            self.kill(index)
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)
