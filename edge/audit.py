"""Audit events: one JSON record per authentication outcome, authorization denial,
rejected connection and first throttled request of a quota window (``edge.quotas``),
appended to the internal topic ``__audit`` of the metadata namespace
(``public/__kafka/__audit`` by default) for the security pipeline to analyse.

Writes are plain appends to the managed ledger (no fsync wait); the events of one turn of
the event loop are written as one batch at its end (a storm of logins wrote a batch, and
made a write system call on the loop, per login). Repeated identical denials within one
second of the first are written once, so a client looping on a refused request cannot
flood the log; those left out are counted: at the end of that second one more event, the
same denial with ``count`` set to their number. In a cluster an event recorded before this
broker has claimed its audit partition (just created, or a slot just taken over) waits in
memory, in order, until the claim lands. A write that fails (a full disk) is logged once
per cause by the engine's write faults, without a traceback. Every text field is escaped
and bounded (``sasl.printable``) before it is written: a client's 60 KB username or
password costs the audit topic at most a few hundred bytes, and no field carries a
control character.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, fields, replace

from broker_core.codec.batch_header import read_header
from broker_core.codec.records import encode_batch
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import PartitionStore, StorageError, TopicExists
from broker_core.storage_faults import WriteKind
from common.names import AUDIT_TOPIC
from sasl.printable import printable

log = logging.getLogger(__name__)
_GROW_ATTEMPTS = 20
"""Looks at the audit topic while other brokers keep creating or growing it at once."""
_MAX_DEFERRED = 10_000
"""Events kept while this broker's audit partition is not claimed yet (more are dropped,
logged once per wait)."""
_RETRY_S = 1.0
"""Between two looks at whether the audit partition is this broker's yet."""


_Event = tuple[bytes, bytes, int]
"""An audit record: its key (the tenant), its JSON value, when it was recorded (ms)."""


