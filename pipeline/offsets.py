"""Offsets per topic-partition: the starting/ending specs, the checkpoint form and read limits.

In a checkpoint (and in ``startingOffsets`` / ``endingOffsets`` JSON) offsets look like
Spark's Kafka source: ``{"topic": {"0": 23, "1": 40}}``. In a spec, -2 stands for the
earliest offset and -1 for the latest.
"""

from __future__ import annotations

import json
import math
from typing import Literal

from pipeline.options import OptionError

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]
Spec = Literal["earliest", "latest"] | Offsets

EARLIEST = -2
LATEST = -1


def parse_spec(text: str | None, default: Literal["earliest", "latest"], name: str) -> Spec:
    """``earliest``, ``latest`` or per-partition JSON; ``None`` gives ``default``."""
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("earliest", "latest"):
        return "earliest" if lowered == "earliest" else "latest"
    try:
        document = json.loads(text)
        offsets = from_json(document)
    except (ValueError, TypeError, AttributeError):
        raise OptionError(f'option {name} must be earliest, latest or JSON like '
                          f'{{"topic": {{"0": 23, "1": -2}}}}, not {text!r}') from None
    for (topic, partition), offset in offsets.items():
        if offset < EARLIEST:
            raise OptionError(f"option {name}: offset {offset} of {topic}-{partition} is "
                              "neither an offset nor -2 (earliest) / -1 (latest)")
    return offsets


def from_json(document: object) -> Offsets:
    """``{"topic": {"0": 23}}`` (as parsed JSON) to ``{("topic", 0): 23}``."""
    if not isinstance(document, dict):
        raise ValueError("offsets must be a JSON object")
    return {(str(topic), int(partition)): int(offset)
            for topic, parts in document.items() for partition, offset in parts.items()}


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """``{("topic", 0): 23}`` to the checkpoint form ``{"topic": {"0": 23}}``, sorted."""
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return document


def rate_limit(start: Offsets, latest: Offsets, max_offsets: int) -> Offsets:
    """End offsets that advance at most ``max_offsets`` in total, shared among partitions in
    proportion to what each has waiting (as Spark's Kafka source does), every partition
    with data moving by at least one."""
    waiting = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(waiting.values())
    if total <= max_offsets:
        return dict(latest)
    limited: Offsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = max_offsets * waiting[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(end, begin + step)
    return limited
