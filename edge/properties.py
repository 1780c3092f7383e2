"""The Java ``.properties`` format, as the broker's config file and the OAuth settings
file are written in (``java.util.Properties.load`` semantics, text not bytes).

A library (jproperties, one release since 2024) was weighed against these ninety lines:
it would add a dependency and lose the error that names the line of a malformed
``\\uXXXX`` escape; the format's corner cases are tested in tests/operations/test_config.py.
"""

from __future__ import annotations

import re

from edge.config_types import ConfigError

__all__ = ["parse_properties"]

_WHITESPACE = " \t\f"
_SIMPLE_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")


def _ends_with_continuation(line: str) -> bool:
    """True if ``line`` ends in an odd number of backslashes."""
    count = len(line) - len(line.rstrip("\\"))
    return count % 2 == 1


def _unescape(text: str, line_no: int) -> str:
    """Resolve Java properties escapes: ``\\t \\n \\r \\f \\uXXXX`` and ``\\<char>``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        if i + 1 >= len(text):  # a lone trailing backslash means nothing
            break
        code = text[i + 1]
        if code == "u":
            digits = text[i + 2 : i + 6]
            if not _HEX4.fullmatch(digits):
                raise ConfigError(f"line {line_no}: malformed \\uXXXX escape {text[i:i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_SIMPLE_ESCAPES.get(code, code))
            i += 2
    return "".join(out)


def _split_key_value(line: str) -> tuple[str, str]:
    """Split a logical line (escapes unresolved) at its first unescaped separator.

    The key ends at the first unescaped ``=``, ``:`` or whitespace; whitespace, at most
    one ``=`` or ``:``, and more whitespace then separate it from the value.
    """
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            i += 2
            continue
        if char in "=:" or char in _WHITESPACE:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WHITESPACE)
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(_WHITESPACE)
    return key, rest


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (a repeated key: the last one wins).

    Supports ``key=value``, ``key:value`` and ``key value``; ``#`` and ``!`` comment
    lines; blank lines; leading whitespace; backslash line continuation (leading
    whitespace of the continued line is dropped); escapes ``\\t \\n \\r \\f \\\\ \\=
    \\: \\uXXXX`` and backslash before any other character.
    """
    result: dict[str, str] = {}
    lines = _LINE_BREAK.split(text)
    index = 0
    while index < len(lines):
        line_no = index + 1
        logical = lines[index].lstrip(_WHITESPACE)
        index += 1
        if not logical or logical[0] in "#!":
            continue
        while _ends_with_continuation(logical):
            logical = logical[:-1]
            if index >= len(lines):
                break
            logical += lines[index].lstrip(_WHITESPACE)
            index += 1
        raw_key, raw_value = _split_key_value(logical)
        result[_unescape(raw_key, line_no)] = _unescape(raw_value, line_no)
    return result
