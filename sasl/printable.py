"""Client-supplied text made safe to show: control characters escaped, length bounded.

Usernames, extensions, mechanism names and the reasons built from them reach failure
messages, log lines and audit events. :func:`printable` is the one place that makes such
text harmless there: every control character (``\\r``, ``\\n``, other C0/C1 codes, DEL,
the Unicode line and paragraph separators and the bidirectional overrides) is written as
a backslash escape, so no client can start a line of its own, and the result is cut to a
bounded length with a note of how much was left out.
"""

from __future__ import annotations

import re

FIELD_LIMIT = 256
"""The default bound, in characters, of one client-supplied field."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a backslash escape."""
    return _CONTROL.sub(_escape, text)


def printable(text: str, limit: int = FIELD_LIMIT) -> str:
    """``text`` escaped (see :func:`escape_controls`) and cut to at most ``limit``
    characters plus a short ``...[N more characters]`` note when it was longer."""
    if len(text) <= limit and _CONTROL.search(text) is None:
        return text
    pieces: list[str] = []
    size = 0
    for kept, char in enumerate(text):
        piece = escape_controls(char) if _CONTROL.match(char) else char
        if size + len(piece) > limit:
            return f"{''.join(pieces)}...[{len(text) - kept} more characters]"
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)
