"""One broker of three cut off from PostgreSQL while the others reach it (a network between
that broker and the database that stops answering, then drops its connections), under
acks=all idempotent load: the cut-off broker gives its partitions up once its lease must
have run out and sends clients to the brokers that take them; a write it sent before the
others took over and whose answer never came back is neither lost nor stored twice; it
joins again once the database answers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from kafka.protocol.producer import ProduceRequest, ProduceResponse

from tests.cluster.test_cluster import (
    check_exactly_once,
    consume_all,
    create,
    idempotent_load,
)
from tests.cluster_helpers import Cluster, leaders_at
from tests.pg_proxy import PgProxy
from tests.postgres_server import shared_server
from tests.raw import RawConnection, record_batch

CUT_OFF = 2
"""The broker whose database connections go through the proxy."""
NOT_LEADER_OR_FOLLOWER = 6


def produce_to(port: int, topic: str, partition: int) -> int:
    """One record to ``partition`` through the broker on ``port`` alone; its error code."""
    conn = RawConnection(port)
    try:
        data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=record_batch(1, value=b"sent to the cut-off"))])
        answer = conn.call(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000,
                                             topic_data=[data]), 9, ProduceResponse)
    finally:
        conn.close()
    return int(answer.responses[0].partition_responses[0].error_code)


def test_a_broker_cut_off_from_the_database_hands_clients_to_the_others(
        tmp_path: Path, topic_name: str) -> None:
    url = shared_server().new_database_url()
    with PgProxy(url) as proxy:
        cluster = Cluster(tmp_path, 3, url=url)
        cluster.by_id(CUT_OFF).settings["storageUrl"] = proxy.url
        try:
            cluster.start()
            create(cluster.bootstrap, topic_name)
            placed = cluster.leaders(topic_name)
            given_up = [p for p, leader in placed.items() if leader == CUT_OFF]
            assert given_up, placed
            stop, acked, errors = threading.Event(), [], []  # type: ignore[var-annotated]
            load = threading.Thread(target=idempotent_load,
                                    args=(cluster.bootstrap, topic_name, stop, acked, errors))
            load.start()
            try:
                time.sleep(2)
                proxy.hold()  # its statements still reach the server; no answer comes back
                cut_off = cluster.by_id(CUT_OFF)
                others = [cluster.by_id(b) for b in cluster.ids if b != CUT_OFF]
                deadline = time.monotonic() + 30
                while True:  # the others took its partitions, and it names itself for none
                    # (it cannot learn of the moves among the others: those it may name late)
                    views = [leaders_at(b.port, topic_name) for b in (cut_off, *others)]
                    if views[1] == views[2] and all(CUT_OFF not in v.values() for v in views):
                        break
                    assert time.monotonic() < deadline, \
                        f"views: {views}" + cluster.last_lines(10)
                    time.sleep(0.2)
                assert {views[0][p] for p in given_up} <= {b for b in cluster.ids if b != CUT_OFF}
                assert produce_to(cut_off.port, topic_name, given_up[0]) == \
                    NOT_LEADER_OR_FOLLOWER
                during = len(acked)
                time.sleep(1)
                assert len(acked) > during, "nothing was acknowledged while it was cut off"
                proxy.cut()  # its connections drop with answers held: outcomes it never learns
                proxy.release()
                deadline = time.monotonic() + 30
                while cluster.live_ids(cut_off) != {0, 1, 2} \
                        or CUT_OFF not in cluster.leaders(topic_name).values():
                    assert time.monotonic() < deadline, \
                        "it never joined again" + cluster.last_lines(10, [CUT_OFF])
                    time.sleep(0.2)
                time.sleep(1)
            finally:
                stop.set()
                load.join(120)
            assert not load.is_alive(), "the load did not flush its records"
            assert not errors, errors[:3]
            assert any("giving up" in line for line in cut_off.lines), cut_off.lines[-10:]
            got = consume_all(cluster.bootstrap, topic_name, len(acked))
            check_exactly_once(got, acked)
        finally:
            cluster.stop()
