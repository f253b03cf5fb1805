"""The ZooKeeper connection: kazoo set-up, session tracking and typed primitive operations.

Owns: one `KazooClient` built from the configuration (plain or TLS, chroot, session timeout =
`zookeeper-timeout`), the initial connect (retried forever with a log line at most every
10 s), the connection state the rest of the launcher sees, and thin wrappers around the
primitive operations that translate kazoo exceptions into `zk.errors` types and count writes.

Connection states: `CONNECTED`, `SUSPENDED` (connection dropped, session may survive: stop
acting, locks may still be ours), `LOST` (session expired: every ephemeral znode and lock of
ours is gone). `epoch` increases on every LOST, so a holder of a lock taken in an older epoch
knows it no longer owns it. State listeners are called on a dedicated thread, in order, so
they may perform ZooKeeper operations (kazoo's own listener thread must never block).

Access control (see `access`): the session authenticates with `zookeeper-auth` (and, over TLS,
with its client certificate when ZooKeeper runs the x509 provider); with `zookeeper-acl`
enabled every znode created through this client gets the configured ACL (kazoo's
`default_acl`). When either is configured, `start` checks access before returning: it lists
the protocol's top-level znodes and, with an ACL, creates and deletes a probe znode, so a
launcher with wrong credentials fails at once with a message naming the path.

Failure modes: reads retry through connection loss for up to one session timeout, then raise
`ZkConnectionError`; writes are never retried here (a lost reply would make a retry unsafe)
and raise `ZkConnectionError` when the connection drops under them. ZooKeeper refusing us
(authentication failed, an ACL without our identity, an ACL we may not set) raises the
permanent `ZkAuthError`, never retried; `start` raises it instead of retrying forever.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

from kazoo import exceptions as kex
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState, KeeperState, ZnodeStat
from kazoo.retry import KazooRetry

from nodepool_k8s.config.model import Config, ZkAcl, ZkAuth, ZkTls
from nodepool_k8s.zk import _kazoo_ext, access, echo, errors, multiread, paths

log = logging.getLogger("nodepool_k8s.zk.client")

T = TypeVar("T")


class ConnectionState(enum.Enum):
    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@dataclass(frozen=True)
class Stat:
    """The znode metadata the launcher uses (times in seconds)."""

    version: int
    cversion: int
    ctime: float
    mtime: float
    mzxid: int
    ephemeral_owner: int
    num_children: int

    @classmethod
    def of(cls, stat: ZnodeStat) -> "Stat":
        return cls(version=stat.version, cversion=stat.cversion, ctime=stat.ctime / 1000.0,
                   mtime=stat.mtime / 1000.0, mzxid=stat.mzxid,
                   ephemeral_owner=stat.ephemeralOwner, num_children=stat.numChildren)


@dataclass(frozen=True)
class ZkSettings:
    hosts: str
    timeout: float = 10.0
    tls: ZkTls | None = None
    connect_attempt_timeout: float = 10.0
    retry_log_interval: float = 10.0
    auth: ZkAuth | None = None
    acl: ZkAcl | None = None

    @classmethod
    def from_config(cls, config: Config) -> "ZkSettings":
        return cls(hosts=config.zk_hosts(), timeout=config.zookeeper_timeout,
                   tls=config.zookeeper_tls, auth=config.zookeeper_auth,
                   acl=config.zookeeper_acl)

    @property
    def acl_enabled(self) -> bool:
        return self.acl is not None and self.acl.enabled


class WriteCounter:
    """Counts write requests (a multi counts once) and individual write operations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.ops = 0

    def add(self, ops: int = 1) -> None:
        with self._lock:
            self.requests += 1
            self.ops += ops

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.ops


StateListener = Callable[[ConnectionState, int], None]


_AUTH_ERRORS = (kex.NoAuthError, kex.AuthFailedError, kex.InvalidACLError)


