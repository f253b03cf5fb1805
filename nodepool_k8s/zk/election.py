"""Leader election with kazoo's `Election` recipe, as Nodepool launchers hold it.

Owns: contending for one election znode (the stats leader uses `/nodepool/elections/stats`)
and running a leader function while this process holds it. The wire format is kazoo's
Lock recipe (ephemeral sequential `<uuid4hex>__lock__<seq10>` children, the lowest holds),
with the contender's data set to an identifier (`<hostname>-<pid>`, as Nodepool writes it),
so nodepool_k8s and Nodepool launchers sharing one ZooKeeper elect a single leader
between them.

The leader function gets a `Term`. kazoo's recipe does not tell a holder that its session
expired (its contender vanished, so someone else may lead now); `Term.held` does: it turns
False when the session epoch moves on (see `client.ZkClient.epoch`) or the election is
cancelled. The leader function must return soon after that; `run` then contends again.

Failure modes: ZooKeeper errors while contending are logged and contention is retried
after a short pause until `stop` is set; `cancel()` makes a pending contention return at
once (the leader function itself is not interrupted: it watches `Term.held`). Releasing
after a lost session is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable

from nodepool_k8s.zk.client import ZkClient

log = logging.getLogger("nodepool_k8s.zk.election")

RETRY_DELAY = 1.0


def default_identifier() -> str:
    """Nodepool's contender identifier: `<hostname>-<pid>`."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Term:
    """One period of leadership; `held` is False once it is (or may be) over."""

    def __init__(self, zk: ZkClient, epoch: int, cancelled: threading.Event) -> None:
        self._zk = zk
        self._epoch = epoch
        self._cancelled = cancelled

    @property
    def held(self) -> bool:
        return self._zk.epoch == self._epoch and not self._cancelled.is_set()


class Election:
    def __init__(self, zk: ZkClient, path: str, identifier: str | None = None) -> None:
        self.zk = zk
        self.path = path
        self.identifier = identifier or default_identifier()
        self._lock = threading.Lock()
        self._current: object | None = None  # the kazoo Election while contending
        self._cancelled = threading.Event()

    def run(self, lead: Callable[[Term], None], stop: threading.Event) -> None:
        """Contend until `stop` is set, calling `lead(term)` each time this process wins.

        Blocks; run it on a thread of its own and call `cancel()` after setting `stop`.
        """
        while not stop.is_set() and not self._cancelled.is_set():
            if not self.zk.wait_connected(RETRY_DELAY):
                continue
            try:
                election = self.zk.kazoo.Election(self.path, self.identifier)
                with self._lock:
                    self._current = election
                # cancel() may have run before _current was set: check again under it.
                if stop.is_set() or self._cancelled.is_set():
                    break
                epoch = self.zk.epoch
                election.run(self._wrap(lead, epoch))
            except Exception as exc:  # connection trouble: contend again once connected
                if stop.is_set() or self._cancelled.is_set():
                    break
                log.warning("Election %s interrupted (%s); contending again", self.path,
                            exc or type(exc).__name__)
                stop.wait(RETRY_DELAY)
            finally:
                with self._lock:
                    self._current = None

    def _wrap(self, lead: Callable[[Term], None], epoch: int) -> Callable[[], None]:
        def won() -> None:
            log.info("Won election %s as %s", self.path, self.identifier)
            try:
                lead(Term(self.zk, epoch, self._cancelled))
            finally:
                log.info("Leaving election %s", self.path)
        return won

    def cancel(self) -> None:
        """Stop contending: a pending acquire returns; a current Term ends (`held` False)."""
        self._cancelled.set()
        with self._lock:
            election = self._current
        if election is not None:
            election.cancel()  # type: ignore[attr-defined]

    def contenders(self) -> list[str]:
        """Identifiers of the contenders, the leader first (for operators and tests)."""
        return list(self.zk.kazoo.Election(self.path).contenders())
