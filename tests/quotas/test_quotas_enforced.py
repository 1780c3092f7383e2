"""Quotas enforced as Kafka enforces them, measured by real clients: a producer held near
its ``producer_byte_rate``, a consumer near its ``consumer_byte_rate``, the throttle time
in the answers (confluent-kafka's throttle callback sees it), the connection muted for
that time (KIP-219), per-tenant metrics and one audit event per quota window, and quotas
that survive a restart. Rates are reported; only coarse bounds are asserted."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.ports import free_port
from tests.quota_helpers import alter, describe, parts, produce_flat_out, produce_throttle
from tests.raw import RawConnection
from tests.security_helpers import audit_events

WINDOW = {"quotaWindowNum": "5", "quotaWindowSizeSeconds": "1"}
"""Rates over 5 one-second samples: a new client's first burst is at most 4 s of quota."""
MB = 1 << 20


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, metrics_port: int
           ) -> Iterator[BrokerProcess]:
    process = BrokerProcess(Path(tmp_path_factory.mktemp("quota-enforced")), {
        **WINDOW, "metricsPort": str(metrics_port)}).start()
    yield process
    process.stop()


def _create(bootstrap: str, topic: str) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})
    for future in client.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(15)


def _operator(broker: BrokerProcess) -> RawConnection:
    return RawConnection(broker.port)


def test_a_producer_is_held_near_its_byte_rate(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    assert alter(_operator(broker), [({"client-id": "noisy"}, {"producer_byte_rate": MB})]) \
        == [(0, None)]
    # the 20 s, after the first window's burst
    rate, throttles = produce_flat_out({"bootstrap.servers": broker.bootstrap,
                                        "client.id": "noisy"}, topic_name, until=25.0)
    ratio = rate / MB
    print(f"producer at a 1 MiB/s quota: {ratio:.3f} x the quota over 20 s, "
          f"{len(throttles)} throttle callbacks")
    # the issue's +15% is the quota holding; below it the client may simply be slowed by
    # the machine (the suite's other worker), so the lower bound stays coarse
    assert 0.5 <= ratio <= 1.15
    assert throttles and max(throttles) > 0


def test_a_consumer_is_held_near_its_byte_rate(broker: BrokerProcess, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "client.id": "filler"})
    for _ in range(1000):  # 10 MB, far more than the consumer may take in the test
        producer.produce(topic_name, b"y" * 10_000)
        producer.poll(0)
    assert producer.flush(30) == 0
    rate = MB // 2
    assert alter(_operator(broker), [({"client-id": "slow"}, {"consumer_byte_rate": rate})]) \
        == [(0, None)]
    throttles: list[int] = []
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "client.id": "slow", "group.id": "slow-g",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "throttle_cb": lambda event: throttles.append(int(event.throttle_time * 1000))})
    consumer.assign([confluent_kafka.TopicPartition(topic_name, 0, 0)])
    got: list[tuple[float, int]] = []
    started = time.monotonic()
    until = started + 10
    try:
        while time.monotonic() < until:
            for msg in consumer.consume(100, 0.2):
                if msg.error() is None:
                    got.append((time.monotonic(), len(present(msg.value()))))
    finally:
        consumer.close()
    total = sum(size for _, size in got)
    # 4 s of burst allowance at most, then the quota: well under the 10 MB there are
    allowed = rate * (10 + 4)
    print(f"consumer at a 512 KiB/s quota: {total / MB:.1f} MiB in 10 s "
          f"({total / allowed:.2f} x what the quota allows), {len(throttles)} throttles")
    assert 0.3 * rate * 10 <= total <= 1.5 * allowed
    assert throttles