def translate(exc: Exception, path: str | None = None) -> Exception:
    """Map a kazoo exception to our typed errors (unknown ones pass through); `path` names
    the znode in the message of a permanent access error."""
    if isinstance(exc, _AUTH_ERRORS):
        return errors.ZkAuthError(type(exc).__name__, path)
    if isinstance(exc, kex.NoNodeError):
        return errors.NoNodeError(str(exc) or "no node")
    if isinstance(exc, kex.BadVersionError):
        return errors.VersionConflict(str(exc) or "bad version")
    if isinstance(exc, kex.NodeExistsError):
        return errors.NodeExistsError(str(exc) or "node exists")
    if isinstance(exc, kex.NotEmptyError):
        return errors.NotEmptyError(str(exc) or "not empty")
    if isinstance(exc, (kex.SessionExpiredError, kex.ConnectionClosedError)):
        return errors.ZkSessionLost(str(exc) or "session lost")
    if isinstance(exc, (kex.ConnectionLoss, kex.OperationTimeoutError, kex.ZookeeperError,
                        kex.KazooException)):
        return errors.ZkConnectionError(f"{type(exc).__name__}: {exc}")
    return exc


def _batch_paths(paths: list[str]) -> str:
    """How an access error of a batched read names its znodes."""
    if len(paths) == 1:
        return paths[0]
    return f"one of {len(paths)} znodes from {paths[0]}" if paths else "(no znodes)"


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except Exception:  # noqa: BLE001 - an abandoned attempt: nothing left to report to
        log.debug("stopping an abandoned connection attempt failed", exc_info=True)


