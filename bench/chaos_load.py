"""The load of a chaos run, stock confluent-kafka clients in threads, each recording what
the brokers told it (times on the run's clock):

- :class:`IdempotentLoad`: an idempotent ``acks=all`` producer writing payload ids
  ``i<n>`` round-robin over the input topic; every acknowledged (partition, offset, id);
- :class:`TransformLoad`: consume-transform-produce, read_committed, from the input topic
  to the output topic, one transaction per polled batch with its input offsets sent by
  ``send_offsets_to_transaction``; output value ``<partition>:<offset>:<id>`` of its input
  record, same partition. On an error it aborts (or starts a new producer when the error
  is fatal) and rejoins from the committed offsets, as an application does;
- :class:`GroupLoad`: two members of a consumer group on the input topic, committing their
  positions every second; every acknowledged commit;
- :class:`OffsetWatch`: the committed offsets of both groups, sampled every second.
"""

from __future__ import annotations

import functools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from bench.chaos_probe import transaction_state

INPUT_GROUP = "chaos-group"
TRANSFORM_GROUP = "chaos-transform"
TRANSACTIONAL_ID = "chaos-transform"
TRANSACTION_TIMEOUT_MS = 10_000
_CALL_S = 30.0
SLOW_CALL_S = 60.0
"""A transactional call (retries included) taking longer has the brokers' view of the
transaction noted, and again every ``SLOW_CALL_S`` while it lasts."""


@dataclass(frozen=True)
class Clock:
    """The run's clock: seconds since ``t0``."""

    t0: float

    def now(self) -> float:
        return time.monotonic() - self.t0


@dataclass(frozen=True)
class Acked:
    """A record the producer was told is stored."""

    partition: int
    offset: int
    """Where; -1 when the report named no offset (:data:`UNKNOWN_OFFSET`)."""
    payload: str
    at: float


UNKNOWN_OFFSET = -1
"""The offset of a record librdkafka reported delivered without one: a batch whose request
failed with its outcome unknown (a broker killed with it in flight) is acknowledged
"implicitly" once a later batch of the partition succeeds (the idempotent producer's
sequence numbers prove it stored), and its records' reports carry no offset."""


class LoadThread(threading.Thread, ABC):
    """A load in a thread; an exception that ends it is kept for the summary."""

    def __init__(self, name: str, clock: Clock) -> None:
        super().__init__(name=name, daemon=True)
        self.clock = clock
        self.halt = threading.Event()
        """Set by the run: the load ends (a producer after flushing what it sent)."""
        self.crashed: BaseException | None = None
        self.notes: list[str] = []
        """Client errors (bounded), for the summary: not violations by themselves."""
        self.error_count = 0
        self.journal: Path | None = None
        """Where every note is appended too, unbounded (the run sets it)."""

    def note(self, what: str) -> None:
        self.error_count += 1
        line = f"{self.clock.now():.1f} s: {what}"
        if len(self.notes) < 50:
            self.notes.append(line)
        if self.journal is not None:
            with self.journal.open("a", encoding="utf-8") as out:
                out.write(line + "\n")

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # reported, the run goes on
            self.crashed = exc

    @abstractmethod
    def work(self) -> None:
        """The load itself, until :attr:`halt` is set: each kind of load defines it."""


class IdempotentLoad(LoadThread):
    """Produce ``rate`` records/s to ``topic`` until stopped, then flush."""

    def __init__(self, clock: Clock, bootstrap: str, topic: str, partitions: int,
                 rate: int) -> None:
        super().__init__("chaos-idempotent", clock)
        self.bootstrap, self.topic, self.partitions, self.rate = (bootstrap, topic,
                                                                  partitions, rate)
        self.acked: list[Acked] = []
        self.failed: dict[str, str] = {}
        """Payload ids whose delivery failed (in doubt: stored at most once)."""
        self.sent = 0
        self.producers = 0
        self._fatal: KafkaError | None = None

    def _producer(self) -> Producer:
        self.producers += 1
        self._fatal = None
        return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 180_000,
                         "client.id": f"chaos-idempotent-{self.producers}",
                         "error_cb": self._client_error})

    def _client_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        payload = (msg.value() or b"").decode()
        if err is not None:
            self.failed[payload] = str(err)
            self.note(f"delivery of {payload} failed: {err}")
            return
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None
        self.acked.append(Acked(partition, UNKNOWN_OFFSET if offset is None else offset,
                                payload, self.clock.now()))

    def work(self) -> None:
        producer = self._producer()
        tick = 0.05
        per_tick = max(1, round(self.rate * tick))
        next_tick = time.monotonic()
        while not self.halt.is_set():
            next_tick += tick
            for _ in range(per_tick):
                payload = f"i{self.sent}"
                try:
                    producer.produce(self.topic, payload.encode(),
                                     partition=self.sent % self.partitions,
                                     on_delivery=self._delivered)
                except BufferError:
                    break
                self.sent += 1
            producer.poll(0)
            while (left := next_tick - time.monotonic()) > 0:
                producer.poll(left)
            if self._fatal is not None:  # the producer is done for: a new one, as an app would
                self.note(f"fatal producer error: {self._fatal}")
                producer.flush(5)
                producer = self._producer()
        left = producer.flush(240)
        if left:
            self.note(f"{left} records unanswered at the end")


