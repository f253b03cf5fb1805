"""`nodepool-launcher`: run the launcher in the foreground, the way systemd expects it.

Owns: argument parsing, logging set-up (`-l`), loading the configuration once before
anything starts, and turning signals into requests to `launcher.service.LauncherService`
(which owns the process: web app, reloads, sd_notify). There is no daemonizing: systemd
(`Type=notify`) or a container runtime supervises. `-f` (Nodepool's "foreground") is
accepted and changes nothing; `-p PIDFILE` writes the process id at start and removes it at
exit (runtime/pidfile.py), as Nodepool's launcher does.

Signals: SIGTERM, SIGINT (and SIGUSR1, as in Nodepool) stop gracefully (stop taking
work, cancel in-flight launches and remove what they created, hand accepted requests back,
release locks, unregister, close the session) and exit 0; a second one while stopping
exits at once (status 1). SIGHUP reloads the configuration. SIGUSR2 logs the stack of
every thread. The signal handlers only write the signal number to a
pipe; a relay thread acts on it, because the service's requests take locks and a signal
handler that takes a lock the interrupted main thread holds would deadlock.

Exit status: 0 after a graceful stop; 1 when the configuration, the logging file or the web
app's address is unusable at start, when ZooKeeper refuses the configured credentials or
ACL at start (one line naming the znode, "check zookeeper-auth/zookeeper-acl"), when the
installation id cannot be settled safely at start (one line: ZooKeeper records another id
than the configured or pinned one, or the state file cannot be read or written; see
zk/identity.py), or the launcher failed unexpectedly.
Engine tuning that is not part of nodepool.yaml comes from `NODEPOOL_K8S_*` environment
variables (see launcher/settings.py); statsd from `STATSD_HOST`/`STATSD_PORT`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

from nodepool_k8s import __version__
from nodepool_k8s.runtime import logconfig, pidfile
from nodepool_k8s.runtime import stats as stats_mod
from nodepool_k8s.core.errors import ConfigError

if TYPE_CHECKING:
    from nodepool_k8s.config.loader import Fingerprint
    from nodepool_k8s.config.model import Config
    from nodepool_k8s.launcher.settings import EngineSettings
    from nodepool_k8s.runtime.stats import Stats

DEFAULT_CONFIG = "/etc/nodepool/nodepool.yaml"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

log = logging.getLogger("nodepool_k8s.cmd.launcher")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nodepool-launcher",
                                     description="Hand out Kubernetes namespaces and pods to "
                                                 "Zuul over the Nodepool protocol.")
    parser.add_argument("-c", "--config", default=DEFAULT_CONFIG,
                        help=f"main configuration file (default: {DEFAULT_CONFIG})")
    parser.add_argument("-s", "--secure", default=None, help="secure configuration file")
    parser.add_argument("-l", "--logconfig", default=None,
                        help="logging configuration (.yaml/.json dictConfig or INI)")
    parser.add_argument("--no-webapp", action="store_true",
                        help="do not serve the web app")
    parser.add_argument("-d", "--debug", action="store_true", help="debug logging")
    parser.add_argument("-f", "--foreground", action="store_true",
                        help="stay in the foreground (always so; accepted for Nodepool's"
                             " units and container commands)")
    parser.add_argument("-p", "--pidfile", default=None, metavar="PIDFILE",
                        help="write the process id to PIDFILE (removed at exit; refused"
                             " while another live process holds it)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


class SignalRelay:
    """Signal handlers that only write to a pipe, and a thread that acts on what arrives.

    Signals that arrive before `connect` are kept and delivered to the first handler set.
    """

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = tuple(signals)
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._early: list[int] = []
        self._lock = threading.Lock()
        self._previous: dict[int, object] = {}
        self._thread = threading.Thread(target=self._relay, name="signal-relay", daemon=True)

    def install(self) -> "SignalRelay":
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        self._thread.start()
        return self

    def connect(self, handlers: dict[int, Callable[[int], None]]) -> None:
        with self._lock:
            self._handlers = dict(handlers)
            early, self._early = self._early, []
        for signum in early:
            self._deliver(signum)

    def uninstall(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        self._previous.clear()
        os.close(self._write)  # the relay thread reads end-of-file and ends
        if self._thread.is_alive():
            self._thread.join(5)
        os.close(self._read)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        try:
            os.write(self._write, bytes([signum]))
        except BlockingIOError:
            pass  # a full pipe already holds plenty of pending signals

    def _relay(self) -> None:
        while True:
            data = os.read(self._read, 64)
            if not data:
                return
            for signum in data:
                self._deliver(signum)

    def _deliver(self, signum: int) -> None:
        with self._lock:
            handler = self._handlers.get(signum)
            if handler is None:
                self._early.append(signum)
                return
        try:
            handler(signum)
        except Exception:
            log.exception("Handling signal %d failed", signum)


def dump_stacks(signum: int) -> None:
    """Log every thread's stack (SIGUSR2): where is it stuck?

    Done in Python on the relay thread: faulthandler's C-level dump of running threads can
    crash the process.
    """
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"Thread {names.get(ident, '?')} ({ident}):\n{stack}")
    log.warning("Stacks of %d threads (SIGUSR2):\n%s", len(parts), "\n".join(parts))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Handlers first: until the service exists, signals are only recorded (and a SIGHUP
    # during start-up does not kill the process, as its default action would).
    relay = SignalRelay(STOP_SIGNALS + (signal.SIGHUP, signal.SIGUSR2)).install()
    try:
        return _run(args, relay)
    finally:
        relay.uninstall()


def _run(args: argparse.Namespace, relay: SignalRelay) -> int:
    try:
        logconfig.setup(args.logconfig, debug=args.debug)
    except ConfigError as exc:
        print(f"nodepool-launcher: {exc}", file=sys.stderr)
        return 1
    from nodepool_k8s.config.loader import config_fingerprint, load_config
    from nodepool_k8s.launcher.settings import EngineSettings

    try:
        fingerprint = config_fingerprint(args.config, args.secure)
        config = load_config(args.config, args.secure)
        settings = EngineSettings.from_env()
        stats = stats_mod.from_env()
    except ConfigError as exc:
        print(f"nodepool-launcher: invalid configuration:\n{exc}", file=sys.stderr)
        return 1
    if args.pidfile is not None:
        try:
            pidfile.claim(args.pidfile)
        except pidfile.PidFileError as exc:
            print(f"nodepool-launcher: {exc}", file=sys.stderr)
            return 1
    try:
        return _serve(args, relay, config, fingerprint, settings, stats)
    finally:
        if args.pidfile is not None:
            pidfile.release(args.pidfile)


def _serve(args: argparse.Namespace, relay: SignalRelay, config: Config,
           fingerprint: Fingerprint, settings: EngineSettings, stats: Stats) -> int:
    from nodepool_k8s.launcher.service import LauncherService
    from nodepool_k8s.zk.errors import ZkAuthError
    from nodepool_k8s.zk.identity import InstallationIdError

    for warning in config.warnings:
        log.warning("%s", warning)

    try:
        service = LauncherService(args.config, args.secure, config, fingerprint=fingerprint,
                                  stats=stats, settings=settings, webapp=not args.no_webapp)
    except ConfigError as exc:  # the tracing packages are installed but cannot be loaded
        print(f"nodepool-launcher: invalid configuration:\n{exc}", file=sys.stderr)
        return 1

    def stop(signum: int) -> None:
        if service.stopping:
            log.warning("Received signal %d while stopping: exiting at once", signum)
            _exit(args, 1)
        log.info("Received signal %d: stopping gracefully", signum)
        service.request_stop()

    def reload(signum: int) -> None:
        log.info("Received SIGHUP: reloading the configuration")
        service.request_reload()

    relay.connect({**{signum: stop for signum in STOP_SIGNALS}, signal.SIGHUP: reload,
                   signal.SIGUSR2: dump_stacks})
    try:
        status = service.run()
    except ZkAuthError as exc:
        log.error("Cannot use ZooKeeper: %s", exc)
        print(f"nodepool-launcher: cannot use ZooKeeper: {exc}", file=sys.stderr)
        _exit(args, 1)
    except InstallationIdError as exc:
        log.error("Not starting: %s", exc)
        print(f"nodepool-launcher: installation id: {exc}", file=sys.stderr)
        _exit(args, 1)
    except Exception:
        log.exception("The launcher failed")
        return 1
    # The service has handed its work back (or its stop deadline passed). Launch and
    # deletion threads may still be blocked on an unreachable API or ZooKeeper, and the
    # interpreter would join them at exit (concurrent.futures does, daemonic or not),
    # waiting for their retries to run out: end the process now.
    _exit(args, status)


def _exit(args: argparse.Namespace, status: int) -> NoReturn:
    """End the process at once (no thread joins), the pid file removed first."""
    if args.pidfile is not None:
        pidfile.release(args.pidfile)
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
