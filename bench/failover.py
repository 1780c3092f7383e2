"""Failover: how long the partitions of a broker killed with ``kill -9`` stay without an
owner that acknowledges a produce.

A cluster of ``failover_brokers`` brokers on one PostgreSQL, a topic spread over all of
them. Each round a producer (confluent-kafka, the benchmark's acks and linger) writes to
every partition and waits for every acknowledgement, so nothing is in flight; then the
owner of some partitions (broker ``round % brokers``) gets SIGKILL, and from that moment the
producer sends one record to each of the victim's partitions every 50 ms, librdkafka
retrying each as it does. The round's time is from the kill to the first acknowledgement
on one of those partitions (``first_ack_s``; the last of them, ``all_acked_s``, beside it):
only a new owner can acknowledge them (a round starts only once every partition is with
the broker it belongs to, no hand-over under way). Beside it, ``leader_moved_s``: when the
surviving brokers' Metadata first named one of them as the leader of such a partition,
the cluster's part of that time; the rest is the producer finding out. Then the victim
starts again with the same ``brokerId`` (``restart_s``), for the next round.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient

from bench.admin import create_topic
from bench.cluster import BrokerGroup
from bench.options import Options
from bench.pinning import CpuPlan
from bench.runner import LoadError
from bench.stats import percentile

if TYPE_CHECKING:
    from tests.postgres_server import PostgresServer

_RESEND_S = 0.05
_WAIT_S = 120.0


class FirstAcks:
    """Delivery reports: the first acknowledgement time of each partition, errors counted."""

    def __init__(self) -> None:
        self.acked: dict[int, float] = {}
        self.errors = 0
        self.first_error = ""
        self.closed = False  # reports after the measurement are not counted

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if self.closed:
            return
        if err is not None:
            self.errors += 1
            self.first_error = self.first_error or str(err)
            return
        partition = msg.partition()
        if partition is not None:
            self.acked.setdefault(partition, time.monotonic())


def _producer(opts: Options, group: BrokerGroup) -> Producer:
    return Producer({"bootstrap.servers": group.bootstrap, "acks": opts.acks,
                     "linger.ms": opts.linger_ms, "client.id": "bench-failover"})


def _write_everywhere(producer: Producer, topic: str, partitions: list[int]) -> None:
    """One record to each partition, every one acknowledged."""
    acks = FirstAcks()
    for partition in partitions:
        producer.produce(topic, b"before", partition=partition, on_delivery=acks)
    producer.flush(_WAIT_S)
    if sorted(acks.acked) != sorted(partitions):
        raise LoadError(f"failover: before the kill only partitions {sorted(acks.acked)} of "
                        f"{partitions} acknowledged ({acks.first_error})")


class LeaderWatch:
    """Metadata from the surviving brokers: when it first names one of them as the leader
    of a partition the victim led (the cluster's side of the failover, without the
    producer's own rediscovery)."""

    def __init__(self, group: BrokerGroup, victim_id: int, topic: str,
                 partitions: list[int]) -> None:
        survivors = [m.bootstrap for i, m in enumerate(group.members) if i != victim_id]
        self._admin = AdminClient({"bootstrap.servers": ",".join(survivors),
                                   "client.id": "bench-failover-watch"})
        self._victim, self._topic, self._partitions = victim_id, topic, partitions
        self.moved_at: float | None = None
        self._admin.list_topics(topic, timeout=10)  # connected before the clock starts

    def look(self) -> None:
        """Ask once (until a move was seen)."""
        if self.moved_at is not None:
            return
        try:
            found = self._admin.list_topics(self._topic, timeout=1).topics[self._topic]
        except Exception:  # no answer this time: ask again next time
            return
        if any(found.partitions[p].leader not in (self._victim, -1) for p in self._partitions):
            self.moved_at = time.monotonic()


def kill_one(opts: Options, cpus: CpuPlan, group: BrokerGroup, topic: str,
             victim_id: int, restart: bool = True) -> dict[str, Any]:
    """One round: kill -9 broker ``victim_id``, time the first acknowledgement on its
    partitions, start it again (unless ``restart`` is False: the last round, whose cluster
    stops next; its ``restart_s`` is then None)."""
    group.wait_for_members()
    leaders = group.wait_settled(topic)
    theirs = sorted(p for p, leader in leaders.items() if leader == victim_id)
    producer = _producer(opts, group)
    _write_everywhere(producer, topic, sorted(leaders))
    victim = group.members[victim_id]
    acks = FirstAcks()
    watch = LeaderWatch(group, victim_id, topic, theirs)
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    while (len(acks.acked) < len(theirs) or watch.moved_at is None) \
            and time.monotonic() - killed_at < _WAIT_S:
        for partition in theirs:
            if partition not in acks.acked:
                producer.produce(topic, b"after", partition=partition, on_delivery=acks)
        watch.look()
        producer.poll(_RESEND_S)
    acks.closed = True
    producer.flush(10)  # the records still in flight, then whatever is left is dropped
    producer.purge()
    producer.flush(1)
    if len(acks.acked) < len(theirs):
        raise LoadError(f"failover: partitions {theirs} of broker {victim_id} not all "
                        f"acknowledged {_WAIT_S:g} s after the kill ({acks.first_error})")
    victim.stop()  # reaps it and removes its data directory
    restart_s = None
    if restart:
        restarted_at = time.monotonic()
        group.members[victim_id] = victim = group.member(victim_id)
        victim.start(cpus.broker)
        restart_s = time.monotonic() - restarted_at
    return {"victim": victim_id, "partitions": theirs,
            "first_ack_s": min(acks.acked.values()) - killed_at,
            "all_acked_s": max(acks.acked.values()) - killed_at,
            "leader_moved_s": None if watch.moved_at is None else watch.moved_at - killed_at,
            "errors": acks.errors, "first_error": acks.first_error,
            "restart_s": restart_s}


def failover(opts: Options, cpus: CpuPlan, server: PostgresServer,
             settings: dict[str, str]) -> dict[str, Any]:
    """``opts.cluster.kills`` rounds on a cluster with membership ``settings`` (empty: the
    defaults): p50 and max of the time to the first acknowledgement."""
    copts = opts.cluster
    group = BrokerGroup(server.new_database_url(), copts.failover_brokers, settings)
    rounds: list[dict[str, Any]] = []
    try:
        group.start(cpus.broker)
        topic = "bench-failover"
        create_topic(group.bootstrap, topic, copts.failover_partitions)
        for kill in range(copts.kills):
            victim = kill % copts.failover_brokers
            print(f"[bench] failover ({group.version()}): kill -9 of broker {victim}, "
                  f"{kill + 1}/{copts.kills}", file=sys.stderr, flush=True)
            rounds.append(kill_one(opts, cpus, group, topic, victim,
                                   restart=kill + 1 < copts.kills))
    finally:
        group.stop()
    firsts = sorted(r["first_ack_s"] for r in rounds)
    lasts = sorted(r["all_acked_s"] for r in rounds)
    moves = sorted(r["leader_moved_s"] for r in rounds if r["leader_moved_s"] is not None)
    return {"settings": dict(settings), "brokers": copts.failover_brokers,
            "partitions": copts.failover_partitions, "kills": len(rounds),
            "first_ack_p50_s": percentile(firsts, 50), "first_ack_max_s": firsts[-1],
            "all_acked_p50_s": percentile(lasts, 50), "all_acked_max_s": lasts[-1],
            "leader_moved_p50_s": percentile(moves, 50) if moves else None,
            "leader_moved_max_s": moves[-1] if moves else None,
            "rounds": rounds}
