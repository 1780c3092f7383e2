"""Acceptance 3 (groups): kafka-python and aiokafka consumer groups. A second member joining
takes over half of the partitions from where the first committed; members commit after
each batch; after they close, a new member resumes from the committed offsets."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

import aiokafka
import kafka
import pytest
from aiokafka.errors import KafkaError as AioKafkaError
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.group_helpers import (
    GroupLedger,
    balanced,
    group_id_for,
    positions,
    produce_values,
    start_broker,
    wait_until,
)

PARTITIONS = 4
STEP = 250  # records per partition per phase


class Member(Protocol):
    name: str
    error: BaseException | None

    def stop(self) -> None: ...


@pytest.fixture(scope="module")
def kbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = start_broker(Path(tmp_path_factory.mktemp("groups-clients")))
    yield process
    process.stop()


class Commits:
    """A member's commits as the ledger sees them; failed positions are retried when idle."""

    name: str
    ledger: GroupLedger
    retry: dict[int, int]

    def committed(self, records: list[tuple[int, int]], done: dict[int, int],
                  error: str) -> None:
        """``records`` were processed and ``done`` committed, with ``error`` ("" if none)."""
        if error:
            self.retry.update(done)
        else:
            for p in done:
                self.retry.pop(p, None)
        self.ledger.processed(self.name, records, error == "", error)

    def recommitted(self) -> None:
        """The positions to retry are committed now."""
        self.ledger.recommitted(self.name, self.retry)
        self.retry = {}


# -- kafka-python: one thread per member ---------------------------------------------------

class KafkaPythonMember(Commits):
    """A kafka-python group member polling in its own thread."""

    def __init__(self, name: str, bootstrap: str, group: str, topic: str,
                 ledger: GroupLedger, instance: str | None = None) -> None:
        self.name, self.bootstrap, self.group, self.topic = name, bootstrap, group, topic
        self.ledger = ledger
        self.instance = instance
        self.consumer: kafka.KafkaConsumer | None = None
        self.error: BaseException | None = None
        self.poll_errors: list[str] = []
        """Retriable errors ``poll`` raised (and the member polled again)."""
        self.retry: dict[int, int] = {}  # failed commit positions, retried when idle
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def _run(self) -> None:
        member = self

        class Listener(kafka.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: list[kafka.TopicPartition]) -> None:
                for tp in revoked:
                    member.retry.pop(tp.partition, None)
                member.ledger.revoked(member.name, [tp.partition for tp in revoked])

            def on_partitions_assigned(self, assigned: list[kafka.TopicPartition]) -> None:
                member.ledger.assigned(member.name, [tp.partition for tp in assigned])

        try:
            consumer = kafka.KafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
                enable_auto_commit=False, auto_offset_reset="earliest",
                session_timeout_ms=6000 if self.instance is None else 60_000,
                heartbeat_interval_ms=250, group_instance_id=self.instance,
                max_poll_interval_ms=30000, max_poll_records=100)
            self.consumer = consumer
            consumer.subscribe([self.topic], listener=Listener())
            try:
                while not self._stop.is_set():
                    # kafka-python 3 raises a broker it cannot reach (one just killed)
                    # from poll: an application polls again
                    try:
                        batch = consumer.poll(timeout_ms=100)
                    except KafkaError as exc:
                        if not exc.retriable:
                            raise
                        self.poll_errors.append(repr(exc))
                        self._stop.wait(0.1)  # not a busy loop while it is refused
                        continue
                    records = [self.ledger.read(self.name, tp.partition, msg.offset, msg.value)
                               for tp, msgs in batch.items() for msg in msgs]
                    if not records:
                        if self.retry and self._commit(consumer, self.retry) == "":
                            self.recommitted()
                        continue
                    done = positions(records)
                    self.committed(records, done, self._commit(consumer, done))
            finally:
                self.ledger.leaving(self.name)
                consumer.close(autocommit=False)
        except BaseException as exc:
            self.error = exc

    def _commit(self, consumer: kafka.KafkaConsumer, offsets: dict[int, int]) -> str:
        try:
            consumer.commit({kafka.TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1)
                             for p, o in offsets.items()})
        except KafkaError as exc:
            return repr(exc)
        return ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"{self.name} did not stop"

    def leads(self) -> bool:
        """Whether the member made the group's last assignment (the client's own flag)."""
        consumer = self.consumer
        return consumer is not None and bool(consumer._coordinator._is_leader)


