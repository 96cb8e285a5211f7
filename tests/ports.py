"""A free TCP port for a test's listener (a hub, its proxy, a single-user server, a fake).

Chosen below the kernel's ephemeral range (``ip_local_port_range``), not by binding port 0:
the kernel hands that range out as the local port of every outgoing connection on the machine
(any process's: another test's requests, a proxy's), so a port picked there could be taken
before its listener bound it, seconds later on a loaded machine (a single-user server once
failed "port 58085 is not available"). Below the range only a listener naming the port can
take it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12000  # ports tried from, below the ephemeral range


def _ephemeral_low() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    low = _ephemeral_low()
    first = max(1024, low - _SPAN)
    for _ in range(100 if low - first >= 1000 else 0):
        port = random.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind(("", port))  # all addresses: free on each, as a listener needs
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("", 0))
        return s.getsockname()[1]