class _NotClaimed(Exception):
    """This broker's audit partition exists but is not claimed by it yet."""


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One security-relevant event."""

    kind: str            # authentication, authorization, connection, quota
    outcome: str         # success, failure, denied, rejected, throttled
    listener: str
    client: str
    principal: str | None = None
    tenant: str | None = None
    mechanism: str | None = None
    api: str | None = None
    resource: str | None = None
    reason: str | None = None
    time: int = 0
    count: int = 1
    """How many events this one stands for: 1, or the number a window's summary event
    counts that were left out of the audit (``edge.denials``)."""

    def document(self, now: int) -> dict[str, str | int | None]:
        """The event's JSON object: every field, in order (``dataclasses.asdict`` gave
        the same, at ten times the cost per login), ``time`` defaulting to ``now``."""
        document: dict[str, str | int | None] = {
            name: getattr(self, name) for name in _FIELD_NAMES}
        document["time"] = self.time or now
        return document

    def bounded(self) -> AuditEvent:
        """This event with every text field escaped and bounded."""
        return AuditEvent(
            kind=self.kind, outcome=self.outcome, listener=self.listener,
            client=printable(self.client), principal=_bounded(self.principal),
            tenant=_bounded(self.tenant), mechanism=_bounded(self.mechanism),
            api=_bounded(self.api), resource=_bounded(self.resource),
            reason=_bounded(self.reason), time=self.time, count=self.count)


_FIELD_NAMES = tuple(field.name for field in fields(AuditEvent))


def _bounded(text: str | None) -> str | None:
    return None if text is None else printable(text)


_REPEAT_WINDOW_MS = 1000
"""Identical denials within this long of the first one written are counted, not written."""
_MAX_REPEAT_KEYS = 10_000
"""Denials remembered for de-duplication (beyond, the counts so far are written and the
memory starts again)."""


@dataclass(slots=True)
class _Repeats:
    """A denial written at ``since`` (monotonic ms) and how many identical ones came since,
    left out."""

    since: int
    event: AuditEvent
    left_out: int = 0


class AuditLog:
    """Appends audit events to ``<metadata tenant>/<metadata namespace>/__audit``."""

    def __init__(self, engine: Engine, enabled: bool) -> None:
        self.engine = engine
        self.enabled = enabled
        self.topic = (f"{engine.config.metadata_tenant}/{engine.config.metadata_namespace}/"
                      f"{AUDIT_TOPIC}")
        self._recent: dict[tuple[str | None, ...], _Repeats] = {}
        self._deferred: list[_Event] = []
        self._batch: list[_Event] = []
        """Events recorded in this turn of the loop, written as one batch at its end."""
        self._dropped = 0
        """Events dropped during the current wait (the deferred list was full)."""
        self._waiting: asyncio.Task[None] | None = None
        engine.cluster.pinned_topics.add(self.topic)

    @property
    def index(self) -> int:
        """This broker's own partition: its slot (``broker_core.cluster.slots``, a small
        number whatever the broker id). In a cluster each broker writes its own (pinned to
        it while it is live), so no event waits for another broker."""
        return self.engine.cluster.lease.slot

    def _log(self) -> PartitionStore:
        """This broker's partition of the audit topic, created on the first event;
        _NotClaimed until this broker has claimed it."""
        partition = self.engine.logs.partition(self.topic, self.index) or self._grown()
        if self.engine.leadership.serves(self.topic, self.index) is None:
            raise _NotClaimed
        return partition

    def _grown(self) -> PartitionStore:
        """Create or grow the audit topic up to this broker's partition. Another broker
        doing the same at once (TopicExists, or a partition count that moved meanwhile:
        ValueError) makes this one look again, until its partition is there."""
        logs = self.engine.logs
        for _ in range(_GROW_ATTEMPTS):
            topic = logs.topic(self.topic)
            with contextlib.suppress(TopicExists, ValueError):
                if topic is None:
                    logs.create_topic(self.topic, self.index + 1, {})
                else:
                    logs.add_partitions(self.topic, self.index + 1)
            found = logs.partition(self.topic, self.index)
            if found is not None:
                return found
        raise OSError(f"{self.topic} kept changing while growing it to "
                      f"{self.index + 1} partitions")

    def _flushed(self, done: asyncio.Future[None]) -> None:
        error = None if done.cancelled() else done.exception()
        if isinstance(error, OSError):
            self.engine.faults.failed(error, f"{self.topic}-{self.index} (fsync)",
                                      WriteKind.CHECKPOINTS)

    def record(self, event: AuditEvent) -> None:
        """Append one event (never raises: auditing must not break the request)."""
        if not self.enabled:
            return
        event = event.bounded()
        now = int(time.time() * 1000)
        # a window's summary (count > 1) is counted as written: never folded into another
        if event.kind == "authorization" and event.count == 1 and self._repeated(event):
            return
        self._append(event, now)

    def _repeated(self, event: AuditEvent) -> bool:
        """Whether ``event`` repeats a denial written less than a second ago (then it is
        counted, and the count written at the end of that second). The second is measured
        on the monotonic clock: a wall clock set back would hold every repeat back."""
        now = int(time.monotonic() * 1000)
        key = (event.principal, event.tenant, event.api, event.resource, event.client)
        seen = self._recent.get(key)
        if seen is not None and now - seen.since < _REPEAT_WINDOW_MS:
            if not seen.left_out:
                with contextlib.suppress(RuntimeError):  # no event loop (a tool)
                    asyncio.get_running_loop().call_later(
                        (seen.since + _REPEAT_WINDOW_MS - now) / 1000, self._count, key, seen)
            seen.left_out += 1
            return True
        if seen is not None:  # its second is over (its timer may not have run yet)
            self._count(key, seen)
        if len(self._recent) >= _MAX_REPEAT_KEYS:
            self.count_repeats()
        self._recent[key] = _Repeats(now, event)
        return False

    def _count(self, key: tuple[str | None, ...], seen: _Repeats) -> None:
        """The end of a denial's second (``seen``, if it is still the one remembered for
        ``key``): the count of its repeats left out, written."""
        if self._recent.get(key) is not seen:
            return
        del self._recent[key]
        if seen.left_out:
            self._append(replace(seen.event, count=seen.left_out, time=0),
                         int(time.time() * 1000))

    def count_repeats(self) -> None:
        """Write the counts of every denial's repeats left out so far, and forget them
        (a full memory, and the broker's stop)."""
        for key, seen in list(self._recent.items()):
            self._count(key, seen)

    def _append(self, event: AuditEvent, now: int) -> None:
        """Add ``event`` (bounded) to the batch of this turn of the loop."""
        document = event.document(now)
        value = json.dumps(document, separators=(",", ":")).encode()
        tenant = (event.tenant or "").encode()
        if self._deferred:  # keep the order: behind those still waiting
            self._defer([(tenant, value, now)])
            return
        self._batch.append((tenant, value, now))
        if len(self._batch) == 1:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no event loop (a tool): written at once
                self.flush()

    def flush(self) -> None:
        """Write the events recorded since the last flush, as one batch (scheduled at the
        first of them, for the end of the loop's turn; the broker's stop calls it too)."""
        events, self._batch = self._batch, []
        if not events:
            return
        if self._deferred:
            self._defer(events)
        else:
            self._write(events)

    def _write(self, events: list[_Event]) -> bool:
        """Append events as one batch; False when they were deferred (the partition is not
        claimed)."""
        try:
            partition = self._log()
            batch = encode_batch([(tenant, value) for tenant, value, _ in events],
                                 events[-1][2])
            _, durable = self.engine.appends.append(
                (self.topic, self.index), partition, batch, read_header(batch), WriteKind.AUDIT,
                what=f"an audit event to {self.topic}")
            if durable is not None:  # nobody awaits it: note a failed fsync here
                durable.add_done_callback(self._flushed)
        except _NotClaimed:
            self._defer(events)
            return False
        except KafkaApiError as error:
            if error.code == ErrorCode.NOT_LEADER_OR_FOLLOWER:  # taken while being written
                self._defer(events)
                return False
            return True  # a full disk: logged once per cause, the request goes on
        except OSError as exc:  # the audit topic could not be created (a full disk)
            self.engine.faults.failed(exc, f"an audit event to {self.topic}", WriteKind.AUDIT)
        except Exception:
            log.exception("could not write an audit event")
        return True

    def _defer(self, events: list[_Event]) -> None:
        """Keep events until this broker has claimed its audit partition."""
        room = _MAX_DEFERRED - len(self._deferred)
        if len(events) > room:
            if not self._dropped:
                log.warning("audit: %s-%d is not claimed yet; events beyond %d waiting ones "
                            "are dropped", self.topic, self.index, _MAX_DEFERRED)
            self._dropped += len(events) - max(room, 0)
            events = events[:max(room, 0)]
        self._deferred.extend(events)
        if self._deferred and self._waiting is None:
            try:
                self._waiting = asyncio.get_running_loop().create_task(self._drain())
            except RuntimeError:  # no event loop (a tool): nothing can claim it
                self._deferred.clear()

    async def _drain(self) -> None:
        """Wait for the claim of the audit partition, then write the deferred events."""
        try:
            while self._deferred:
                try:
                    await self.engine.leadership.ready([(self.topic, self.index)])
                except (KafkaApiError, StorageError, OSError) as exc:  # the database is away
                    log.debug("audit: waiting for %s-%d: %s", self.topic, self.index, exc)
                kept, self._deferred = self._deferred, []
                self._write(kept)  # deferred again (all, in order) if still not claimed
                if self._deferred:
                    await asyncio.sleep(_RETRY_S)
        finally:
            self._waiting = None
            self._dropped = 0
