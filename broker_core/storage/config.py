"""Per-partition log settings (``LogConfig``) and their derivation from topic configs."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

_WEEK_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class LogConfig:
    """How a partition's ledgers roll, are indexed and are retained."""

    segment_bytes: int = 1 << 30
    """Roll a new ledger when the open one would grow beyond this many bytes."""
    segment_ms: int = _WEEK_MS
    """Roll when the open ledger's first entry is older than this (checked on append)."""
    retention_ms: int = _WEEK_MS
    """Drop sealed ledgers whose newest entry is older than this; -1 keeps forever."""
    retention_bytes: int = -1
    """Drop the oldest sealed ledgers while the partition stays at least this big; -1 = no limit."""
    index_interval_bytes: int = 4096
    """Bytes of entries between two points of the sparse offset index."""

    def __post_init__(self) -> None:
        for field, minimum in _MINIMUMS.items():
            problem = _range_problem(getattr(self, field), minimum)
            if problem is not None:
                raise ValueError(f"LogConfig.{field} {problem}")


_MINIMUMS: Mapping[str, int] = {
    "segment_bytes": 1,
    "segment_ms": 1,
    "retention_ms": -1,
    "retention_bytes": -1,
    "index_interval_bytes": 0,
}


_WHOLE = re.compile(r"[+-]?[0-9]+")
_LONG_DIGITS = 19
"""Digits of the largest long."""


def whole_number(text: str) -> int:
    """An integer config value as Java's ``Long.parseLong`` reads it (blanks around it, a
    sign, any number of leading zeros); ValueError for anything else, or for more than a
    long's 19 significant digits (checked before parsing: ``int`` refuses more than 4,300
    digits, leading zeros included, and a client must not make it try)."""
    stripped = text.strip()
    if not _WHOLE.fullmatch(stripped):
        raise ValueError(f"not an integer: {text[:40]!r}")
    digits = stripped.lstrip("+-").lstrip("0")
    if len(digits) > _LONG_DIGITS:
        raise ValueError(f"out of range: {len(digits)} digits")
    number = int(digits or "0")
    return -number if stripped.startswith("-") else number


def _range_problem(value: object, minimum: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    if value < minimum:
        return f"must be >= {minimum}, got {value}"
    return None


TOPIC_CONFIG_FIELDS: Mapping[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "index.interval.bytes": "index_interval_bytes",
}
"""Topic config keys (Kafka names) that override a ``LogConfig`` field."""


def log_config_for_topic(default: LogConfig, configs: Mapping[str, str]) -> LogConfig:
    """Return ``default`` overridden by the storage-related keys of a topic's configs.

    Keys the storage layer does not use are ignored. An invalid value raises
    ``ValueError`` naming the key. A ``cleanup.policy`` without ``delete`` (a compacted
    topic) turns retention off, as in Kafka: its ledgers are never deleted for their age
    or size. A compacted topic's open ledger rolls after ``max.compaction.lag.ms`` when
    that is shorter than ``segment.ms`` (Kafka's ``maxSegmentMs``, KIP-354): the open
    ledger is never cleaned, so the lag could not be kept otherwise.
    """
    changes: dict[str, int] = {}
    policy = configs.get("cleanup.policy")
    items = {item.strip() for item in policy.split(",")} if policy is not None else set()
    if policy is not None and "delete" not in items:
        changes.update(retention_ms=-1, retention_bytes=-1)
    for key, field in TOPIC_CONFIG_FIELDS.items():
        raw = configs.get(key)
        if raw is None or field in changes:
            continue
        try:
            value = whole_number(str(raw))
        except ValueError:
            raise ValueError(f"invalid value {raw!r} for topic config {key!r}") from None
        problem = _range_problem(value, _MINIMUMS[field])
        if problem is not None:
            raise ValueError(f"invalid value {raw!r} for topic config {key!r}: {problem}")
        changes[field] = value
    max_lag = configs.get("max.compaction.lag.ms")
    if "compact" in items and max_lag is not None:
        try:
            lag = whole_number(str(max_lag))
        except ValueError:
            raise ValueError(f"invalid value {max_lag!r} for topic config "
                             "'max.compaction.lag.ms'") from None
        if lag > 0:
            changes["segment_ms"] = min(changes.get("segment_ms", default.segment_ms), lag)
    return dataclasses.replace(default, **changes)
