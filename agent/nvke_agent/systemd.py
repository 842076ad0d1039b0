"""systemd ``Type=notify`` readiness and watchdog (sd_notify(3) protocol).

The protocol is one datagram per state change on the Unix socket named by ``NOTIFY_SOCKET``
(``@`` = Linux abstract namespace); ten lines, so no extra dependency. Outside systemd
(``NOTIFY_SOCKET`` unset) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send ``state`` (``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``, ``STATUS=…``); True if sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(state.encode())
    return True


def watchdog_interval_s() -> float | None:
    """Seconds between watchdog pings systemd expects (``WATCHDOG_USEC``), or None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1_000_000
