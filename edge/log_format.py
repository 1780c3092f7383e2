"""The broker's log format: one record is one line, whatever a client sent.

Usernames, client ids, SASL extensions, topic and group names reach log lines as
``%``-arguments in every layer (listeners, sasl, oauth, broker_core). The
:class:`ClientTextFormatter` on the broker's handler makes them harmless in one place:
every argument but a number is rendered (a dict or list of client configs too) and its
text bounded to :data:`LOG_ARG_LIMIT` characters, and every control character of the
message is escaped (``sasl.printable``), so no client can write a line of its own, nor
a line of unbounded length. A traceback (``exc_info``) keeps its lines; only the exception
messages inside it are escaped.

With ``logFormat=json`` the :class:`JsonFormatter` writes each record as one JSON object
on one line instead: ``time``, ``level``, ``logger``, ``message`` (the same escaped and
bounded text), the fields of :data:`LOG_FIELDS` that the log call passed as ``extra``
(bounded and escaped likewise; names and helpers in ``common.log_fields``), and
``traceback``. Every non-ASCII character is written as
a JSON escape, so a line is one line whatever a client sent.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from numbers import Number
from typing import Literal, TextIO

from common.log_fields import LOG_FIELDS
from sasl.printable import escape_controls, printable

BROKER_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The broker's log line: time, level, logger, message."""

LOG_ARG_LIMIT = 1024
"""The most characters one argument of a log record contributes to its line."""



class _BoundedText:
    """An argument that is neither text nor a number, standing in for it in ``%``
    formatting: ``%s`` and ``%r`` give its rendered text, escaped and bounded."""

    __slots__ = ("_arg",)

    def __init__(self, arg: object) -> None:
        self._arg = arg

    def __str__(self) -> str:
        return printable(str(self._arg), LOG_ARG_LIMIT)

    def __repr__(self) -> str:
        return printable(repr(self._arg), LOG_ARG_LIMIT)


class _BoundedMapping(_BoundedText):
    """A record's mapping argument: ``%(key)s`` gives each value bounded, and ``%s`` (a
    lone dict logged as such) the whole mapping's text bounded."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: Mapping[str, object]) -> None:
        super().__init__(mapping)
        self._mapping = mapping

    def __getitem__(self, key: str) -> object:
        return _bounded(self._mapping[key])


def _bounded(arg: object) -> object:
    if isinstance(arg, str | BaseException):
        return printable(str(arg), LOG_ARG_LIMIT)
    if isinstance(arg, Number):
        return arg
    return _BoundedText(arg)


def _message(record: logging.LogRecord) -> str:
    args = record.args
    if not args:
        return str(record.msg)
    if isinstance(args, Mapping):
        return str(record.msg) % _BoundedMapping(args)
    return str(record.msg) % tuple(_bounded(arg) for arg in args)


def _traceback_lines(exc: traceback.TracebackException) -> Iterator[str]:
    """Python's traceback text with the exception messages escaped (chained causes and
    contexts first, as Python prints them)."""
    if exc.__cause__ is not None:
        yield from _traceback_lines(exc.__cause__)
        yield ("\nThe above exception was the direct cause of the following "
               "exception:\n\n")
    elif exc.__context__ is not None and not exc.__suppress_context__:
        yield from _traceback_lines(exc.__context__)
        yield "\nDuring handling of the above exception, another exception occurred:\n\n"
    if exc.stack:
        yield "Traceback (most recent call last):\n"
        yield from exc.stack.format()
    for line in exc.format_exception_only():
        yield escape_controls(line.removesuffix("\n")) + "\n"
    for index, sub in enumerate(exc.exceptions or (), start=1):
        yield f"sub-exception {index}:\n"
        yield from _traceback_lines(sub)


def _traceback_text(record: logging.LogRecord) -> str | None:
    """The record's traceback with its exception messages escaped, if it has one."""
    if record.exc_text:
        return record.exc_text
    if not record.exc_info or record.exc_info[1] is None:
        return None
    exc_type, value, tb = record.exc_info
    assert exc_type is not None
    exc = traceback.TracebackException(exc_type, value, tb, compact=True)
    return "".join(_traceback_lines(exc)).removesuffix("\n")


class ClientTextFormatter(logging.Formatter):
    """Wraps a handler's formatter: the message it gets holds no control character and
    no overlong argument, and a traceback's exception messages are escaped."""

    def __init__(self, inner: logging.Formatter | None = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        safe = logging.makeLogRecord(record.__dict__)
        safe.msg = escape_controls(_message(record))
        safe.args = None
        safe.exc_text = _traceback_text(record)
        return self.inner.format(safe)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": escape_controls(_message(record)),
        }
        for field in LOG_FIELDS:
            value = record.__dict__.get(field)
            if value is not None:
                entry[field] = (value if isinstance(value, int | float)
                                else printable(str(value), LOG_ARG_LIMIT))
        text = _traceback_text(record)
        if text is not None:
            entry["traceback"] = text
        return json.dumps(entry)


LogFormat = Literal["TEXT", "JSON"]
"""The two log formats (the ``logFormat`` key)."""


def broker_log_handler(stream: TextIO, log_format: LogFormat = "TEXT") -> logging.Handler:
    """The broker's log handler on ``stream``: :data:`BROKER_LOG_FORMAT` lines, or JSON
    lines; client text escaped and bounded in both."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if log_format == "JSON"
                         else ClientTextFormatter(logging.Formatter(BROKER_LOG_FORMAT)))
    return handler
