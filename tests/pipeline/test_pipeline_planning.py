"""The driver's planning of batch and streaming reads against a real broker, without
Spark's JVM: the readers' methods called as Spark calls them. Partitions added to a
subscribed topic, a topic deleted mid-stream, and offsets or assignments naming
partitions the subscription or the broker does not have."""

from __future__ import annotations

import time
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from pipeline.batch_reader import BatchReader
from pipeline.fetch import DataLossError, OffsetRange, RangeReader
from pipeline.options import OptionError, parse_options
from pipeline.partition import RangePartition
from pipeline.stream_reader import StreamReader
from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.cluster_helpers import running_cluster
from tests.pipeline_helpers import produce


def stream_reader(bootstrap: str, topic: str, **options: str) -> StreamReader:
    return StreamReader(parse_options({"kafka.bootstrap.servers": bootstrap,
                                       "subscribe": topic, "startingOffsets": "earliest",
                                       **options}))


def ranges(reader: StreamReader, start: dict[str, dict[str, int]],
           end: dict[str, dict[str, int]]) -> list[str]:
    """The ranges ``reader`` plans for a micro-batch."""
    planned = reader.partitions(start, end)
    return [str(p.where) for p in planned if isinstance(p, RangePartition)]


def add_partitions(bootstrap: str, topic: str, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, count)]).values():
        future.result(30)


def test_a_partition_added_mid_stream_is_read_from_its_start(broker: BrokerProcess,
                                                             topic_name: str) -> None:
    """The driver's long-lived admin client did not know the new partition: ListOffsets
    failed with "No leaders found" at every trigger, failing the query."""
    bootstrap, topic = broker.bootstrap, topic_name
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [(0, None, b"a-%d" % i) for i in range(5)])
    reader = stream_reader(bootstrap, topic)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert end == {topic: {"0": 5}}
        add_partitions(bootstrap, topic, 2)
        produce(bootstrap, topic, [(1, None, b"b-%d" % i) for i in range(4)])
        # the batch that finds the partition records its start in the offset log
        found = reader.latestOffset(end, ReadAllAvailable())
        assert found == {topic: {"0": 5, "1": 0}}
        assert ranges(reader, end, found) == []
        following = reader.latestOffset(found, ReadAllAvailable())
        assert following == {topic: {"0": 5, "1": 4}}
        assert ranges(reader, found, following) == [f"{topic}-1 [0, 4)"]
    finally:
        reader.stop()


