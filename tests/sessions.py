"""Test helpers: make ZooKeeper expire a client's session, as a long network partition would;
cut a client's connections while its session lives on, as a short blip would.

Connecting a second client with the same session id and password and closing it ends the
session on the server; the original client then sees SESSION_EXPIRED (kazoo state LOST) and
reconnects with a new session.
"""

from __future__ import annotations

import select
import socket
import threading

from kazoo.client import KazooClient

from nodepool_k8s.zk.client import ZkClient
from tests.helpers import ZkConnection


def expire_session(zk: ZkConnection, client: ZkClient) -> None:
    session = client.kazoo.client_id
    assert session is not None
    twin = KazooClient(hosts=zk.hosts, client_id=session)
    twin.start(timeout=60)  # a deadline: a busy machine may take long to connect
    twin.stop()
    twin.close()


class CuttingProxy:
    """A TCP relay in front of ZooKeeper whose `cut()` closes every connection through it
    at once, as a network blip would: the client reconnects (through the relay) within
    its session, and whatever it had sent and not yet heard back about may or may not have
    been applied (a lost reply). Point a client at `port`; `stop()` ends the relay."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self.cuts = 0
        threading.Thread(target=self._accept, name="cutting-proxy", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    @staticmethod
    def _relay(client: socket.socket, server: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([client, server], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (server if sock is client else client).sendall(data)
        except (OSError, ValueError):
            return  # cut
        finally:
            client.close()
            server.close()

    def cut(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self.cuts += 1

    def stop(self) -> None:
        self._listener.close()
        self.cut()
