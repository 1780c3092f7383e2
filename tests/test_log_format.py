"""Client text in logs and audit fields: ``sasl.printable`` escapes and bounds it, and the
broker's log formatter (``edge.log_format``) applies that to every argument of every
record while tracebacks keep their lines."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from edge.audit import AuditEvent
from edge.log_format import LOG_ARG_LIMIT, broker_log_handler
from sasl.printable import FIELD_LIMIT, printable

FORGED = "2026-01-01 00:00:00,000 INFO edge.session: peer logged in as admin"


def test_printable_escapes_control_characters() -> None:
    assert printable("plain name-1.x") == "plain name-1.x"
    assert printable("a\r\nb\tc\x00d\x7f\x85e") == "a\\r\\nb\\tc\\x00d\\x7f\\x85e"
    assert printable("line\u2028sep\u202eevil") == "line\\u2028sep\\u202eevil"
    assert printable("é漢") == "é漢"


def test_printable_bounds_and_says_how_much_was_cut() -> None:
    text = printable("A" * 60_000)
    assert text.startswith("A" * FIELD_LIMIT) and text.endswith("...[59744 more characters]")
    escaped = printable("\n" * 1000, 10)
    assert escaped == "\\n" * 5 + "...[995 more characters]"


def test_audit_events_are_bounded_and_escaped() -> None:
    event = AuditEvent(kind="authentication", outcome="failure", listener="SASL",
                       client="127.0.0.1:1", tenant="t\r\n" + "x" * 60_000,
                       reason="r" * 60_000).bounded()
    assert event.tenant is not None and event.tenant.startswith("t\\r\\nxxx")
    assert len(event.tenant) < FIELD_LIMIT + 40 and event.reason is not None
    assert len(event.reason) < FIELD_LIMIT + 40 and event.principal is None


@pytest.fixture
def broker_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing through the broker's log handler."""
    out = io.StringIO()
    handler = broker_log_handler(out)
    logger = logging.getLogger("test-log-format")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    yield logger, out
    logger.removeHandler(handler)


def test_arguments_cannot_start_a_line(broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    logger.info("token accepted: extensions [%s]", "note=x\r\n" + FORGED)
    logger.warning("closing: %s", ValueError("bad\n" + FORGED))
    logger.info("group %(group)s joined", {"group": "g\n" + FORGED})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    assert not any(line.startswith(FORGED) for line in lines)
    assert lines[0].endswith(" INFO test-log-format: token accepted: extensions "
                             "[note=x\\r\\n" + FORGED + "]")


def test_arguments_are_bounded_numbers_kept(
        broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    logger.info("user %s sent %d bytes (%.1f%%)", "u" * 60_000, 60_000, 12.5)
    line = out.getvalue().rstrip("\n")
    assert len(line) < LOG_ARG_LIMIT + 200
    assert line.endswith("more characters] sent 60000 bytes (12.5%)")


def test_tracebacks_keep_their_lines_but_not_client_lines(
        broker_log: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = broker_log
    try:
        try:
            raise KeyError("inner")
        except KeyError as exc:
            raise ValueError("topic 'a\r\n" + FORGED + "'") from exc
    except ValueError:
        logger.exception("request from %s failed", "peer")
    lines = out.getvalue().splitlines()
    assert lines[0].endswith(" ERROR test-log-format: request from peer failed")
    assert lines[1] == "Traceback (most recent call last):"
    assert any("direct cause" in line for line in lines)
    assert lines[-1] == "ValueError: topic 'a\\r\\n" + FORGED + "'"
    assert not any(line.startswith(FORGED) for line in lines)