class ZkClient:
    """A started-once connection to ZooKeeper for one launcher process (or CLI run)."""

    def __init__(self, settings: ZkSettings) -> None:
        self.settings = settings
        self._kazoo: KazooClient | None = None
        self._connected = threading.Event()
        self._epoch = 0
        self._connections = 0
        # The session's id, kept while the connection is down (see `session_id`).
        self._session_id: int | None = None
        self._state_lock = threading.Lock()
        self._listeners: list[StateListener] = []
        self._events: queue.Queue[tuple[ConnectionState, int] | None] = queue.Queue()
        self._dispatcher: threading.Thread | None = None
        self._stopping = threading.Event()
        self.writes = WriteCounter()
        self.echoes = echo.WriteEchoes()
        self._batch = multiread.BatchReader()
        self._tree_watches: _kazoo_ext.RecursiveWatches | None = None
        # False: the caches use one-shot watches only (what a server older than 3.6 gets).
        self.persistent_watches = True

    # -- lifecycle ------------------------------------------------------------------------
    def _make_kazoo(self, hosts: str) -> KazooClient:
        kw: dict[str, Any] = {}
        tls = self.settings.tls
        if tls is not None:
            kw.update(use_ssl=True, ca=tls.ca, certfile=tls.cert, keyfile=tls.key,
                      verify_certs=True)
        auth = access.auth_data(self.settings.auth)
        if auth:
            kw.update(auth_data=auth)
        acl = access.default_acl(self.settings.acl)
        if acl:
            kw.update(default_acl=acl)
        client = KazooClient(
            hosts=hosts, timeout=self.settings.timeout, handler=_kazoo_ext.PollThreadingHandler(),
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2.0),
            **kw)
        # Fewer system calls and thread switches per message on kazoo's connection thread.
        _kazoo_ext.FastIO.install(client)
        return client

    def start(self, stop: threading.Event | None = None) -> bool:
        """Connect, retrying until connected (True) or `stop` is set (False)."""
        _kazoo_ext.check()  # KazooIncompatible (permanent) before anything misbehaves
        stop = stop or self._stopping
        last_log = -1e9
        attempt = 0
        while not stop.is_set():
            attempt += 1
            client = self._make_kazoo(self.settings.hosts)
            try:
                self._start_attempt(client, stop)
            except Exception as exc:
                try:
                    client.close()
                except Exception:
                    pass
                if isinstance(exc, errors.ZkAuthError):
                    raise
                now = time.monotonic()
                if now - last_log >= self.settings.retry_log_interval:
                    log.warning("Retrying ZooKeeper connection to %s (attempt %d): %s",
                                self.settings.hosts, attempt, exc or type(exc).__name__)
                    last_log = now
                stop.wait(1.0)
                continue
            self._kazoo = client
            self._tree_watches = _kazoo_ext.RecursiveWatches(client)
            try:
                self._ensure_chroot()
                if self.settings.auth is not None or self.settings.acl_enabled:
                    self.verify_access()
            except errors.ZkAuthError:
                self._kazoo = None
                client.stop()
                client.close()
                raise
            client.add_listener(self._on_kazoo_state)
            self._remember_session(client)
            self._connected.set()
            self._dispatcher = threading.Thread(target=self._dispatch, daemon=True,
                                                name="zk-state-dispatcher")
            self._dispatcher.start()
            log.info("Connected to ZooKeeper at %s (session timeout %.1fs)",
                     self.settings.hosts, self.settings.timeout)
            return True
        return False

    def _start_attempt(self, client: KazooClient, stop: threading.Event) -> None:
        """One connection attempt, given up early when `stop` is set (a SIGTERM while
        ZooKeeper is unreachable must not wait for the whole attempt timeout)."""
        connected = client.start_async()
        deadline = time.monotonic() + self.settings.connect_attempt_timeout
        while not connected.wait(0.1) and not stop.is_set() \
                and time.monotonic() < deadline:
            pass
        if client.connected and client.auth_data:
            # kazoo reports CONNECTED before the server has answered the credentials it
            # sends next; a request queued behind them fails if they were rejected.
            try:
                client.exists("/")
            except _AUTH_ERRORS:
                pass
            except kex.KazooException as exc:
                if client.client_state != KeeperState.AUTH_FAILED:
                    client.stop()
                    raise errors.ZkConnectionError(f"{type(exc).__name__}: {exc}") from exc
        if client.client_state == KeeperState.AUTH_FAILED:
            client.stop()
            schemes = ", ".join(sorted({scheme for scheme, _ in client.auth_data}))
            raise errors.ZkAuthError("AuthFailedError", None,
                                     f"ZooKeeper rejected the {schemes} credentials")
        if not client.connected:
            # kazoo's stop joins its connection thread, which may sit in a read from a server
            # that accepted and never answered until kazoo's own timeout (10 s where the
            # CLI promised 5): stopped in the background, the attempt ends on time.
            threading.Thread(target=_stop_quietly, args=(client,), daemon=True,
                             name="zk-abandoned-attempt").start()
            raise errors.ZkConnectionError("connection attempt timed out" if not stop.is_set()
                                           else "stopped while connecting")

    def _ensure_chroot(self) -> None:
        """A configured chroot that does not exist yet is created (from outside it)."""
        assert self._kazoo is not None
        chroot = self._kazoo.chroot
        if not chroot or self._kazoo.exists("/") is not None:
            return
        outside = self._make_kazoo(self.settings.hosts.split("/", 1)[0])
        outside.start(timeout=self.settings.connect_attempt_timeout)
        try:
            outside.ensure_path(chroot)
        except _AUTH_ERRORS as exc:
            raise translate(exc, f"{chroot} (the chroot, created from outside it)") from exc
        finally:
            outside.stop()
            outside.close()

    # Listed at start-up when access control is configured: the protocol's top-level znodes
    # and our own tree, where every later read and create happens.
    ACCESS_CHECK_PATHS = ("/", paths.ROOT, paths.NODES, paths.REQUESTS, paths.REQUEST_LOCKS,
                          paths.COMPONENTS, paths.LAUNCHER_COMPONENTS, paths.POOL_COMPONENTS,
                          paths.ELECTIONS, paths.OWN_ROOT, paths.GUARDS)
    ACCESS_PROBE_PREFIX = f"{paths.OWN_ROOT}/access-check-"

    def verify_access(self) -> None:
        """Raise `ZkAuthError` naming the first znode we may not use.

        Lists every existing znode of `ACCESS_CHECK_PATHS` (read permission: a digest
        password that does not match the one the tree was created with fails here). With
        the ACL enabled it also creates (with the ACL) and deletes an ephemeral probe under
        our own tree: ZooKeeper refuses an `auth` ACL with `InvalidACLError` when the
        session has no authenticated identity (no `zookeeper-auth`, and no x509 identity
        from the TLS client certificate), and logs the ACL it stored.
        """
        client = self.kazoo
        for path in self.ACCESS_CHECK_PATHS:
            try:
                client.get_children(path)
            except kex.NoNodeError:
                continue
            except _AUTH_ERRORS as exc:
                raise errors.ZkAuthError(type(exc).__name__, path,
                                         "cannot list it with these credentials") from exc
        if not self.settings.acl_enabled:
            log.info("ZooKeeper access checked (authenticated, open ACL on new znodes)")
            return
        probe = self.ACCESS_PROBE_PREFIX
        try:
            client.ensure_path(paths.OWN_ROOT)
            probe = client.create(self.ACCESS_PROBE_PREFIX, b"", ephemeral=True,
                                  sequence=True)
            stored, _ = client.get_acls(probe)
            client.delete(probe)
        except kex.InvalidACLError as exc:
            schemes = sorted({g.scheme for g in self.settings.acl.grants}
                             if self.settings.acl else set())
            raise errors.ZkAuthError(
                "InvalidACLError", probe, "ZooKeeper refused the ACL: either the session has"
                " no authenticated identity for its `auth` entry (set zookeeper-auth, or"
                " use a TLS client certificate with ZooKeeper's x509 authentication"
                " provider), or a grant names a scheme the server has no authentication"
                " provider for or an id it does not accept (grant schemes:"
                f" {', '.join(schemes) or 'none'})") from exc
        except _AUTH_ERRORS as exc:
            raise errors.ZkAuthError(type(exc).__name__, probe,
                                     "cannot create znodes with this ACL") from exc
        log.info("ZooKeeper access checked; new znodes get the ACL %s",
                 access.describe(list(stored)))

    def stop(self) -> None:
        """Close the session (ephemeral znodes vanish at once). Idempotent."""
        self._stopping.set()
        client, self._kazoo = self._kazoo, None
        self._connected.clear()
        self._session_id = None
        if client is not None:
            try:
                client.remove_listener(self._on_kazoo_state)
                client.stop()
                client.close()
            except Exception as exc:
                log.debug("error while closing ZooKeeper client: %s", exc)
        self._events.put(None)
        if self._dispatcher is not None and self._dispatcher is not threading.current_thread():
            self._dispatcher.join(5)

    # -- state ----------------------------------------------------------------------------
    @property
    def kazoo(self) -> KazooClient:
        if self._kazoo is None:
            raise errors.ZkSessionLost("ZooKeeper client is not started")
        return self._kazoo

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def connections(self) -> int:
        """How many times a connection was made: each one after the first dropped every
        watch the server held for this client (counted before the listeners hear of it)."""
        return self._connections

    @property
    def session_id(self) -> int | None:
        """The current session's id, also while the connection is down and the session
        may well live on (kazoo's `client_id` is None then: compared with the owner of
        our own ephemeral znodes, they looked like someone else's); None once the
        session is lost, until the next one is established."""
        return self._session_id

    def _remember_session(self, client: KazooClient) -> None:
        cid = client.client_id
        if cid:
            self._session_id = cid[0]

    def wait_connected(self, timeout: float | None = None) -> bool:
        return self._connected.wait(timeout)

    def add_listener(self, listener: StateListener) -> None:
        with self._state_lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: StateListener) -> None:
        with self._state_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _on_kazoo_state(self, state: str) -> None:
        # Runs on kazoo's connection thread: record and hand over, never block here.
        if state == KazooState.CONNECTED:
            client = self._kazoo
            if client is not None:
                self._remember_session(client)
            self._connections += 1
            self._connected.set()
            self._events.put((ConnectionState.CONNECTED, self._epoch))
        elif state == KazooState.SUSPENDED:
            self._connected.clear()
            self._events.put((ConnectionState.SUSPENDED, self._epoch))
        elif state == KazooState.LOST:
            self._connected.clear()
            client = self._kazoo
            if client is not None and client.client_state == KeeperState.AUTH_FAILED:
                log.error("ZooKeeper rejected this session's credentials on reconnect; %s",
                          errors.ZkAuthError.HINT)
            self._session_id = None
            self._epoch += 1
            if not self._stopping.is_set():
                log.warning("ZooKeeper session lost (epoch now %d)", self._epoch)
            self._events.put((ConnectionState.LOST, self._epoch))

    def _dispatch(self) -> None:
        while True:
            item = self._events.get()
            if item is None:
                return
            state, epoch = item
            if state is not ConnectionState.LOST and self._stopping.is_set():
                continue
            with self._state_lock:
                listeners = list(self._listeners)
            for listener in listeners:
                try:
                    listener(state, epoch)
                except Exception:
                    log.exception("ZooKeeper state listener failed")

    # -- primitive operations ----------------------------------------------------------------
    def _read(self, fn: Callable[[], T], path: str | None = None) -> T:
        """Run a read, retrying through connection loss for up to one session timeout."""
        deadline = time.monotonic() + max(self.settings.timeout, 1.0)
        while True:
            try:
                return fn()
            except (kex.ConnectionLoss, kex.OperationTimeoutError) as exc:
                if time.monotonic() >= deadline or self._stopping.is_set():
                    raise errors.ZkConnectionError(f"read failed: {exc!r}") from exc
                self._connected.wait(0.5)
            except kex.KazooException as exc:
                raise translate(exc, path) from exc

    def io_counts(self) -> tuple[int, int, int]:
        """The connection's grouped reads and writes (`_kazoo_ext.FastIO`): request batches
        written, requests in them, socket reads that held more than one reply."""
        fast = _kazoo_ext.FastIO.of(self._kazoo) if self._kazoo is not None else None
        return (fast.batches, fast.batched, fast.grouped_reads) if fast else (0, 0, 0)

    def watch_tree(self, path: str, listener: _kazoo_ext.TreeListener,
                   timeout: float = 30.0) -> bool:
        """Add a persistent recursive watch on `path` (ZooKeeper 3.6+), whose events go to
        `listener(event_type, path)` on kazoo's connection thread, in the server's order.
        True once the server has it; False when they are switched off or the server does
        not know them (older than 3.6). The server forgets it when the connection ends
        (kazoo does not restore it): add it again after every reconnect. Raises kazoo's
        exceptions (a lost connection) as the caches' own reads do."""
        watches = self._tree_watches
        if not self.persistent_watches or watches is None:
            return False
        result = watches.add(path, listener)
        if not result.wait(timeout):
            raise kex.ConnectionLoss(f"no answer to adding a watch on {path} in {timeout:g}s")
        try:
            result.get_nowait()
        except (kex.UnimplementedError, kex.MarshallingError, kex.BadArgumentsError):
            watches.forget(path, listener)
            return False
        return True

    def unwatch_tree(self, path: str, listener: _kazoo_ext.TreeListener) -> None:
        """Stop delivering `path`'s persistent watch events to `listener`."""
        if self._tree_watches is not None:
            self._tree_watches.forget(path, listener)

    def get(self, path: str) -> tuple[bytes, Stat] | None:
        try:
            data, stat = self._read(lambda: self.kazoo.get(path), path)
        except errors.NoNodeError:
            return None
        return data, Stat.of(stat)

    def exists(self, path: str) -> Stat | None:
        stat = self._read(lambda: self.kazoo.exists(path), path)
        return Stat.of(stat) if stat is not None else None

    def watch_exists(self, path: str, callback: Callable[[Any], None]) -> Stat | None:
        """`exists` that also leaves a one-shot watch calling `callback(event)`."""
        stat = self._read(lambda: self.kazoo.exists(path, watch=callback), path)
        return Stat.of(stat) if stat is not None else None

    def get_children(self, path: str) -> list[str] | None:
        try:
            return list(self._read(lambda: self.kazoo.get_children(path), path))
        except errors.NoNodeError:
            return None

    def exists_and_children(self, exists_paths: list[str],
                            children_path: str) -> tuple[list[Stat | None], list[str] | None]:
        """`exists` of each path and `get_children(children_path)` in one round trip.

        The requests are pipelined on this session, and ZooKeeper answers a session's
        requests in the order they were sent: the listing reflects every change made
        before the stats were read (what a quota decision relies on, see quota_guard).
        """
        def run() -> tuple[list[Any], Any]:
            client = self.kazoo
            pending = [client.exists_async(path) for path in exists_paths]
            listing = client.get_children_async(children_path)
            stats = [result.get() for result in pending]
            try:
                children = list(listing.get())
            except kex.NoNodeError:
                children = None
            return stats, children

        stats, children = self._read(run, children_path)
        return [Stat.of(s) if s is not None else None for s in stats], children

    def exists_all(self, exists_paths: list[str]) -> tuple[list[Stat | None], int | None]:
        """`exists` of each path in one round trip (pipelined), and the connection
        (`connections`) whose answers they are: None when a reconnect came between sending
        them and reading the answers (so that connection cannot be told)."""
        def run() -> tuple[list[Any], int | None]:
            client = self.kazoo
            before = self._connections
            pending = [client.exists_async(path) for path in exists_paths]
            stats = [result.get() for result in pending]
            return stats, (before if self._connections == before else None)

        stats, connection = self._read(run, exists_paths[0] if exists_paths else None)
        return [Stat.of(s) if s is not None else None for s in stats], connection

    def get_many(self, paths: list[str]) -> Iterator[tuple[str, tuple[bytes, Stat] | None]]:
        """Many gets in few round trips (multiRead, or pipelined); None for missing znodes."""
        try:
            results = self._batch.read_many(self.kazoo, [(multiread.GET, p) for p in paths])
        except kex.KazooException as exc:
            raise translate(exc, _batch_paths([p for p in paths])) from exc
        for path, found in zip(paths, results):
            yield path, ((found[0], Stat.of(found[1])) if found is not None else None)

    def read_many(self, ops: list[tuple[str, str]]) -> list[Any]:
        """Batched raw reads (see multiread.py): (data, ZnodeStat) / children / None."""
        try:
            return self._batch.read_many(self.kazoo, ops)
        except kex.KazooException as exc:
            raise translate(exc, _batch_paths([p for _, p in ops])) from exc

    def iter_many(self, ops: list[tuple[str, str]]) -> Iterator[list[Any]]:
        """`read_many` in consecutive parts, each as soon as it has arrived."""
        parts = self._batch.iter_many(self.kazoo, ops)
        while True:
            try:
                part = next(parts)
            except StopIteration:
                return
            except kex.KazooException as exc:
                raise translate(exc, _batch_paths([p for _, p in ops])) from exc
            yield part

    def _write(self, fn: Callable[[], T], path: str | None = None, ops: int = 1) -> T:
        self.writes.add(ops)
        try:
            return fn()
        except kex.KazooException as exc:
            raise translate(exc, path) from exc

    def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
               sequence: bool = False, makepath: bool = False) -> str:
        expected = self.echoes.expect([(0, path, data)], sequence=sequence)
        if not expected:
            created: str = self._write(lambda: self.kazoo.create(
                path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath), path)
            return created
        # An observer mirrors this znode's parent (persistent watches, so ZooKeeper 3.6+):
        # create2, whose answer has the stat the echo hands it.
        try:
            created, stat = self._write(lambda: self.kazoo.create(
                path, data, ephemeral=ephemeral, sequence=sequence, makepath=makepath,
                include_data=True), path)
        except BaseException:
            self.echoes.settle(expected, None, "" if sequence else None)
            raise
        self.echoes.settle(expected, [stat], created if sequence else None)
        return created

    def set(self, path: str, data: bytes, version: int = -1) -> Stat:
        expected = self.echoes.expect([(0, path, data)])
        try:
            stat = self._write(lambda: self.kazoo.set(path, data, version=version), path)
        except BaseException:
            self.echoes.settle(expected, None)
            raise
        self.echoes.settle(expected, [stat])
        return Stat.of(stat)

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        self._write(lambda: self.kazoo.delete(path, version=version, recursive=recursive),
                    path)

    def apply_acl(self, path: str) -> bool:
        """Give the existing znode `path` the configured ACL (`zookeeper-acl`), as if we had
        just created it: a znode made before the ACL was configured, or by another client,
        keeps whatever ACL it was created with otherwise. False (nothing written) when no
        ACL is configured. Needs the ADMIN permission on `path` (`ZkAuthError` without it;
        `NoNodeError` when it does not exist)."""
        acl = access.default_acl(self.settings.acl)
        if not acl:
            return False
        self._write(lambda: self.kazoo.set_acls(path, acl), path)
        return True

    def ensure_path(self, path: str) -> None:
        """Create `path` and missing parents; no write when it already exists."""
        if self.exists(path) is None:
            try:
                self.create(path, b"", makepath=True)
            except errors.NodeExistsError:
                pass

    def transaction(self) -> Any:
        """A kazoo TransactionRequest (used only by `zk.txn`)."""
        return self.kazoo.transaction()
