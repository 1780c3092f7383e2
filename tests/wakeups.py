"""How often something wakes up while it should sit idle, counted without timing anything:
:class:`CountingLoop` is asyncio's own event loop counting the timers armed on it and the
callbacks handed to it from other threads (each one a wake-up of the loop), and
:func:`thread_wakeups` reads how often a thread went to sleep and was woken again, from
``/proc``. A test compares counts over an idle window against a bound a slower machine
only stays further under."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from contextvars import Context
from typing import TypeVarTuple, Unpack

_Ts = TypeVarTuple("_Ts")


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts ``wakeups``: timers armed and thread-safe callbacks."""

    wakeups = 0

    def call_at(self, when: float, callback: Callable[[Unpack[_Ts]], object],
                *args: *_Ts, context: Context | None = None) -> asyncio.TimerHandle:
        self.wakeups += 1
        return super().call_at(when, callback, *args, context=context)

    def call_soon_threadsafe(self, callback: Callable[[Unpack[_Ts]], object],
                             *args: *_Ts, context: Context | None = None
                             ) -> asyncio.Handle:
        self.wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


def run_counting(main: Callable[[CountingLoop], Coroutine[object, None, None]]) -> None:
    """Run the coroutine function ``main`` (given the loop) on a :class:`CountingLoop`."""
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        runner.run(main(loop))


def thread_wakeups(thread: threading.Thread) -> int:
    """Times ``thread`` blocked and was woken so far (its voluntary context switches)."""
    with open(f"/proc/self/task/{thread.native_id}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no context switch count for thread {thread.name}")
