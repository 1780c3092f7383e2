"""Where quotas meet requests: what each request is charged, and its throttled answer.

As Kafka does: a Produce is charged its request bytes against ``producer_byte_rate``; a
Fetch its record bytes against ``consumer_byte_rate``, and a Fetch over that quota is
answered empty (its bytes taken back), to be asked again after the throttle time; every
request served by a handler is charged its dispatch-stage time against
``request_percentage`` (percent of the event loop's time). The longest throttle earned
goes into the response's ``throttle_time_ms``, and the connection is muted for that long
(KIP-219: the client is not read from, whether it honours the field or not). CreateTopics,
CreatePartitions and DeleteTopics are charged their partitions by their handlers
(``broker_core.quotas.mutations``), whose answers carry the throttle they earned: the
connection is muted for the longer of that and the request's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import (
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
)

from broker_core.apis.fetch import release_batches
from broker_core.codec.fetch_writer import FetchAnswer
from broker_core.context import RequestContext
from broker_core.quotas.entities import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
)
from broker_core.quotas.manager import QuotaManager, Throttle

if TYPE_CHECKING:  # the dispatcher imports this module's class for its own types
    from broker_core.dispatch import Response

PRODUCE_KEY = 0
FETCH_KEY = 1


_MUTATION_ANSWERS = (CreateTopicsResponse, CreatePartitionsResponse, DeleteTopicsResponse)
"""The answers whose handlers set the throttle of their ``controller_mutation_rate``."""


def _carried_ms(response: Response | None) -> int:
    """The throttle time a handler put in its answer itself (a mutating API's)."""
    return int(response.throttle_time_ms) if isinstance(response, _MUTATION_ANSWERS) else 0


def _longest(*throttles: Throttle | None) -> Throttle | None:
    found = [t for t in throttles if t is not None]
    return max(found, key=lambda t: t.throttle_ms) if found else None


class Throttling:
    """Charges requests to a :class:`QuotaManager` and throttles their answers."""

    def __init__(self, manager: QuotaManager) -> None:
        self.manager = manager

    def dispatched(self, ctx: RequestContext, api_key: int, request_bytes: int,
                   seconds: float) -> Throttle | None:
        """Charge a request whose dispatch stage took ``seconds``."""
        produced = None
        if api_key == PRODUCE_KEY:
            produced = self.manager.charge(ctx, PRODUCER_BYTE_RATE, request_bytes)
        if not self.manager.active:
            return produced
        return _longest(produced, self.manager.charge(ctx, REQUEST_PERCENTAGE, seconds * 100))

    def answered(self, ctx: RequestContext, response: Response | None,
                 throttle: Throttle | None) -> tuple[Response | None, int]:
        """The response to send and the milliseconds to mute the connection: a Fetch
        answer's record bytes are charged (over the quota, the answer is empty), the
        longest throttle goes into ``throttle_time_ms`` and is reported."""
        if isinstance(response, FetchAnswer):
            size = response.record_bytes
            fetched = self.manager.charge(ctx, CONSUMER_BYTE_RATE, size)
            if fetched is not None:
                self.manager.uncharge(fetched, size)
                for topic in response.topics:
                    for part in topic.partitions:
                        release_batches(part.batches)
                response = FetchAnswer(response.version, [])
                throttle = _longest(throttle, fetched)
        if throttle is None:
            return response, _carried_ms(response)
        if self.manager.observer is not None:
            self.manager.observer.throttled(ctx, throttle)
        throttle_ms = max(throttle.throttle_ms, _carried_ms(response))
        return with_throttle(response, throttle_ms), throttle_ms


def with_throttle(response: Response | None, throttle_ms: int) -> Response | None:
    """``response`` carrying ``throttle_time_ms`` (kept as is by versions without it)."""
    if throttle_ms > 0 and response is not None and hasattr(response, "throttle_time_ms"):
        response.throttle_time_ms = throttle_ms
    return response
