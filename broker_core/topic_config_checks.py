"""How topic config values are checked and written back, by Kafka's ``ConfigDef`` rules:
whole numbers in a range, fractions, booleans, lists, and the few keys with a validator of
their own (compression levels, throttled replicas, message format versions). Each check
takes the value as a client sent it and says whether Kafka would take it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from broker_core.storage.config import whole_number

Check = Callable[[str], bool]

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""Unambiguous (each digit can match one way only), so a failing match is linear."""
_REPLICA = re.compile(r"(?:[0-9]+:[0-9]+)?")
"""One item of a throttled-replicas list: ``partition:broker``, or blank."""


def list_items(value: str) -> list[str]:
    """The items of a list-valued config (comma-separated, blanks dropped)."""
    return [item.strip() for item in value.split(",") if item.strip()]


def integer(low: int, high: int, also: int | None = None) -> Check:
    """A whole number from ``low`` to ``high`` (or exactly ``also``)."""
    def check(value: str) -> bool:
        try:
            number = whole_number(value)
        except ValueError:
            return False
        return low <= number <= high or number == also

    return check


def fraction(value: str) -> bool:
    """A decimal number from 0 to 1."""
    text = value.strip()
    if not _DECIMAL.fullmatch(text):
        return False
    number = float(text)
    return math.isfinite(number) and 0.0 <= number <= 1.0


def one_of(*choices: str) -> Check:
    """Exactly one of ``choices`` (Kafka's string validators are case-sensitive)."""
    return lambda value: value in choices


def boolean(value: str) -> bool:
    """``true`` or ``false`` in any case, blanks around it allowed (Kafka's BOOLEAN)."""
    return value.strip().lower() in ("true", "false")


def canonical_boolean(value: str) -> str:
    """A boolean as Kafka gives it back: ``true`` or ``false``."""
    return value.strip().lower()


def is_false(value: str) -> bool:
    """A boolean that is ``false``: what a key for a feature this broker lacks may hold."""
    return canonical_boolean(value) == "false"


def throttled_replicas(value: str) -> bool:
    """Kafka's throttled-replicas list: ``*`` or ``partition:broker`` items."""
    items = [item.strip() for item in value.split(",")] if value.strip() else []
    return all(_REPLICA.fullmatch(item) for item in items) or "".join(items) == "*"


def canonical_list(value: str) -> str:
    """A list with the blanks around its items dropped."""
    return ",".join(item.strip() for item in value.split(",")) if value.strip() else ""


_FORMAT_VERSIONS = {
    "0.8": "0 1 2", "0.9": "0", "0.10": "0-IV0 0-IV1 1-IV0 1-IV1 1-IV2 2-IV0",
    "0.11": "0-IV0 0-IV1 0-IV2",
}
_RELEASE_VERSIONS = {
    "1.0": "0", "1.1": "0", "2.0": "0 1", "2.1": "0 1 2", "2.2": "0 1", "2.3": "0 1",
    "2.4": "0 1", "2.5": "0", "2.6": "0", "2.7": "0 1 2", "2.8": "0 1", "3.0": "0 1",
    "3.1": "0", "3.2": "0", "3.3": "0 1 2 3", "3.4": "0", "3.5": "0 1 2", "3.6": "0 1 2",
    "3.7": "0 1 2 3 4", "3.8": "0", "3.9": "0",
}


def _version_keys() -> frozenset[str]:
    """The names Kafka 3.9's ``MetadataVersion.fromVersionString`` knows: each release
    (``0.10.2``, ``2.8``) and each of its inter-broker versions (``0.10.2-IV0``,
    ``2.8-IV1``)."""
    keys: set[str] = set()
    for family, tails in _FORMAT_VERSIONS.items():
        for tail in tails.split():
            keys.add(f"{family}.{tail}")
            keys.add(f"{family}.{tail.split('-')[0]}")
    for release, ivs in _RELEASE_VERSIONS.items():
        keys.add(release)
        keys.update(f"{release}-IV{iv}" for iv in ivs.split())
    return frozenset(keys)


_VERSION_KEYS = _version_keys()


def message_format_version(value: str) -> bool:
    """A version Kafka 3.x's ``message.format.version`` takes: the release is read from
    the first three dot-separated parts of a ``0.x`` version and the first two of any
    other (``2.8.1`` is ``2.8``), and must be one Kafka knows."""
    parts = value.split(".")
    kept = 3 if value.startswith("0.") else 2
    return (value if kept >= len(parts) else ".".join(parts[:kept])) in _VERSION_KEYS
