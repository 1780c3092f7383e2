"""The broker's log written by a thread (``edge.log_thread``): a log call does not wait for
the stream, lines keep their order and their format, a stream that takes nothing drops
lines (counted) instead of stopping the caller, and stop writes every queued line."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator

import pytest

from edge.log_format import broker_log_handler
from edge.log_thread import LINES_PER_WRITE, ThreadedLog


class HeldStream(io.StringIO):
    """A stream whose writes wait until :attr:`open` is set (a reader that fell behind);
    :attr:`writes` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.waiting = threading.Event()
        self.writes = 0

    def write(self, text: str) -> int:
        self.waiting.set()
        assert self.open.wait(60)
        self.writes += 1
        return super().write(text)


@pytest.fixture
def logger() -> Iterator[logging.Logger]:
    """A logger of its own (not propagating), its handlers removed afterwards."""
    log = logging.getLogger("test-log-thread")
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log
    for handler in list(log.handlers):
        log.removeHandler(handler)


def test_a_held_stream_does_not_hold_the_caller_and_stop_writes_every_line(
        logger: logging.Logger) -> None:
    stream = HeldStream()
    threaded = ThreadedLog(stream)
    with threaded:
        logger.addHandler(threaded.handler)
        for n in range(500):  # returns although nothing can be written yet
            logger.info("line %d", n)
        assert stream.waiting.wait(30)
        stream.open.set()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == [str(n) for n in range(500)]


def test_the_lines_queued_meanwhile_are_written_at_once(logger: logging.Logger) -> None:
    stream = HeldStream()
    with ThreadedLog(stream) as threaded:
        logger.addHandler(threaded.handler)
        logger.info("first")
        assert stream.waiting.wait(30)  # the writer holds "first"
        for n in range(LINES_PER_WRITE + 10):
            logger.info("line %d", n)
        stream.open.set()
    lines = stream.getvalue().splitlines()
    assert [line.rsplit(" ", 1)[1] for line in lines] == [
        "first", *(str(n) for n in range(LINES_PER_WRITE + 10))]
    assert stream.writes == 3  # "first", then the lines queued meanwhile, a write per
    # LINES_PER_WRITE of them (one system call each, not one per line)


def test_lines_are_the_broker_handlers_lines_tracebacks_included(
        logger: logging.Logger) -> None:
    for log_format in ("TEXT", "JSON"):
        direct, threaded_out = io.StringIO(), io.StringIO()
        expected = broker_log_handler(direct, log_format)
        with ThreadedLog(threaded_out, log_format) as threaded:
            logger.addHandler(threaded.handler)
            logger.addHandler(expected)
            logger.warning("client %s sent\r\n%s", "a\nb", {"k": "v" * 5000})
            try:
                raise ValueError("bad\ninput")
            except ValueError:
                logger.exception("failed for %s", "x")
            logger.removeHandler(threaded.handler)
            logger.removeHandler(expected)
        assert threaded_out.getvalue() == direct.getvalue()
        if log_format == "JSON":
            assert "traceback" in json.loads(threaded_out.getvalue().splitlines()[-1])
        else:
            assert "Traceback (most recent call last):" in threaded_out.getvalue()


def test_a_stream_that_takes_nothing_drops_lines_and_says_how_many(
        logger: logging.Logger) -> None:
    stream = HeldStream()
    with ThreadedLog(stream, max_lines=10) as threaded:
        logger.addHandler(threaded.handler)
        logger.info("first")
        assert stream.waiting.wait(30)  # the writer holds "first"; the queue takes 10
        for n in range(100):
            logger.info("line %d", n)
        stream.open.set()
        deadline = time.monotonic() + 30
        while not threaded.lines.empty():  # room again
            assert time.monotonic() < deadline
            time.sleep(0.01)
        logger.info("after")
    text = stream.getvalue()
    written = [line for line in text.splitlines() if " line " in line]
    dropped = 100 - len(written)
    assert dropped > 0
    assert f"{dropped} log lines dropped" in text
    assert text.splitlines()[-1].endswith("after")


def test_after_stop_the_root_logger_writes_directly_with_its_filters() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    out = io.StringIO()
    threaded = ThreadedLog(out)
    threaded.start()
    root.addHandler(threaded.handler)
    refuse = logging.Filter("only-this-one")
    threaded.handler.addFilter(refuse)
    try:
        threaded.stop()
        assert threaded.handler not in root.handlers and threaded.direct in root.handlers
        assert refuse in threaded.direct.filters
        logging.getLogger("only-this-one").warning("after stop")
        logging.getLogger("another").warning("filtered out")
        assert out.getvalue().splitlines()[-1].endswith("only-this-one: after stop")
        assert "filtered out" not in out.getvalue()
    finally:
        root.handlers = before
