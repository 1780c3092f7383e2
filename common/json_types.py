"""JSON documents as types: what ``json.loads`` returns and ``json.dumps`` accepts.

``JsonValue`` is exact for parsed documents; code that reads one narrows with
``isinstance`` before use. ``JsonObject`` is the common case of a document whose top
level is an object (OAuth discovery, JWKS, token answers, JWT claims, stored metadata).
"""

from __future__ import annotations

import math
from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
"""A JSON value of whatever kind."""

JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object."""


def json_number(value: JsonValue) -> float | None:
    """``value`` as a float when it is a JSON number (not a boolean), else None; an integer
    too large for a float is an infinity of its sign."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def json_field(document: JsonValue, key: str) -> JsonValue:
    """``document[key]``: TypeError unless ``document`` is an object, KeyError if absent."""
    if not isinstance(document, dict):
        raise TypeError(f"expected a JSON object, got {type(document).__name__}")
    return document[key]


def json_int(value: JsonValue) -> int:
    """``int(value)`` for a number or string (ValueError if it does not parse), else
    TypeError."""
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")

