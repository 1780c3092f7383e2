"""A few callers per turn of the event loop: :class:`TurnPacer`.

A thousand clients that close at once (a login storm's clients leaving, a fleet
restarting) make a thousand connections tear down in the same few turns of the loop:
their read loops end, their write loops end, their sessions count them out, their
transports close, each step of all of them in one turn. A probe of the loop's CPU per turn
during ``bench.logins --storm-only`` found every turn of more than 8 ms there (10-25 ms
each, four or so per storm), while a logged-in producer's requests waited behind them.
Connections that end take a turn of a pacer first, so at most ``per_turn`` of them tear
down in one turn of the loop and other clients' work runs in between.
"""

from __future__ import annotations

import asyncio
from collections import deque


class TurnPacer:
    """Lets at most ``per_turn`` callers of :meth:`turn` through per turn of the loop; the
    others wait, in order, for later turns."""

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self._passed = 0
        """Callers let through since the last new turn."""
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._turning = False

    async def turn(self) -> None:
        """Return in this turn of the loop if the pacer has room in it, else in a later
        one (cancellation is passed on; the caller's place is given up)."""
        if self._passed < self.per_turn and not self._waiting:
            self._pass()
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._next_turn()
        await waiter

    def _pass(self) -> None:
        self._passed += 1
        self._next_turn()

    def _next_turn(self) -> None:
        if not self._turning:
            self._turning = True
            asyncio.get_running_loop().call_soon(self._new_turn)

    def _new_turn(self) -> None:
        """A new turn of the loop: let the next ``per_turn`` waiters through (they run in
        the next turn, with this one's other callbacks; then this runs again)."""
        self._turning = False
        self._passed = 0
        while self._waiting and self._passed < self.per_turn:
            waiter = self._waiting.popleft()
            if not waiter.done():  # not cancelled meanwhile
                waiter.set_result(None)
                self._pass()