# -- aiokafka: one task per member on a loop in a background thread --------------------------

class AioLoop:
    """An asyncio loop running in a thread, for aiokafka members."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class AioKafkaMember(Commits):
    """An aiokafka group member running as a task on an AioLoop."""

    def __init__(self, aio: AioLoop, name: str, bootstrap: str, group: str, topic: str,
                 ledger: GroupLedger) -> None:
        self.name, self.bootstrap, self.group, self.topic = name, bootstrap, group, topic
        self.ledger = ledger
        self.error: BaseException | None = None
        self.retry: dict[int, int] = {}  # failed commit positions, retried when idle
        self._stop = threading.Event()
        self._future = asyncio.run_coroutine_threadsafe(self._run(), aio.loop)

    async def _run(self) -> None:
        member = self

        class Listener(aiokafka.ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked: list[aiokafka.TopicPartition]
                                            ) -> None:
                for tp in revoked:
                    member.retry.pop(tp.partition, None)
                member.ledger.revoked(member.name, [tp.partition for tp in revoked])

            async def on_partitions_assigned(self, assigned: list[aiokafka.TopicPartition]
                                             ) -> None:
                member.ledger.assigned(member.name, [tp.partition for tp in assigned])

        try:
            consumer = aiokafka.AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=self.group, client_id=self.name,
                enable_auto_commit=False, auto_offset_reset="earliest",
                session_timeout_ms=6000, heartbeat_interval_ms=250,
                max_poll_interval_ms=30000)
            consumer.subscribe([self.topic], listener=Listener())
            await consumer.start()
            try:
                while not self._stop.is_set():
                    batch = await consumer.getmany(timeout_ms=100, max_records=100)
                    records = [self.ledger.read(self.name, tp.partition, msg.offset, msg.value)
                               for tp, msgs in batch.items() for msg in msgs]
                    if not records:
                        if self.retry and await self._commit(consumer, self.retry) == "":
                            self.recommitted()
                        continue
                    done = positions(records)
                    self.committed(records, done, await self._commit(consumer, done))
            finally:
                self.ledger.leaving(self.name)
                # aiokafka's stop() can let the CancelledError of its own cancelled
                # background task escape (a client quirk at teardown, after every check)
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer.stop()
        except BaseException as exc:
            self.error = exc

    async def _commit(self, consumer: aiokafka.AIOKafkaConsumer, offsets: dict[int, int]
                      ) -> str:
        try:
            await consumer.commit({aiokafka.TopicPartition(self.topic, p): o
                                   for p, o in offsets.items()})
        except AioKafkaError as exc:
            return repr(exc)
        return ""

    def stop(self) -> None:
        self._stop.set()
        self._future.result(30)


# -- the scenario, the same for both clients ---------------------------------------------------

def records(start: int, stop: int) -> set[tuple[int, int]]:
    return {(p, o) for p in range(PARTITIONS) for o in range(start, stop)}


def run_scenario(bootstrap: str, topic: str,
                 new_member: Callable[[str, GroupLedger], Member]) -> None:
    create_topic(bootstrap, topic, PARTITIONS)
    ledger = GroupLedger()
    members: list[Member] = []

    def healthy() -> None:
        for m in members:
            assert m.error is None, f"{m.name}: {m.error!r}"

    def until(condition: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            healthy()
            return condition()
        wait_until(check, 60, what)

    try:
        # One member: it owns everything and commits phase 1.
        members.append(new_member("a", ledger))
        until(balanced(ledger, ["a"], PARTITIONS), "a to own every partition")
        produce_values(bootstrap, topic, range(PARTITIONS), 0, STEP)
        until(ledger.all_committed(PARTITIONS, STEP), "phase 1 committed")

        # A second member joins and takes over half of the partitions where a committed.
        join_mark = ledger.mark()
        members.append(new_member("b", ledger))
        until(balanced(ledger, ["a", "b"], PARTITIONS), "a and b to own two each")
        owned_b = ledger.ownership()["b"]
        assert len(owned_b) == PARTITIONS // 2
        produce_values(bootstrap, topic, range(PARTITIONS), STEP, 2 * STEP)
        until(ledger.all_committed(PARTITIONS, 2 * STEP), "phase 2 committed")
        for p in owned_b:
            assert ledger.first_after(p, join_mark) == ("b", STEP), p
        assert ledger.count_by("b") >= len(owned_b) * STEP

        # Both close; more records come; a new member resumes from the committed offsets.
        for m in members:
            m.stop()
        healthy()
        members.clear()
        close_mark = ledger.mark()
        produce_values(bootstrap, topic, range(PARTITIONS), 2 * STEP, 3 * STEP)
        members.append(new_member("c", ledger))
        until(ledger.all_committed(PARTITIONS, 3 * STEP), "phase 3 committed by the new member")
        for p in range(PARTITIONS):
            assert ledger.first_after(p, close_mark) == ("c", 2 * STEP), p
        with ledger.lock:
            after_close = [r for b in ledger.batches if b.seq > close_mark for r in b.records]
        assert sorted(after_close) == sorted(records(2 * STEP, 3 * STEP))
        ledger.check_delivery(records(0, 3 * STEP))
    finally:
        for m in members:
            m.stop()
    healthy()


def test_kafka_python_group_rebalances_and_resumes(kbroker: BrokerProcess,
                                                   topic_name: str) -> None:
    group = group_id_for(topic_name)
    run_scenario(kbroker.bootstrap, topic_name, lambda name, ledger: KafkaPythonMember(
        name, kbroker.bootstrap, group, topic_name, ledger))


def test_aiokafka_group_rebalances_and_resumes(kbroker: BrokerProcess,
                                               topic_name: str) -> None:
    group = group_id_for(topic_name)
    aio = AioLoop()
    try:
        run_scenario(kbroker.bootstrap, topic_name, lambda name, ledger: AioKafkaMember(
            aio, name, kbroker.bootstrap, group, topic_name, ledger))
    finally:
        aio.close()


def test_kafka_python_static_leader_restarts_without_a_rebalance(kbroker: BrokerProcess,
                                                                 topic_name: str) -> None:
    # KIP-345: a static leader restarting with its group.instance.id gets its partitions
    # back and the other member keeps its own, untouched. kafka-python joins below v9, so
    # (as Kafka) the broker answers it as a follower: told it leads, with the member list
    # but no way to skip the assignment, it would force a full rebalance.
    create_topic(kbroker.bootstrap, topic_name, PARTITIONS)
    group = group_id_for(topic_name)
    ledger = GroupLedger()
    members = [KafkaPythonMember(name, kbroker.bootstrap, group, topic_name, ledger,
                                 instance=f"instance-{name}") for name in ("ka", "kb")]
    try:
        wait_until(balanced(ledger, ["ka", "kb"], PARTITIONS), 90, "both members assigned")
        wait_until(lambda: any(m.leads() for m in members), 30, "a leader")
        leader, follower = members if members[0].leads() else members[::-1]
        owned = ledger.ownership()
        mark = ledger.mark()
        leader.stop()  # a static member sends no LeaveGroup
        again = KafkaPythonMember(leader.name + "-again", kbroker.bootstrap, group,
                                  topic_name, ledger, instance=leader.instance)
        members.append(again)
        wait_until(lambda: ledger.ownership().get(again.name) == owned[leader.name], 90,
                   "the restarted leader's partitions back")
        # answered as a follower: it did not make an assignment (told it leads, it would
        # have, and then forced a rebalance that revokes the follower's partitions)
        assert not again.leads()
        assert ledger.violations == []
        assert [e for e in ledger.events if e[0] > mark and e[1] == follower.name] == []
        assert ledger.ownership()[follower.name] == owned[follower.name]
        assert all(m.error is None for m in members), [m.error for m in members]
    finally:
        for member in members:
            member.stop()
