"""The Prometheus endpoint, scraped after real traffic: the numbers move as they should."""

from __future__ import annotations

import base64
import contextlib
import re
import time
import urllib.request
from pathlib import Path

import confluent_kafka
import jwt
import pytest

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.ports import free_port
from tests.txn_helpers import wait_until

SECRET = b"metrics-test-secret-of-32-bytes!"


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def sample(samples: dict[str, float], pattern: str) -> float:
    found = [v for k, v in samples.items() if re.fullmatch(pattern, k)]
    assert found, f"no sample matches {pattern}"
    return sum(found)


def test_metrics_follow_traffic(tmp_path: Path, topic_name: str) -> None:
    metrics_port = free_port()
    broker = BrokerProcess(tmp_path, {
        "kafkaListeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "tokenSecretKey": "data:;base64," + base64.b64encode(SECRET).decode(),
        "metricsPort": str(metrics_port), "groupInitialRebalanceDelayMs": "0",
    }).start()
    try:
        broker.wait_for_log(rf"metrics on http://127.0.0.1:{metrics_port}/metrics")
        boot = f"127.0.0.1:{broker.ports['PLAINTEXT']}"
        create_topic(boot, topic_name, 1)
        producer = confluent_kafka.Producer({"bootstrap.servers": boot, "linger.ms": 0})
        for i in range(100):
            producer.produce(topic_name, value=b"x" * 50, key=str(i).encode())
        assert producer.flush(10) == 0
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": boot, "group.id": "lagging", "enable.auto.commit": False,
            "auto.offset.reset": "earliest"})
        consumer.subscribe([topic_name])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 40 and time.monotonic() < deadline:
            seen += len([m for m in consumer.consume(40 - seen, 1.0) if m.error() is None])
        consumer.commit(offsets=[confluent_kafka.TopicPartition(topic_name, 0, 40)],
                        asynchronous=False)
        internal = f"public/default/{topic_name}"
        samples = scrape(metrics_port)
        label = r'\{topic="' + internal + r'"\}'
        assert sample(samples, "kop_server_messages_in_total" + label) == 100
        assert sample(samples, "kop_server_bytes_in_total" + label) > 5000
        assert sample(samples, "kop_server_messages_out_total" + label) >= 40
        assert sample(samples, r'kop_server_requests_total\{api="Produce"\}') >= 1
        assert sample(samples, r'kop_server_requests_total\{api="JoinGroup"\}') >= 1
        assert sample(samples, r'kop_server_request_latency_seconds_count\{api="Fetch"\}') >= 1
        assert sample(samples, r'kop_server_produce_stage_seconds_count\{stage="append"\}') >= 1
        assert sample(samples, r'kop_server_active_connections\{listener="PLAINTEXT"\}') >= 1
        part = r'\{partition="0",topic="' + internal + r'"\}'
        assert sample(samples, "kop_server_log_end_offset" + part) == 100
        assert sample(samples, "kop_server_log_start_offset" + part) == 0
        assert sample(samples, "kop_server_log_size_bytes" + part) > 5000
        # the periodic fsync (every flushIntervalMs, 1 s) has run and was timed
        wait_until(lambda: sample(scrape(metrics_port), "kop_server_fsync_seconds_count") >= 1,
                   10, "an fsync to be timed")
        lag = (r'kop_server_group_lag\{group="lagging",partition="0",topic="' + internal
               + r'"\}')
        assert sample(samples, lag) == 60
        consumer.close()
        producer.produce(topic_name, value=b"more")
        assert producer.flush(10) == 0
        assert sample(scrape(metrics_port), lag) == 61

        sasl = f"127.0.0.1:{broker.ports['SASL_PLAINTEXT']}"
        good = jwt.encode({"sub": "alice", "exp": int(time.time()) + 600}, SECRET,
                          algorithm="HS256")
        for password in ("token:" + good, "token:not-a-jwt"):
            admin = confluent_kafka.admin.AdminClient({
                "bootstrap.servers": sasl, "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "PLAIN", "sasl.username": "public",
                "sasl.password": password})
            with contextlib.suppress(confluent_kafka.KafkaException):
                admin.list_topics(timeout=3)
        samples = scrape(metrics_port)
        success = r'kop_server_authentications_total\{mechanism="PLAIN",outcome="success"\}'
        failure = r'kop_server_authentications_total\{mechanism="PLAIN",outcome="failure"\}'
        assert sample(samples, success) >= 1
        assert sample(samples, failure) >= 1
    finally:
        broker.stop()


@pytest.mark.parametrize("port", ["70000", "x"])
def test_bad_metrics_port_is_refused(port: str) -> None:
    import subprocess
    import sys

    from tests.broker_process import REPO
    result = subprocess.run([sys.executable, "-m", "edge.cli", "--set", f"metricsPort={port}"],
                            cwd=REPO, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "metricsPort" in result.stderr


def test_a_deleted_topics_series_go_and_a_topic_created_again_counts_from_zero(
        tmp_path: Path, topic_name: str) -> None:
    """Kafka removes a topic's BrokerTopicMetrics when the topic is deleted; the series
    of records and bytes in and out stayed here, so topic churn grew ``/metrics`` without
    bound. After a delete none is left; the topic created again counts from 0."""
    metrics_port = free_port()
    broker = BrokerProcess(tmp_path, {"metricsPort": str(metrics_port)}).start()
    families = ("kop_server_messages_in_total", "kop_server_bytes_in_total",
                "kop_server_messages_out_total", "kop_server_bytes_out_total")
    internal = f"public/default/{topic_name}"
    label = r'\{topic="' + re.escape(internal) + r'"\}'

    def traffic(records: int) -> None:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
        for _ in range(records):
            producer.produce(topic_name, value=b"x" * 50)
        assert producer.flush(10) == 0
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": broker.bootstrap, "group.id": f"g{records}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic_name])
        seen, deadline = 0, time.monotonic() + 30
        while seen < records and time.monotonic() < deadline:
            seen += len([m for m in consumer.consume(records - seen, 1.0) if not m.error()])
        consumer.close()
        assert seen == records

    try:
        broker.wait_for_log(rf"metrics on http://127.0.0.1:{metrics_port}/metrics")
        admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": broker.bootstrap})
        create_topic(broker.bootstrap, topic_name, 1)
        traffic(7)
        samples = scrape(metrics_port)
        assert all(sample(samples, family + label) > 0 for family in families)
        for future in admin.delete_topics([topic_name]).values():
            future.result(10)
        left = [name for name in scrape(metrics_port) if f'topic="{internal}"' in name]
        assert left == []
        create_topic(broker.bootstrap, topic_name, 1)
        traffic(3)
        samples = scrape(metrics_port)
        assert sample(samples, "kop_server_messages_in_total" + label) == 3
        assert sample(samples, "kop_server_messages_out_total" + label) == 3
    finally:
        broker.stop()
