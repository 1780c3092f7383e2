"""The timestamp bounds of produce (KIP-937): with ``message.timestamp.type=CreateTime``
a batch whose timestamps lie more than ``message.timestamp.before.max.ms`` before the
broker's clock, or more than ``message.timestamp.after.max.ms`` after it, is refused with
INVALID_TIMESTAMP, as Kafka's broker refuses it. Where a bound is left at its default
(the largest long), ``message.timestamp.difference.max.ms`` bounds that side instead
(Kafka 3.x's rule while the old key lives). With LogAppendTime nothing is checked: the
broker stamps its own time.

What is checked is the batch header, not each record: its first timestamp (the first
record's) and its largest one, which every client writes as the largest of its records'.
Kafka walks the records; the header gives both bounds for the batches real clients build
at the cost of two comparisons, without the record walk (which not every batch gets on
the event loop). What it cannot see: a record after the first whose timestamp is *below*
the first (a negative delta: a client given out-of-order explicit timestamps) and older
than the bound, and a record above a header maximum a client understated. Such a batch
is stored; the header's maximum is what retention and the time index read either way.
Records without a timestamp (-1) are not checked, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from broker_core.codec.batch_header import BatchHeader
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.topic_configs import LONG_MAX, config_number

NO_TIMESTAMP = -1
"""A record's timestamp when its producer set none."""


@dataclass(frozen=True, slots=True)
class TimestampBounds:
    """How far before and after the broker's clock a produced timestamp may lie (None: no
    bound on that side)."""

    before_ms: int | None
    after_ms: int | None

    @classmethod
    def of(cls, settings: Mapping[str, str]) -> TimestampBounds | None:
        """The bounds a topic's effective configs ``settings`` set; None when nothing is
        checked (LogAppendTime, or no bound on either side)."""
        if settings["message.timestamp.type"] != "CreateTime":
            return None
        difference = config_number(settings, "message.timestamp.difference.max.ms")

        def bound(name: str) -> int | None:
            value = config_number(settings, name)
            if value == LONG_MAX:
                value = difference
            return None if value == LONG_MAX else value  # no difference exceeds it

        before = bound("message.timestamp.before.max.ms")
        after = bound("message.timestamp.after.max.ms")
        return None if before is None and after is None else cls(before, after)

    def check(self, header: BatchHeader, now_ms: int) -> None:
        """INVALID_TIMESTAMP when the batch's first or largest timestamp is out of bounds
        at the broker's time ``now_ms``."""
        for timestamp in (header.base_timestamp, header.max_timestamp):
            if timestamp == NO_TIMESTAMP:
                continue
            if (self.before_ms is not None and now_ms - timestamp > self.before_ms) or \
                    (self.after_ms is not None and timestamp - now_ms > self.after_ms):
                low = "" if self.before_ms is None else now_ms - self.before_ms
                high = "" if self.after_ms is None else now_ms + self.after_ms
                raise KafkaApiError(
                    ErrorCode.INVALID_TIMESTAMP,
                    f"Timestamp {timestamp} of a record is out of range. The timestamp "
                    f"should be within [{low}, {high}]")