def test_an_added_partition_whose_first_records_are_gone_is_data_loss(
        broker: BrokerProcess, topic_name: str) -> None:
    """It was read from its log start without a word."""
    bootstrap, topic = broker.bootstrap, topic_name
    create_topic(bootstrap, topic, 1)
    add_partitions(bootstrap, topic, 2)
    produce(bootstrap, topic, [(1, None, b"b-%d" % i) for i in range(20)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records(
            [confluent_kafka.TopicPartition(topic, 1, 10)]).values():
        future.result(30)
    start = {topic: {"0": 0}}  # a checkpoint from before the partition was added
    failing = stream_reader(bootstrap, topic)
    with pytest.raises(DataLossError, match=f"added partition {topic}-1 starts from offset "
                       "10 instead of 0"):
        failing.latestOffset(start, ReadAllAvailable())
    failing.stop()
    warning = stream_reader(bootstrap, topic, failOnDataLoss="false")
    try:
        assert warning.latestOffset(start, ReadAllAvailable()) == {topic: {"0": 0, "1": 10}}
    finally:
        warning.stop()


def test_a_topic_deleted_mid_stream_is_data_loss(broker: BrokerProcess,
                                                 topic_name: str) -> None:
    """The stream stalled at its last offsets, with no word of the records never read."""
    bootstrap, topic = broker.bootstrap, topic_name
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [(0, None, b"v-%d" % i) for i in range(100)])
    reader = stream_reader(bootstrap, topic, maxOffsetsPerTrigger="10")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    assert end == {topic: {"0": 10}}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while topic in admin.list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"{topic} still listed"
        time.sleep(0.2)
    with pytest.raises(DataLossError, match=f"{topic}-0 \\(read up to offsets 10\\) no "
                       "longer exist"):
        reader.latestOffset(end, ReadMaxRows(10))
    reader.stop()
    warning = stream_reader(bootstrap, topic, failOnDataLoss="false")
    try:
        assert warning.latestOffset(end, ReadMaxRows(10)) == {}
    finally:
        warning.stop()


def test_offsets_and_assignments_naming_what_is_not_there_are_refused(
        broker: BrokerProcess, topic_name: str) -> None:
    """A batch read took topics named in startingOffsets outside its subscription, failed
    on a typo'd topic or partition with a bare librdkafka error, and waited pollTimeoutMs
    for an ending offset past the end."""
    bootstrap, a, b = broker.bootstrap, f"{topic_name}-a", f"{topic_name}-b"
    create_topic(bootstrap, a, 1)
    create_topic(bootstrap, b, 1)
    produce(bootstrap, a, [(0, None, b"a-%d" % i) for i in range(10)])

    def plan(**options: str) -> list[str]:
        reader = BatchReader(parse_options({"kafka.bootstrap.servers": bootstrap, **options}))
        return [str(p.where) for p in reader.partitions() if isinstance(p, RangePartition)]

    assert plan(subscribe=a, startingOffsets=f'{{"{a}": {{"0": 3}}}}') == [f"{a}-0 [3, 10)"]
    refused = [
        ({"subscribe": a, "startingOffsets": f'{{"{b}": {{"0": 3}}}}'},
         f"option startingOffsets names {b}-0, outside the subscription \\(subscribe={a}\\)"),
        ({"subscribe": a, "endingOffsets": f'{{"{a}x": {{"0": 3}}}}'},
         f"option endingOffsets names {a}x-0, outside the subscription"),
        ({"subscribe": a, "startingOffsets": f'{{"{a}": {{"5": 0}}}}'},
         f"names {a}-5, but the broker has no partition 5 of topic {a}$"),
        ({"assign": f'{{"{a}-missing": [0]}}'},
         f"option assign names {a}-missing-0, but the broker has no topic {a}-missing$"),
        ({"subscribe": a, "endingOffsets": f'{{"{a}": {{"0": 1000}}}}'},
         f"{a}-0 ends at offset 1000, past its latest offset 10"),
    ]
    for options, message in refused:
        with pytest.raises(OptionError, match=message):
            plan(**options)
    reader = stream_reader(bootstrap, a, startingOffsets=f'{{"{b}": {{"0": 0}}}}')
    try:
        with pytest.raises(OptionError, match="outside the subscription"):
            reader.initialOffset()
    finally:
        reader.stop()


def test_a_stream_carries_on_when_the_brokers_of_its_partitions_go(
        tmp_path: Path, topic_name: str) -> None:
    """On three brokers, one stopped (its partitions handed over at once) and then another
    killed (its partitions moved once its lease ran out): the driver's long-lived admin
    client still looked the moved partitions up at their old broker, and librdkafka
    answered offset -1001 with no error (or FENCED_LEADER_EPOCH), which the planning took
    for an end offset; and a task's consumer asking the log start after the move failed
    (``_DESTROY_BROKER``), failing the task. Each micro-batch now ends at the real log
    ends, and the task's question is answered by the new leader."""
    topic = topic_name
    with running_cluster(tmp_path) as cluster:
        create_topic(cluster.bootstrap, topic, 3)
        reader = stream_reader(cluster.bootstrap, topic)
        try:
            written = 0
            end = reader.initialOffset()
            for how in ("stop", "kill", None):
                produce(cluster.bootstrap, topic, [(p, None, b"%d" % p) for p in range(3)] * 2)
                written += 2
                found = reader.latestOffset(end, ReadAllAvailable())
                assert found == {topic: {str(p): written for p in range(3)}}
                assert sorted(ranges(reader, end, found)) == [
                    f"{topic}-{p} [{written - 2}, {written})" for p in range(3)]
                end = found
                task = RangeReader(reader.options, OffsetRange(topic, 0, 0, written))
                assert task.log_start() == 0  # connected to partition 0's leader
                broker = cluster.by_id(cluster.leaders(topic)[0])  # which goes
                if how == "stop":
                    assert broker.stop() == 0
                elif how == "kill":
                    broker.kill()
                assert task.log_start() == 0
                task.consumer.close()
        finally:
            reader.stop()
