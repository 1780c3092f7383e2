"""Free TCP ports on 127.0.0.1 for servers that a test starts later (Envoy, an issuer,
a metrics endpoint), picked below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port", "free_ports"]


def free_port() -> int:
    """One port, as ``free_ports(1)``."""
    return free_ports(1)[0]


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and ``bind(0)``."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports for Envoy to bind later (held together while picked,
    so all differ). They come from below the ephemeral range: a port taken from it could
    meanwhile become the local port of any connection on the machine, and Envoy's bind
    would then fail."""
    low = _ephemeral_low()
    start = 10_000 + random.randrange(max(1, low - 10_000 - 4_000))
    socks: list[socket.socket] = []
    try:
        for port in range(start, low):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            socks.append(sock)
            if len(socks) == count:
                return [int(s.getsockname()[1]) for s in socks]
        raise RuntimeError(f"no {count} free ports between {start} and {low}")
    finally:
        for sock in socks:
            sock.close()
