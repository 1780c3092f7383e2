"""One thread that runs the cluster machinery's database statements, in the order given.

The event loop never waits on the registry: :meth:`Worker.run` hands a storage call to the
worker's thread and awaits its result, so a database that is slow or stops answering holds
only the coroutine that needs the answer, never the other connections of the broker. The
results are applied on the loop by the awaiting coroutine, so the state the loop reads is
only changed on the loop.

The thread is a daemon: a statement stuck on a database that never answers does not keep
the process from exiting.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class Worker:
    """A thread running submitted calls one at a time, first in first out."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    async def run(self, call: Callable[[], T]) -> T:
        """``call()`` in the worker's thread, after the calls submitted before it. A caller
        cancelled before its call started cancels the call."""
        done: Future[T] = Future()

        def job() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                done.set_result(call())
            except BaseException as exc:  # handed to the awaiting coroutine
                done.set_exception(exc)

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, args=(self._jobs,),
                                                name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put(job)
        return await asyncio.wrap_future(done)

    @staticmethod
    def _serve(jobs: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (job := jobs.get()) is not None:
            job()

    def close(self) -> None:
        """Let the thread end once the calls queued before are done (or at exit, if one
        never returns)."""
        with self._lock:
            if self._thread is not None:
                self._jobs.put(None)
                self._jobs = queue.SimpleQueue()
                self._thread = None