def _error(exc: KafkaException) -> KafkaError:
    error = exc.args[0]
    assert isinstance(error, KafkaError)
    return error


@dataclass(frozen=True)
class Committed:
    """A transaction the coordinator said it committed: its input offsets."""

    ends: dict[int, int]
    records: int
    at: float


IDLE_CLOSE_MS = 5000
"""The transactional producer closes a connection idle this long: librdkafka (2.16 at
least) can wait for ever in ``send_offsets_to_transaction``, whatever its timeout, when
the group coordinator it cached is a broker it dropped (a broker that Metadata stopped
listing, as every broker's does once a dead broker's session lapsed): it waits for that
handle to come up, which never happens, and looks the coordinator up again only when some
other broker of the client changes state (confluentinc/librdkafka#5511; the timeout it
ignores: #5456). A connection closed for idleness is such a change."""


def transactional_producer(bootstrap: str, client_id: str, debug: str = "",
                           timeout_ms: int = TRANSACTION_TIMEOUT_MS) -> Producer:
    """The transform's transactional producer, with ``debug`` contexts of librdkafka (its
    lines on stderr) if any and transactions that time out after ``timeout_ms``.
    Connections idle :data:`IDLE_CLOSE_MS` are closed."""
    settings: dict[str, str | int] = {
        "bootstrap.servers": bootstrap, "transactional.id": TRANSACTIONAL_ID,
        "linger.ms": 5, "transaction.timeout.ms": timeout_ms,
        "connections.max.idle.ms": IDLE_CLOSE_MS, "client.id": client_id}
    if debug:
        settings["debug"] = debug
    return Producer(settings)


