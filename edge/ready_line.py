"""The line a broker logs once every listener is bound, and how to read it back.

``edge-broker ready: broker ID, listeners NAME://HOST:PORT (PROTOCOL, advertised
AHOST:APORT), ...`` (then ``; metrics on URL`` when metrics are served). It is how a parent
process learns that a broker serves and on which ports it bound (port 0 in the config gives
the bound port here): ``edge-broker cluster`` waits for it, and so do the tests.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from listeners.spec import ListenerSpec

READY_LINE = re.compile(r"edge-broker ready: broker (\d+), listeners (.*)")
"""The ready line, anywhere in a log line: group 1 the broker id, group 2 the listeners."""

_LISTENER = re.compile(r"(\w+)://([^ ]+):(\d+) \((\w+), advertised ([^ ]+):(\d+)\)")


@dataclass(frozen=True)
class ReadyListener:
    """One listener as the ready line names it."""

    name: str
    host: str
    port: int
    protocol: str
    advertised_host: str
    advertised_port: int

    @property
    def advertised(self) -> str:
        """``host:port`` that clients are given."""
        return f"{self.advertised_host}:{self.advertised_port}"


@dataclass(frozen=True)
class Ready:
    """What a ready line says: the broker id and its listeners in config order."""

    broker_id: int
    listeners: tuple[ReadyListener, ...]


def describe_listeners(bound: Sequence[ListenerSpec]) -> str:
    """The listeners part of the ready line."""
    return ", ".join(f"{s.name}://{s.host}:{s.port} ({s.protocol.value}, advertised "
                     f"{s.advertised_host}:{s.advertised_port})" for s in bound)


def parse_ready(line: str) -> Ready | None:
    """The ready line's content, or None if ``line`` is not a ready line."""
    match = READY_LINE.search(line)
    if match is None:
        return None
    listeners = tuple(
        ReadyListener(name, host, int(port), protocol, ahost, int(aport))
        for name, host, port, protocol, ahost, aport in _LISTENER.findall(match[2]))
    return Ready(int(match[1]), listeners)
