"""The broker's log lines are written by a thread of their own, not by the event loop.

A log call on the loop formats its line there (the broker's formatter: escaped and
bounded, cheap) and puts it in a queue (the stdlib's ``QueueHandler``); a
``QueueListener`` thread writes the lines to the stream in order. A write to stderr blocks
whenever whoever reads it (a pipe to journald or a container runtime, a test) falls
behind, and the loop used to block with it: during a storm of 1,000 logins (an INFO line
each) a py-spy profile of the broker found a fifth of the loop's samples inside that
write (``bench.logins --storm-only``).

The queue holds at most :data:`MAX_QUEUED_LINES` lines: should the stream stop taking
lines altogether, further lines are dropped and counted (a line says how many once there
is room again) instead of the broker's memory growing or its loop stopping.
:meth:`ThreadedLog.stop` (the broker's exit, after a clean stop on SIGTERM) writes every
line queued before it returns and from then on lines are written directly again, so no
line logged before the exit is lost.
"""

from __future__ import annotations

import copy
import logging
import queue
from logging.handlers import QueueHandler, QueueListener
from types import TracebackType
from typing import TextIO

from edge.helper_threads import give_way_to_the_loop
from edge.log_format import LogFormat, broker_log_handler

MAX_QUEUED_LINES = 10_000
"""Lines waiting for the writer thread at most (a few MB)."""
LINES_PER_WRITE = 64
"""Queued lines the writer thread takes at once and writes with one write of the stream."""
STOP_WAIT_S = 10.0
"""How long stop waits for a stream that takes nothing before it gives up on its lines."""


class _QueuedLines(QueueHandler):
    """Formats a record on the caller's thread with the broker's formatter and queues the
    finished line; counts the lines a full queue drops."""

    def __init__(self, lines: queue.SimpleQueue[logging.LogRecord | None],
                 formatter: logging.Formatter, max_lines: int) -> None:
        super().__init__(lines)
        self.lines = lines
        self.max_lines = max_lines
        self.setFormatter(formatter)
        self.dropped = 0

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        line = self.format(record)
        queued = copy.copy(record)  # other handlers may still read the original
        queued.msg, queued.args = line, None
        queued.exc_info, queued.exc_text, queued.stack_info = None, None, None
        queued.message = line
        return queued

    def enqueue(self, record: logging.LogRecord) -> None:
        """Queue the line, or count it dropped (called under the handler's lock)."""
        if self.lines.qsize() >= self.max_lines:
            self.dropped += 1
            return
        if self.dropped:
            self.lines.put(self.prepare(self._dropped_note()))
            self.dropped = 0
        self.lines.put(record)

    def _dropped_note(self) -> logging.LogRecord:
        return logging.makeLogRecord({
            "name": __name__, "levelno": logging.WARNING, "levelname": "WARNING",
            "msg": "%d log lines dropped: the log's stream did not take them in time",
            "args": (self.dropped,)})


class _Writer(QueueListener):
    """The writer thread: it writes the lines queued when it wakes, up to
    :data:`LINES_PER_WRITE`, with one write of the stream (one system call instead of one
    per line), and gives way to the event loop thread (:mod:`edge.helper_threads`); its
    stop waits a bounded time for a stream that takes nothing."""

    stuck = False
    """Whether the thread did not stop in time (its stream takes nothing)."""

    def __init__(self, lines: queue.SimpleQueue[logging.LogRecord | None],
                 writer: logging.StreamHandler[TextIO]) -> None:
        super().__init__(lines, writer)
        self.lines = lines
        self.writer = writer

    def _monitor(self) -> None:
        give_way_to_the_loop()
        lines = self.lines
        while True:
            record = lines.get()
            if record is None:  # the stop marker, after every line queued before it
                return
            batch = [record]
            while len(batch) < LINES_PER_WRITE:
                try:
                    queued = lines.get_nowait()
                except queue.Empty:
                    break
                if queued is None:
                    self._write(batch)
                    return
                batch.append(queued)
            self._write(batch)

    def _write(self, batch: list[logging.LogRecord]) -> None:
        """The lines of ``batch`` with one write and one flush (each as the writer handler
        formats it: its message, the finished line)."""
        writer = self.writer
        writer.acquire()
        try:
            writer.stream.write("".join(writer.format(record) + writer.terminator
                                        for record in batch))
            writer.flush()
        except RecursionError:
            raise
        except Exception:
            writer.handleError(batch[0])
        finally:
            writer.release()

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self.enqueue_sentinel()  # after every line queued
        thread.join(STOP_WAIT_S)
        self.stuck = thread.is_alive()  # if so, the (daemon) thread is left behind
        self._thread = None


class ThreadedLog:
    """The broker's log: lines formatted by the caller, written by a thread. Use as a
    context manager around the broker's run; the root logger gets its handler."""

    def __init__(self, stream: TextIO, log_format: LogFormat = "TEXT",
                 max_lines: int = MAX_QUEUED_LINES) -> None:
        self.direct = broker_log_handler(stream, log_format)
        """Formats and writes in the caller's thread: the handler before start and after
        stop."""
        assert self.direct.formatter is not None
        lines: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        self.lines = lines
        self.handler = _QueuedLines(lines, self.direct.formatter, max_lines)
        self.writer: logging.StreamHandler[TextIO] = logging.StreamHandler(stream)
        """Writes the finished lines (the thread's handler)."""
        self.writer.setFormatter(logging.Formatter("%(message)s"))
        self.listener = _Writer(lines, self.writer)
        self._running = False

    def start(self) -> None:
        """Start the writer thread; the handler to give the root logger is :attr:`handler`."""
        self.listener.start()
        self._running = True

    def stop(self) -> None:
        """Write every line queued so far, stop the thread; the root logger's queued
        handler is replaced by the direct one (with its filters), so later lines (the
        interpreter's exit) are still written."""
        if not self._running:
            return
        self._running = False
        root = logging.getLogger()
        if self.handler in root.handlers:
            for kept in self.handler.filters:
                self.direct.addFilter(kept)
            root.addHandler(self.direct)
            root.removeHandler(self.handler)
        self.listener.stop()  # the thread writes what was queued before it stops
        # lines queued by a thread that was inside the handler as it was swapped
        while not self.listener.stuck:
            try:
                record = self.lines.get_nowait()
            except queue.Empty:
                break
            if record is not None:  # None: the listener's stop marker
                self.writer.handle(record)
        self.writer.flush()

    def __enter__(self) -> ThreadedLog:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
