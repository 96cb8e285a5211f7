"""A free TCP port for a test's listener (a hub, its proxy, a single-user server, a fake).

Chosen below the kernel's ephemeral range (``ip_local_port_range``), not by binding port 0:
the kernel hands that range out as the local port of every outgoing connection on the machine
(any process's: another test's requests, a proxy's), so a port picked there could be taken
before its listener bound it, seconds later on a loaded machine (a single-user server once
failed "port 58085 is not available"). Below the range only a listener naming the port can
take it. Each pytest-xdist worker (and the hubs it starts, which inherit its environment) picks
from its own slice, and a process never hands out one port twice: a port is free when picked but
bound only seconds later, and two listeners picking the same one meanwhile collided once
("Failed to bind hub ...: Address already in use")."""

from __future__ import annotations

import os
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


def _slice() -> range:
    """This worker's ports: the span below the ephemeral range split among xdist's workers."""
    low = _ephemeral_low()
    first = max(1024, low - _SPAN)
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(int(workers), 1) if workers.isdigit() else 1
    index = int(worker) % count if worker.isdigit() else 0
    size = (low - first) // count
    return range(first + index * size, first + (index + 1) * size)


_given: set[int] = set()  # ports this process handed out (forgotten when half the slice is)


def free_port() -> int:
    ports = _slice()
    if len(_given) > len(ports) // 2:
        _given.clear()
    for _ in range(100 if len(ports) >= 1000 else 0):
        port = random.choice(ports)
        if port in _given:
            continue
        _given.add(port)
        with socket.socket() as s:
            try:
                s.bind(("", port))  # all addresses: free on each, as a listener needs
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the range: the kernel's choice
        s.bind(("", 0))
        return s.getsockname()[1]
