"""Helpers for launcher tests: a watcher that samples node counts on every change, real
`nodepool-launcher` processes (always killed by their fixture), and builds run the way
Zuul runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

from kazoo.client import KazooClient

from nodepool_k8s.dev.testing.zuul_client import ZuulClient
from nodepool_k8s.zk import paths
from tests.helpers import ZkConnection

LAUNCHER = Path(sys.executable).with_name("nodepool-launcher")


class NodeCounter:
    """Samples, on every change of `/nodepool/nodes`, how many nodes each provider (and
    each label) has, and keeps the maxima: a limit that is ever exceeded shows up here."""

    def __init__(self, client: KazooClient) -> None:
        self.client = client
        self.max: dict[str, int] = {}
        self.max_labels: dict[str, int] = {}
        self.max_total = 0
        self.samples = 0
        self._lock = threading.Lock()
        client.ensure_path(paths.NODES)
        client.ChildrenWatch(paths.NODES, self._changed)

    def _changed(self, children: list[str]) -> None:
        providers: dict[str, int] = {}
        labels: dict[str, int] = {}
        for child in children:
            try:
                body = json.loads(self.client.get(paths.node_path(child))[0])
            except Exception:
                continue
            providers[body.get("provider")] = providers.get(body.get("provider"), 0) + 1
            for label in body.get("type") or []:
                labels[label] = labels.get(label, 0) + 1
        with self._lock:
            self.samples += 1
            self.max_total = max(self.max_total, len(children))
            for key, count in providers.items():
                self.max[key] = max(self.max.get(key, 0), count)
            for key, count in labels.items():
                self.max_labels[key] = max(self.max_labels.get(key, 0), count)


class Processes:
    """Starts `nodepool-launcher` processes on the test's chroot, each with its own config
    file and log (`logs()` shows their tails); `stop_all` kills whatever still runs."""

    def __init__(self, zk: ZkConnection, tmp: Path) -> None:
        self.zk = zk
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, body: str, timeout: float = 2.0,
              env: Mapping[str, str] | None = None,
              web_port: int | None = None) -> subprocess.Popen[bytes]:
        """`env` adds to (and overrides) the inherited environment and the test defaults;
        with `web_port` the web app serves on 127.0.0.1 at that port."""
        index = len(self.procs)
        config = self.tmp / f"nodepool-{index}.yaml"
        web = "" if web_port is None else \
            f"webapp:\n  port: {web_port}\n  listen_address: 127.0.0.1\n"
        config.write_text(self.zk.config_yaml() + f"zookeeper-timeout: {timeout}\n" + web
                          + body)
        environment = dict(os.environ, NODEPOOL_K8S_CLEANUP_INTERVAL="2",
                           NODEPOOL_K8S_STALE_INIT_AGE="2")
        environment.update(env or {})
        command = [str(LAUNCHER)] if LAUNCHER.exists() else [
            sys.executable, "-m", "nodepool_k8s.cmd.launcher"]
        log = open(self.tmp / f"launcher-{index}.log", "wb")
        web_option = ["--no-webapp"] if web_port is None else []
        proc = subprocess.Popen(command + ["-c", str(config), *web_option], env=environment,
                                stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.tmp.glob("launcher-*.log")))

    def exit_code(self, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
        """The exit status of `proc`, a launcher expected to stop on its own within
        `timeout`; one still running fails the test with the logs."""
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher kept running:\n{self.logs()}") from None

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def run_builds(zuul: ZuulClient, label: str, count: int, logs: Callable[[], str]) -> None:
    """`count` builds of `label` as Zuul runs them: all requested at once, each fulfilled
    within 60 s (else `logs()` is the failure's text), then accepted, used and returned."""
    ids = [zuul.submit([label]) for _ in range(count)]
    for request_id in ids:
        body = zuul.wait(request_id, 60)
        assert body is not None and body["state"] == "fulfilled", logs()
    for request_id in ids:
        nodeset = zuul.accept(request_id)
        zuul.use(nodeset)
        zuul.release(nodeset)


def concurrent_builds(zuul: ZuulClient, node_types: Sequence[str], threads: int,
                      each: int = 1, timeout: float = 60.0) -> list[BaseException]:
    """`threads` Zuul-like build loops at once, `each` whole builds of `node_types` one
    after the other (each fulfilled within `timeout`); the errors they raised (a build
    not fulfilled, a thread still running after all its builds' time)."""
    errors: list[BaseException] = []

    def builds() -> None:
        try:
            for _ in range(each):
                zuul.run_build(list(node_types), timeout=timeout)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    running = [threading.Thread(target=builds) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(each * timeout + 30)
    errors += [TimeoutError(f"{t.name} still building") for t in running if t.is_alive()]
    return errors
