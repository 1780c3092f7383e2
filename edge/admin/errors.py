"""The two ways an admin command fails, and the one line each is shown as.

:class:`UsageError` is a mistake on the command line (exit 2, as argparse's own);
:class:`CallFailed` a call the broker refused or that could not be made (exit 1). A
kafka-python error becomes one :class:`CallFailed` line: Kafka's error name and what it
means, or the broker's own message.
"""

from __future__ import annotations

from kafka.errors import BrokerResponseError, KafkaError

from sasl.printable import printable

LINE_LIMIT = 300
"""The most characters of a message shown on the error line."""


class UsageError(Exception):
    """A flag, argument or properties file is wrong (exit 2)."""


class CallFailed(Exception):
    """The broker refused a call, or it could not be made (exit 1)."""


def kafka_error_line(exc: KafkaError) -> str:
    """One bounded line for a kafka-python error: ``NAME: meaning`` for a broker's error
    code (with the broker's message when it sent a short one), else the client's text."""
    if isinstance(exc, BrokerResponseError) and exc.message:
        detail = str(exc.args[0]) if exc.args else ""
        if not detail or detail.startswith("Request ") or len(detail) > LINE_LIMIT:
            detail = exc.description or ""
        return printable(f"{exc.message}: {detail}" if detail else str(exc.message),
                         LINE_LIMIT)
    name = type(exc).__name__
    text = str(exc) or name
    return printable(text if text.startswith(name) else f"{name}: {text}", LINE_LIMIT)


def error_code_name(code: int) -> str:
    """Kafka's name of an error code (``NONE`` for 0)."""
    from kafka.errors import for_code

    name: str | None = for_code(code).message
    return "NONE" if code == 0 else (name or f"ERROR_{code}")
