"""Stock clients on three brokers sharing one PostgreSQL find a partition's new owner by
themselves: kafka-python, aiokafka and the Java client each produce and read, a broker
leading partitions is killed with kill -9 (its partitions move when its lease runs out) or
stopped with SIGTERM (it hands them over at once), and the same producer and consumer carry
on, every record read once at continuous offsets. OffsetForLeaderEpoch, which consumers
ask after a move, answers the current epoch and the log end."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol, TypeVar

import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kafka.protocol.consumer import OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse

from tests.cluster.test_cluster import PARTITIONS, create
from tests.cluster_helpers import Cluster, running_cluster
from tests.group_helpers import wait_until
from tests.groups.test_groups_clients import AioLoop
from tests.java_client import JavaFlows
from tests.raw import RawConnection

READ_TIMEOUT_S = 60.0
COUNT = PARTITIONS * 20
"""Records produced before the failover, and again after it."""
NONE = 0
NOT_LEADER_OR_FOLLOWER = 6
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75

Read = list[tuple[int, int, bytes]]
"""(partition, offset, value) of records read."""
T = TypeVar("T")


class Pair(Protocol):
    """One client's producer and consumer (assigned every partition from offset 0), kept
    across the failover."""

    def produce(self, values: list[tuple[int, bytes]]) -> None: ...

    def read(self, count: int) -> Read: ...

    def close(self) -> None: ...


class KafkaPythonPair:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                            enable_auto_commit=False,
                                            auto_offset_reset="earliest")
        partitions = [kafka.TopicPartition(topic, p) for p in range(PARTITIONS)]
        self.consumer.assign(partitions)
        self.consumer.seek_to_beginning(*partitions)

    def produce(self, values: list[tuple[int, bytes]]) -> None:
        futures = [self.producer.send(self.topic, value=value, partition=partition)
                   for partition, value in values]
        self.producer.flush(90)
        for future in futures:
            future.get(10)

    def read(self, count: int) -> Read:
        got: Read = []
        end = time.monotonic() + READ_TIMEOUT_S
        while len(got) < count and time.monotonic() < end:
            for tp, messages in self.consumer.poll(timeout_ms=200).items():
                got += [(tp.partition, m.offset, bytes(m.value)) for m in messages]
        return got

    def close(self) -> None:
        self.producer.close(10)
        self.consumer.close()


class AioKafkaPair:
    """aiokafka's producer and consumer on an AioLoop, driven from the test's thread."""

    def __init__(self, aio: AioLoop, bootstrap: str, topic: str) -> None:
        self.aio = aio
        self.topic = topic
        self.producer, self.consumer = self._call(self._start(bootstrap))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.aio.loop).result(
            READ_TIMEOUT_S + 30)

    async def _start(self, bootstrap: str) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    enable_idempotence=True)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await producer.start()
        await consumer.start()
        partitions = [AioTopicPartition(self.topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        return producer, consumer

    async def _produce(self, values: list[tuple[int, bytes]]) -> None:
        sent = [await self.producer.send(self.topic, value=value, partition=partition)
                for partition, value in values]
        await asyncio.gather(*sent)

    def produce(self, values: list[tuple[int, bytes]]) -> None:
        self._call(self._produce(values))

    async def _read(self, count: int) -> Read:
        got: Read = []
        end = time.monotonic() + READ_TIMEOUT_S
        while len(got) < count and time.monotonic() < end:
            for tp, messages in (await self.consumer.getmany(timeout_ms=200)).items():
                got += [(tp.partition, m.offset, bytes(m.value or b"")) for m in messages]
        return got

    def read(self, count: int) -> Read:
        return self._call(self._read(count))

    async def _stop(self) -> None:
        for stop in (self.producer.stop, self.consumer.stop):
            # aiokafka's stop() now and then lets the cancellation of a task of its own out
            # (after the test's checks: closing is no part of them)
            with contextlib.suppress(asyncio.CancelledError):
                await stop()

    def close(self) -> None:
        self._call(self._stop())


def values(prefix: str) -> list[tuple[int, bytes]]:
    return [(i % PARTITIONS, f"{prefix}-{i}".encode()) for i in range(COUNT)]


def fail_over(cluster: Cluster, topic: str, how: str) -> int:
    """kill -9 or SIGTERM the leader of partition 0; return its id."""
    victim = cluster.leaders(topic)[0]
    if how == "kill-9":
        cluster.by_id(victim).kill()
    else:
        assert cluster.by_id(victim).stop() == 0
    return victim


def check_read(got: Read, sent: list[tuple[int, bytes]]) -> None:
    """Every record sent was read once, in its partition, at continuous offsets."""
    assert sorted((p, v) for p, _, v in got) == sorted(sent)
    for partition in range(PARTITIONS):
        offsets = [o for p, o, _ in got if p == partition]
        assert offsets == list(range(len(offsets))), partition


HOWS = ["kill-9", "sigterm"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("client", ["kafka-python", "aiokafka"])
def test_a_python_client_carries_on_across_a_failover(tmp_path: Path, topic_name: str,
                                                      client: str, how: str) -> None:
    aio = AioLoop()
    try:
        with running_cluster(tmp_path) as cluster:
            create(cluster.bootstrap, topic_name)
            pair: Pair = (KafkaPythonPair(cluster.bootstrap, topic_name)
                          if client == "kafka-python"
                          else AioKafkaPair(aio, cluster.bootstrap, topic_name))
            try:
                pair.produce(values("before"))
                got = pair.read(COUNT)
                victim = fail_over(cluster, topic_name, how)
                pair.produce(values("after"))
                got += pair.read(COUNT)
            finally:
                pair.close()
            assert victim not in cluster.leaders(topic_name).values()
            check_read(got, values("before") + values("after"))
    finally:
        aio.close()


@pytest.fixture(scope="module")
def java(tmp_path_factory: pytest.TempPathFactory) -> JavaFlows:
    return JavaFlows.compile(Path(tmp_path_factory.mktemp("java-flows")))


@pytest.mark.parametrize("how", HOWS)
def test_the_java_client_carries_on_across_a_failover(tmp_path: Path, topic_name: str,
                                                      java: JavaFlows, how: str) -> None:
    with running_cluster(tmp_path) as cluster:
        create(cluster.bootstrap, topic_name)
        flow = java.start("failover", cluster.bootstrap, topic_name, str(PARTITIONS),
                          str(COUNT))
        try:
            assert flow.stdout is not None and flow.stdin is not None
            lines: list[list[str]] = []
            while not lines or lines[-1][0] != "ready":
                line = flow.stdout.readline()
                assert line, "the Java flow ended early"
                lines.append(line.split())
            assert lines[-1] == ["ready", str(COUNT)]
            fail_over(cluster, topic_name, how)
            flow.stdin.write("go\n")
            flow.stdin.flush()
            out, err = flow.communicate(timeout=120)
        finally:
            if flow.poll() is None:
                flow.kill()
                flow.wait(10)
        assert flow.returncode == 0, err[-4000:]
        lines += [line.split() for line in out.splitlines() if line.strip()]
        assert lines[-1] == ["read", str(COUNT)], err[-4000:]
        got = [(int(p), int(o), v.encode()) for _, v, p, o in
               (line for line in lines if line[0] == "consumed")]
        check_read(got, values("before") + values("after"))


def end_of_epoch(port: int, topic: str, partition: int, current: int, version: int = 4
                 ) -> tuple[int, int, int]:
    """(error, leader epoch, end offset) of an OffsetForLeaderEpoch for ``partition``."""
    conn = RawConnection(port)
    try:
        part = OffsetForLeaderEpochRequest.OffsetForLeaderTopic.OffsetForLeaderPartition(
            partition=partition, current_leader_epoch=current, leader_epoch=0)
        answer = conn.call(OffsetForLeaderEpochRequest[version](
            replica_id=-1, topics=[OffsetForLeaderEpochRequest.OffsetForLeaderTopic(
                topic=topic, partitions=[part])]), version, OffsetForLeaderEpochResponse)
    finally:
        conn.close()
    (found,) = answer.topics[0].partitions
    return int(found.error_code), int(found.leader_epoch), int(found.end_offset)


def test_offset_for_leader_epoch_answers_the_current_epoch_and_the_log_end(
        tmp_path: Path, topic_name: str) -> None:
    with running_cluster(tmp_path) as cluster:
        create(cluster.bootstrap, topic_name)
        pair = KafkaPythonPair(cluster.bootstrap, topic_name)
        try:
            pair.produce(values("v"))
        finally:
            pair.close()
        leader_id = cluster.leaders(topic_name)[0]
        leader = cluster.by_id(leader_id)
        other = next(b for b in cluster.brokers if b is not leader)
        for version in (2, 3, 4):
            error, epoch, end = end_of_epoch(leader.port, topic_name, 0, -1, version)
            assert (error, end) == (NONE, COUNT // PARTITIONS) and epoch >= 1
        assert end_of_epoch(leader.port, topic_name, 0, epoch)[0] == NONE
        assert end_of_epoch(leader.port, topic_name, 0, epoch - 1)[0] == FENCED_LEADER_EPOCH
        assert end_of_epoch(leader.port, topic_name, 0, epoch + 1)[0] == UNKNOWN_LEADER_EPOCH
        assert end_of_epoch(other.port, topic_name, 0, -1)[0] == NOT_LEADER_OR_FOLLOWER
        assert leader.stop() == 0  # hands partition 0 over at a higher epoch
        # every broker learns the move from the database on its own, a moment apart; the new
        # owner claims the partition in the background and answers the retriable
        # NOT_LEADER_OR_FOLLOWER until then: a client asks again, as this does
        answers: list[tuple[int, int, int]] = []

        def served() -> bool:
            agreed = cluster.agreed_leaders(topic_name)
            if agreed is None or agreed[0] == leader_id:
                return False
            answers[:] = [end_of_epoch(cluster.by_id(agreed[0]).port, topic_name, 0, -1)]
            return answers[0][0] == NONE

        wait_until(served, 30, "the new owner to serve partition 0")
        error, moved, end = answers[0]
        assert (error, end) == (NONE, COUNT // PARTITIONS) and moved > epoch
