"""What the listener tests' own connection handlers share (``tests/protocol/
test_listener_stages.py``, ``test_listener_bounds.py``)."""

from __future__ import annotations

import struct

SIZE = struct.Struct(">i")


class StubHandler:
    """The parts of a ``ConnectionHandler`` a listener test does not vary: logged in (or
    limited to ``frame_limit`` when given), never muted, ``closed`` noted in ``log``."""

    def __init__(self, log: list[str], frame_limit: int | None = None) -> None:
        self.log = log
        self.limit = frame_limit

    @property
    def frame_limit(self) -> int | None:
        return self.limit

    @property
    def muted_until(self) -> float:
        return 0.0

    def closed(self) -> None:
        self.log.append("closed")


def frames(*texts: str) -> bytes:
    """``texts`` as size-prefixed frames."""
    return b"".join(SIZE.pack(len(text)) + text.encode() for text in texts)
