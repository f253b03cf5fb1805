"""One launcher process: the engine, its web app, configuration reloads and systemd.

Owns the process around `daemon.Launcher`:

* start-up order: the web app first (so `/ready` answers 503 while the launcher connects),
  then the launcher; `READY=1` to systemd once it serves requests;
* reloads: `request_reload()` (SIGHUP) or the configuration files changing on disk. The
  files are checked with a stat (mtime in ns and size, `config.loader.config_fingerprint`)
  every `poll_interval` seconds; a change is applied once the files have stayed unchanged
  for one interval, so an editor's half-written file is not loaded. The new files are
  validated completely before anything is switched: an invalid configuration is logged
  with all its problems and the running one stays. Changed ZooKeeper connection settings
  (servers, chroot, TLS, timeout) and `tracing` settings are logged as needing a restart;
  everything else is applied (`Launcher.reload`), and a changed `webapp` port or address
  restarts the web server. Every valid reload, even of an unchanged configuration, has the
  providers read their credentials again (a rewritten kubeconfig). systemd hears
  `RELOADING=1` ... `READY=1` around each reload;
* stopping: `request_stop()` (SIGTERM, SIGINT) ends `run()`, which sends `STOPPING=1`,
  stops the launcher gracefully (see `Launcher.stop`) and then the web app.

Signals are not handled here (see cmd/launcher.py): these methods are called from an
ordinary thread, never from a signal handler, because they take locks.

Failure modes: `run()` returns 1 when the web app cannot listen at start (the port is
taken, the address is not local); a web port that cannot be bound on reload is logged and
the previous one is served again. Errors of a reload never stop the launcher.
"""

from __future__ import annotations

import logging
import threading

from nodepool_k8s.runtime import sdnotify, threads
from nodepool_k8s.runtime import stats as stats_names
from nodepool_k8s.config.loader import Fingerprint, config_fingerprint, load_config
from nodepool_k8s.config.model import Config, WebappConfig
from nodepool_k8s.core.errors import ConfigError
from nodepool_k8s.launcher.daemon import Launcher
from nodepool_k8s.launcher.settings import EngineSettings
from nodepool_k8s.launcher.reporting.status_source import LauncherStatus
from nodepool_k8s.runtime.stats import Stats
from nodepool_k8s.web.app import WebApp, WebSettings
from nodepool_k8s.zk import events as zk_events
from nodepool_k8s.zk.client import ZkSettings

log = logging.getLogger("nodepool_k8s.NodePool")

POLL_INTERVAL = 1.0


