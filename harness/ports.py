"""A free loopback port for a server under test."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (the OS picked it; another process could still take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_outside_ephemeral(low: int = 20000) -> int:
    """A free port from ``low`` up to just below the kernel's ephemeral range, else any free one.

    For a server that binds many more ports of its own after start-up (Ray: GCS, raylet, agents, all on
    ports the OS picks from the ephemeral range, the very range ``free_port`` picks from): a port the
    kernel never hands out by itself cannot be taken by one of them before the server binds it.
    """
    try:
        first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return free_port()
    for port in random.sample(range(low, first_ephemeral), min(200, max(0, first_ephemeral - low))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()
