"""`nodepool-launcher`: run the launcher in the foreground until SIGTERM or SIGINT.

Owns: argument parsing, logging set-up, loading the configuration and the signal handling
around `launcher.daemon.Launcher`. SIGTERM and SIGINT stop gracefully (stop taking work,
cancel launches, hand pending requests back, release locks, unregister, close the session)
and exit 0. There is no daemonizing or pid file: systemd or a container runtime supervises.

Exit status: 0 after a graceful stop, 1 when the configuration or logging set-up is invalid.
Engine tuning that is not part of nodepool.yaml comes from `NODEPOOL_K8S_*` environment
variables (see launcher/settings.py); statsd from `STATSD_HOST`/`STATSD_PORT`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Sequence

from nodepool_k8s import __version__, logconfig
from nodepool_k8s import stats as stats_mod
from nodepool_k8s.exceptions import ConfigError

DEFAULT_CONFIG = "/etc/nodepool/nodepool.yaml"

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
    parser.add_argument("--version", action="version", version=__version__)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        logconfig.setup(args.logconfig, debug=args.debug)
        from nodepool_k8s.config.loader import load_config
        from nodepool_k8s.launcher.daemon import Launcher
        from nodepool_k8s.launcher.settings import EngineSettings

        config = load_config(args.config, args.secure)
        settings = EngineSettings.from_env()
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    for warning in config.warnings:
        log.warning("%s", warning)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("Received signal %d; stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    launcher = Launcher(config, stats=stats_mod.from_env(), settings=settings)
    try:
        if launcher.start(stop):
            while not stop.wait(1.0):
                pass
    finally:
        launcher.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