class LauncherService:
    def __init__(self, config_path: str, secure_path: str | None, config: Config, *,
                 fingerprint: Fingerprint | None = None, stats: Stats | None = None,
                 settings: EngineSettings | None = None, webapp: bool = True,
                 poll_interval: float = POLL_INTERVAL) -> None:
        self.config_path = config_path
        self.secure_path = secure_path
        self.stats = stats or Stats()
        self.launcher = Launcher(config, stats=self.stats, settings=settings)
        self.status = LauncherStatus(self.launcher, self.stats)
        self.poll_interval = poll_interval
        self.webapp: WebApp | None = None
        self._webapp_enabled = webapp
        self._web_config: WebappConfig | None = None
        self._zk_settings = ZkSettings.from_config(config)
        self._tracing = config.tracing  # the launcher's tracer is made from it, once
        # Taken by the caller before it read the files, so an edit in between is noticed.
        self._fingerprint = fingerprint if fingerprint is not None \
            else config_fingerprint(config_path, secure_path)
        self._pending: Fingerprint | None = None
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._wake = threading.Event()
        self.stop_overran = False  # the graceful stop hit its deadline (see run)
        self.reloads = 0  # reloads that were applied (a valid configuration)
        self.failed_reloads = 0
        # Both counters exist from the start (at 0), so a rate or an alert on them works
        # before the first reload.
        self.stats.count(stats_names.PROM_CONFIG_RELOADS, 0)
        self.stats.count(stats_names.PROM_CONFIG_RELOAD_FAILURES, 0)

    # -- requests from other threads ------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def request_reload(self) -> None:
        self._reload.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- the main loop --------------------------------------------------------------------
    def run(self) -> int:
        """Serve until `request_stop()`; the exit status for the process."""
        try:
            if self._webapp_enabled and not self._start_webapp(self.launcher.config.webapp):
                return 1
            sdnotify.status("Connecting to ZooKeeper")
            if self.launcher.start(self._stop):
                sdnotify.ready(self._describe())
                self._loop()
            return 0
        finally:
            sdnotify.stopping()
            self._stop_within_deadline()

    def _stop_within_deadline(self) -> None:
        """Stop the launcher and the web app, giving up after `stop_timeout` seconds.

        A graceful stop waits on ZooKeeper and on running launches; with either gone a
        step could block (kazoo retries a lock release until the session is back). The
        steps run on a thread of their own; if they overrun, `stop_overran` is set and the
        caller ends the process: what was not handed back is recovered by the next start
        or by another launcher (ephemeral locks vanish with the session).
        """
        def stop_all() -> None:
            self.launcher.stop()
            if self.webapp is not None:
                self.webapp.stop()
                self.webapp = None
        worker = threads.start("graceful-stop", stop_all, on_crash=threads.Crash.END,
                               report=self.launcher.engine.stats.thread_crashed)
        worker.join(self.launcher.engine.settings.stop_timeout)
        if worker.is_alive():
            self.stop_overran = True
            log.warning("Graceful stop did not finish within %.1fs; exiting anyway",
                        self.launcher.engine.settings.stop_timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._reload.is_set():
                self._reload.clear()
                self.reload("SIGHUP")
            elif self._files_changed():
                self.reload("the configuration file changed")

    def _files_changed(self) -> bool:
        """True once a changed fingerprint has been stable for one poll interval."""
        current = config_fingerprint(self.config_path, self.secure_path)
        if current == self._fingerprint:
            self._pending = None
            return False
        if current != self._pending:
            self._pending = current  # still being written, perhaps: look again next time
            return False
        return True

    def _describe(self) -> str:
        return f"Serving {len(self.launcher.pool_workers)} pool(s)"

    # -- reload ---------------------------------------------------------------------------
    def reload(self, why: str) -> bool:
        """Load the files again and apply them; False (old configuration kept) if invalid."""
        self._fingerprint, self._pending = \
            config_fingerprint(self.config_path, self.secure_path), None
        log.info("Reloading the configuration (%s)", why)
        sdnotify.reloading()
        status = None
        try:
            try:
                config = load_config(self.config_path, self.secure_path)
            except ConfigError as exc:
                log.error("The new configuration is invalid; still running the previous "
                          "one. Problems:\n%s", exc)
                status = "Running the previous configuration: the new one is invalid"
                self._rejected("the new configuration is invalid", exc)
                return False
            for warning in config.warnings:
                log.warning("%s", warning)
            zk_settings = ZkSettings.from_config(config)
            if zk_settings != self._zk_settings:
                log.warning("The ZooKeeper connection settings changed (servers, chroot, TLS, "
                            "timeout, auth or ACL); they take effect when the launcher is "
                            "restarted")
            if config.tracing != self._tracing:
                log.warning("The tracing settings changed; they take effect when the "
                            "launcher is restarted")
            if config == self.launcher.config:
                log.info("The configuration is unchanged")
                # The kubeconfig is not one of the watched files, and may be why the
                # operator reloads: the providers read their credentials again.
                self.launcher.refresh_credentials()
            else:
                self.launcher.reload(config)
            if self._webapp_enabled and config.webapp != self._web_config:
                self._restart_webapp(config.webapp)
            self.reloads += 1
            self.stats.config_reload(applied=True)
            return True
        except ConfigError as exc:
            # Valid on its own, but not applicable to the running launcher (a changed
            # installation-id): nothing of it was applied.
            log.error("The new configuration cannot be applied; still running the previous "
                      "one: %s", exc)
            status = "Running the previous configuration: the new one cannot be applied"
            self._rejected("the new configuration cannot be applied", exc)
            return False
        except Exception as exc:
            log.exception("Applying the new configuration failed")
            self._rejected("applying the new configuration failed", exc)
            return False
        finally:
            sdnotify.ready(status or self._describe())

    def _rejected(self, what: str, exc: Exception) -> None:
        """A reload that was not applied: counted, and in the event log with the error's
        first line (the log has all of it), so `nodepool events` shows why."""
        self.failed_reloads += 1
        self.stats.config_reload(applied=False)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        first = lines[0] if lines else type(exc).__name__
        more = f" (+{len(lines) - 1} more line(s) in the launcher's log)" \
            if len(lines) > 1 else ""
        self.launcher.engine.events.record(zk_events.RELOAD_REJECTED,
                                           message=f"{what}: {first}{more}")

    # -- web app --------------------------------------------------------------------------
    def _start_webapp(self, web: WebappConfig) -> bool:
        try:
            settings = WebSettings(threads=web.threads, timeout=web.timeout,
                                   send_timeout=web.send_timeout,
                                   max_header_size=web.max_header_size,
                                   max_connections=web.max_connections,
                                   allow_origin=web.allow_origin)
            self.webapp = WebApp(self.status, web.port, web.listen_address,
                                 settings=settings).start()
        except OSError as exc:
            log.error("Cannot serve the web app on %s port %d: %s", web.listen_address,
                      web.port, exc)
            return False
        self._web_config = web
        return True

    def _restart_webapp(self, web: WebappConfig) -> None:
        old, old_config = self.webapp, self._web_config
        log.info("Web app address changed: restarting it on %s port %d", web.listen_address,
                 web.port)
        if old is not None:
            old.stop()  # first: the new address may overlap the old one (same port)
            self.webapp = None
        if self._start_webapp(web) or old_config is None:
            return
        log.error("Serving the web app on the previous address again")
        self._start_webapp(old_config)