class TransformLoad(LoadThread):
    """Consume-transform-produce from ``source`` to ``sink`` until stopped, exactly once."""

    def __init__(self, clock: Clock, bootstrap: str, source: str, sink: str,
                 batch: int = 200, ports: Sequence[int] = (), debug: str = "") -> None:
        super().__init__("chaos-transform", clock)
        self.bootstrap, self.source, self.sink, self.batch = bootstrap, source, sink, batch
        self.ports = tuple(ports)
        """The brokers asked about a slow call's transaction (none: not asked)."""
        self.debug = debug
        """librdkafka ``debug`` contexts of the transactional producer (its lines go to
        stderr)."""
        self._calling: tuple[str, float] | None = None
        """The transactional call under way and when it began (monotonic)."""
        self.commits: list[Committed] = []
        self.aborts = 0
        self.producers = 0
        self.rejoins = 0
        self._revoked = False
        self.draining = threading.Event()
        """Set by :meth:`drain` once the input stopped: stop when it is all transformed."""
        self.drain_ends: dict[int, int] = {}
        """The input's end offsets by partition, once it stopped (:meth:`drain`)."""
        self.caught_up = False

    def drain(self, ends: dict[int, int]) -> None:
        """The input stopped at ``ends`` (partition -> end offset): stop once transactions
        committed the input's offsets up to there. (Counting partitions at their end from
        the consumer's end-of-partition events stopped early: an event from before the
        last records came in still counted.)"""
        self.drain_ends = dict(ends)
        self.draining.set()

    def _producer(self) -> Producer:
        """A new transactional producer, initialised (fencing the one before): tried
        again until it works, as an application restarting would."""
        while True:
            self.producers += 1
            producer = transactional_producer(self.bootstrap,
                                              f"chaos-transform-{self.producers}", self.debug)
            try:
                self._call(functools.partial(producer.init_transactions, _CALL_S))
                return producer
            except KafkaException as exc:
                self.note(f"init_transactions: {_error(exc)}")

    def _consumer(self) -> Consumer:
        self.rejoins += 1
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": TRANSFORM_GROUP,
                             "isolation.level": "read_committed",
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                             "client.id": f"chaos-transform-{self.rejoins}"})

        def revoked(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
            self._revoked = True

        consumer.subscribe([self.source], on_revoke=revoked, on_lost=revoked)
        return consumer

    def _call(self, call: functools.partial[None]) -> None:
        """:func:`_retrying` ``call``, watched (:meth:`_watch`)."""
        self._calling = (call.func.__name__, time.monotonic())
        try:
            _retrying(call, self.note)
        finally:
            self._calling = None

    def _watch(self) -> None:
        """Note the brokers' view of the transaction while a call lasts past
        :data:`SLOW_CALL_S` (then every :data:`SLOW_CALL_S`)."""
        reported: tuple[str, float] | None = None
        last = 0.0
        while not self.halt.wait(2.0):
            calling = self._calling
            if calling is None or not self.ports:
                continue
            name, began = calling
            now = time.monotonic()
            if now - began < SLOW_CALL_S or (reported == calling and now - last < SLOW_CALL_S):
                continue
            reported, last = calling, now
            self.note(f"{name} running for {now - began:.0f} s; brokers: "
                      f"{transaction_state(self.ports, TRANSACTIONAL_ID, TRANSFORM_GROUP)}")

    def work(self) -> None:
        threading.Thread(target=self._watch, name="chaos-transform-watch", daemon=True).start()
        producer = self._producer()
        consumer = self._consumer()
        expected: dict[int, int] = {}  # where this consumer's next records must start
        committed: dict[int, int] = {}  # the input offsets committed so far, by partition
        while not self.halt.is_set():
            if self.draining.is_set() and all(committed.get(p, 0) >= end
                                              for p, end in self.drain_ends.items()):
                self.caught_up = True
                break
            polled = consumer.consume(self.batch, 0.5)
            msgs = []
            for msg in polled:
                error = msg.error()
                if error is None:
                    msgs.append(msg)
                else:
                    self.note(f"consumer: {error}")
            if not msgs:
                continue
            ok = not self._revoked and all(
                int(m.offset() or 0) >= expected.get(int(m.partition() or 0), 0) for m in msgs)
            if ok:
                try:
                    ends = self._transact(producer, consumer, msgs)
                    expected.update(ends)
                    committed.update({p: max(end, committed.get(p, 0))
                                      for p, end in ends.items()})
                    self.commits.append(Committed(ends, len(msgs), self.clock.now()))
                    continue
                except KafkaException as exc:
                    error = _error(exc)
                    self.note(f"transaction: {error}")
                    if error.fatal():
                        producer = self._producer()  # fences the old one, ends its transaction
                    else:
                        try:
                            self._call(functools.partial(producer.abort_transaction,
                                                         _CALL_S))
                            self.aborts += 1
                        except KafkaException as again:
                            self.note(f"abort: {_error(again)}")
                            producer = self._producer()
            # a rebalance, a rewind or a failed transaction: start again from the committed
            # offsets, with a consumer of the group's next generation
            consumer.close()
            self._revoked = False
            expected = {}
            consumer = self._consumer()
        consumer.close()

    def _transact(self, producer: Producer, consumer: Consumer,
                  msgs: list[Message]) -> dict[int, int]:
        producer.begin_transaction()
        ends: dict[int, int] = {}
        for msg in msgs:
            partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
            value = f"{partition}:{offset}:{(msg.value() or b'').decode()}".encode()
            producer.produce(self.sink, value, partition=partition)
            ends[partition] = offset + 1
        offsets = [TopicPartition(self.source, p, end) for p, end in sorted(ends.items())]
        self._call(functools.partial(producer.send_offsets_to_transaction, offsets,
                                     consumer.consumer_group_metadata(), _CALL_S))
        self._call(functools.partial(producer.commit_transaction, _CALL_S))
        return ends


def _retrying(call: functools.partial[None], note: Callable[[str], None],
              attempts: int = 10) -> None:
    """``call()``, again while it fails with a retriable error (as librdkafka asks); each
    failure noted."""
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as exc:
            note(f"{call.func.__name__}: {_error(exc)}")
            if not _error(exc).retriable() or attempt == attempts - 1:
                raise


@dataclass(frozen=True)
class GroupCommit:
    """An offset commit the coordinator acknowledged."""

    member: int
    offsets: dict[int, int]
    at: float


class GroupLoad(LoadThread):
    """Member ``member`` of the group on ``topic``: reads, commits every second."""

    def __init__(self, clock: Clock, bootstrap: str, topic: str, member: int,
                 commits: list[GroupCommit]) -> None:
        super().__init__(f"chaos-group-{member}", clock)
        self.bootstrap, self.topic, self.member = bootstrap, topic, member
        self.commits = commits
        self.read = 0

    def work(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": INPUT_GROUP,
                             "enable.auto.commit": False, "auto.offset.reset": "earliest",
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                             "client.id": f"chaos-group-{self.member}"})
        consumer.subscribe([self.topic])
        last_commit = time.monotonic()
        try:
            while not self.halt.is_set():
                for msg in consumer.consume(500, 0.2):
                    if msg.error() is None:
                        self.read += 1
                if time.monotonic() - last_commit >= 1.0:
                    last_commit = time.monotonic()
                    self._commit(consumer)
            self._commit(consumer)
        finally:
            consumer.close()

    def _commit(self, consumer: Consumer) -> None:
        try:
            done = consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if _error(exc).code() != KafkaError._NO_OFFSET:
                self.note(f"commit: {_error(exc)}")
            return
        if done:
            offsets = {int(tp.partition): int(tp.offset) for tp in done
                       if tp.error is None and tp.offset >= 0}
            if offsets:
                self.commits.append(GroupCommit(self.member, offsets, self.clock.now()))