def test_a_consumer_whose_fetch_outgrows_its_quota_window_still_gets_everything(
        broker: BrokerProcess, topic_name: str) -> None:
    """A Fetch answer larger than what the quota lets through in a window (quota x
    (samples - 1) x window) would be answered empty and throttled, then asked again just
    as large, forever; as Kafka does, the broker caps a quota'd consumer's fetch size at
    that, and the consumer gets every record."""
    _create(broker.bootstrap, topic_name)
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap,
                                         "client.id": "filler", "batch.size": 5_000})
    for _ in range(150):  # 150 kB in small batches, well over the 80 kB of one window
        producer.produce(topic_name, b"y" * 1000)
        producer.poll(0)
    assert producer.flush(30) == 0
    rate = 20_000
    assert alter(_operator(broker), [({"client-id": "starved"},
                                      {"consumer_byte_rate": rate})]) == [(0, None)]
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": broker.bootstrap, "client.id": "starved",
        "group.id": "starved-g", "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic_name, 0, 0)])
    got = 0
    started = time.monotonic()
    deadline = started + 90  # the quota lets 150 kB through in about 4 s
    try:
        while got < 150 and time.monotonic() < deadline:
            got += sum(1 for msg in consumer.consume(100, 0.5) if msg.error() is None)
    finally:
        consumer.close()
    print(f"consumer at {rate} B/s, 5 one-second samples, 150 kB to read: {got} records "
          f"in {time.monotonic() - started:.1f} s")
    assert got == 150


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_a_throttled_request_mutes_the_connection_and_is_counted_and_audited(
        broker: BrokerProcess, metrics_port: int, topic_name: str) -> None:
    _create(broker.bootstrap, topic_name)
    assert alter(_operator(broker), [({"client-id": "raw-test"},
                                      {"producer_byte_rate": 10_000})]) == [(0, None)]
    conn = RawConnection(broker.port)
    error, throttle = produce_throttle(conn, topic_name, 200_000)  # 20 x the quota of 5 s
    assert error == 0 and throttle > 0
    sent = time.monotonic()
    conn.call(MetadataRequest[1](topics=[]), 1, MetadataResponse)
    # muted: nothing of the connection is read before the throttle time is over
    assert time.monotonic() - sent >= throttle / 1000 * 0.9
    text = _scrape(metrics_port)
    assert re.search(r'kop_server_quota_throttle_seconds_total\{quota="producer_byte_rate",'
                     r'tenant="public"\} [1-9]', text)
    assert re.search(r'kop_server_tenant_bytes_total\{direction="in",tenant="public"\} '
                     r'[1-9]', text)
    # per quota entity (who shares the rate), as Kafka tags its quota metrics
    entity = 'entity="client-id/raw-test",quota="producer_byte_rate"'
    assert re.search(r'kop_server_quota_entity_throttle_seconds_total\{' + entity + r'\} '
                     r'[0-9.]*[1-9]', text), text
    assert f"kop_server_quota_entity_limit{{{entity}}} 10000.0" in text
    assert f"kop_server_quota_entity_usage{{{entity}}} " in text  # 0 once the window passed
    throttled = [e for e in audit_events(broker.bootstrap)
                 if e["kind"] == "quota" and e["resource"] == "client-id/raw-test"]
    assert len(throttled) == 1, throttled  # the first of the window only
    assert throttled[0]["outcome"] == "throttled" and throttled[0]["tenant"] == "public"


def test_quotas_survive_a_restart(tmp_path: Path, topic_name: str) -> None:
    process = BrokerProcess(tmp_path, {**WINDOW}).start()
    try:
        _create(process.bootstrap, topic_name)
        assert alter(RawConnection(process.port),
                     [({"user": None}, {"producer_byte_rate": 1000})]) == [(0, None)]
    finally:
        process.stop()
    process.start()
    try:
        conn = RawConnection(process.port)
        assert describe(conn, [])[1] == {parts({"user": None}): {"producer_byte_rate": 1000}}
        error, throttle = produce_throttle(conn, topic_name, 50_000)
        assert throttle > 0, error
    finally:
        process.stop()
