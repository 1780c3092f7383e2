"""Small command-line readers shared by the admin verbs."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import TypeAlias

from edge.admin.errors import UsageError

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns."""

_DURATION = re.compile(r"([0-9]+)([smhdw]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def key_values(items: Sequence[str], flag: str) -> dict[str, str]:
    """``KEY=VALUE`` items as a dict; UsageError naming the flag for one without ``=``."""
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        found[key.strip()] = value.strip()
    return found


def duration_seconds(text: str, flag: str) -> int:
    """``90``, ``30s``, ``15m``, ``1h``, ``7d`` or ``2w`` in seconds (more than 0)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or int(match[1]) == 0:
        raise UsageError(f"{flag} {text!r}: expected a positive duration such as 30m, 1h, 7d")
    return int(match[1]) * _UNIT_SECONDS[match[2]]