@dataclass(frozen=True)
class Sample:
    """A group's committed offsets as OffsetFetch told them at ``at``."""

    group: str
    offsets: dict[int, int]
    at: float


class OffsetReader:
    """The committed offsets of ``group``, read by OffsetFetch through a consumer of the
    group that never joins it. (AdminClient.list_consumer_group_offsets of librdkafka
    2.16 crashed the process with a segmentation fault in ``rd_kafka_cgrp_op`` under
    ``rd_kafka_handle_OffsetFetch``, an admin client having no group handle, when a
    coordinator moved during the chaos.)"""

    def __init__(self, bootstrap: str, group: str, stable: bool = True) -> None:
        self.group = group
        # read_committed asks for stable offsets: UNSTABLE_OFFSET_COMMIT (retried) while a
        # transaction's offsets are pending
        isolation = "read_committed" if stable else "read_uncommitted"
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                   "enable.auto.commit": False, "isolation.level": isolation,
                                   "client.id": f"chaos-offsets-{group}"})

    def read(self, topic: str, partitions: int, timeout: float = 15.0) -> dict[int, int]:
        """partition -> committed offset on ``topic`` (partitions without one left out)."""
        found = self._consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                         timeout)
        return {int(tp.partition): int(tp.offset) for tp in found
                if tp.error is None and tp.offset >= 0}

    def close(self) -> None:
        self._consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int,
                      stable: bool = True) -> dict[int, int]:
    """partition -> committed offset of ``group`` on ``topic``, read once (``stable``:
    as a read_committed member reads them; KafkaException while they are not)."""
    reader = OffsetReader(bootstrap, group, stable)
    try:
        return reader.read(topic, partitions, 60.0)
    finally:
        reader.close()


class OffsetWatch(LoadThread):
    """Samples the committed offsets of ``groups`` on ``topic`` every second."""

    def __init__(self, clock: Clock, bootstrap: str, topic: str, partitions: int,
                 groups: tuple[str, ...]) -> None:
        super().__init__("chaos-offsets", clock)
        self.bootstrap, self.topic, self.partitions, self.groups = (bootstrap, topic,
                                                                    partitions, groups)
        self.samples: list[Sample] = []

    def work(self) -> None:
        readers = [OffsetReader(self.bootstrap, group) for group in self.groups]
        try:
            while not self.halt.wait(1.0):
                for reader in readers:
                    try:
                        offsets = reader.read(self.topic, self.partitions)
                    except KafkaException as exc:  # a fault under way: the next sample
                        self.note(f"offsets of {reader.group}: {exc}")
                        continue
                    self.samples.append(Sample(reader.group, offsets, self.clock.now()))
        finally:
            for reader in readers:
                reader.close()
