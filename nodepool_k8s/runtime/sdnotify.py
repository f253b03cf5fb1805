"""systemd readiness notification (`Type=notify`) without a dependency.

Owns: sending `READY=1`, `STOPPING=1`, `RELOADING=1` and `STATUS=...` datagrams to the
socket named by `$NOTIFY_SOCKET`. Without that variable (not under systemd, or
`Type=simple`) every call is a no-op. Send errors are logged, never raised: readiness
reporting must not take the launcher down.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("nodepool_k8s.runtime.sdnotify")


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Send one notification; True when it was delivered to a socket."""
    address = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        # Abstract namespace socket.
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
        return True
    except OSError as exc:
        log.warning("Could not notify systemd (%s): %s", message.split("\n")[0], exc)
        return False


def ready(status: str = "Serving node requests") -> bool:
    return notify(f"READY=1\nSTATUS={status}")


def stopping(status: str = "Stopping") -> bool:
    return notify(f"STOPPING=1\nSTATUS={status}")


def reloading(status: str = "Reloading the configuration") -> bool:
    # systemd (253+, Type=notify-reload) wants the monotonic time with RELOADING=1 to tell
    # this reload from a later one; older versions ignore the extra field.
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS={status}")


def status(text: str) -> bool:
    return notify(f"STATUS={text}")
