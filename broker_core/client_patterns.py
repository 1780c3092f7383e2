"""Regular expressions clients send (ListTransactions' transactional id pattern, KIP-1152),
compiled with RE2 as Kafka compiles them with RE2/J: matching takes time linear in the
name, whatever the pattern (Python's backtracking ``re`` would let one request hold the
event loop for hours), and RE2's syntax is the one Kafka accepts."""

from __future__ import annotations

from collections.abc import Callable

import re2

from broker_core.errors import ErrorCode, KafkaApiError

MAX_PATTERN_LENGTH = 1024
"""Longest pattern compiled: a longer one is refused (RE2's program grows with it)."""

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # an invalid pattern is the client's answer, not a log line


def client_pattern(text: str) -> Callable[[str], bool]:
    """Whether a name matches ``text`` whole; INVALID_REGULAR_EXPRESSION when RE2 refuses
    the pattern or it is longer than ``MAX_PATTERN_LENGTH``."""
    if len(text) > MAX_PATTERN_LENGTH:
        raise KafkaApiError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                            f"a pattern of {len(text)} characters (at most "
                            f"{MAX_PATTERN_LENGTH})")
    try:
        compiled = re2.compile(text, options=_OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else b""
        detail = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise KafkaApiError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                            f"invalid regular expression: {detail}") from None
    return lambda name: compiled.fullmatch(name) is not None
