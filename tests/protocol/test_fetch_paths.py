"""Fetch sends large batches from the file and small ones from memory; both reach every
client whole, over plain TCP (``sendfile``) and over TLS (regions read into memory).

The records mix 150 kB values (batches well above ``REGION_MIN_BYTES``) with small ones,
produced in rounds so that one response carries both file regions and read batches.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest, FetchResponse

from broker_core.storage.ledger import REGION_MIN_BYTES
from tests import clients
from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS, Got, Rec, make_records
from tests.raw import RawConnection
from tests.security_helpers import CONSUMERS, Login, TokenIssuer, check_roundtrip, make_tls

TOPIC = "mixed-sizes"
BIG = 150_000


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Login,
                                                                       list[Rec]]]:
    """A broker with a PLAINTEXT and a SASL_SSL listener, and the records it holds."""
    base = Path(tmp_path_factory.mktemp("fetch-paths"))
    tls, issuer = make_tls(base / "tls"), TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "PLAIN://127.0.0.1:0,SECURE://127.0.0.1:0",
        "kafkaProtocolMap": "PLAIN:PLAINTEXT,SECURE:SASL_SSL",
        **issuer.settings, **tls.broker_settings(),
    }).start()
    # username "public": the same tenant as the PLAINTEXT listener's default namespace
    login = Login(f"127.0.0.1:{broker.ports['SECURE']}", "SASL_SSL", "public",
                  issuer.token("app"), tls.ca)
    plain = f"127.0.0.1:{broker.ports['PLAIN']}"
    assert BIG * 2 > REGION_MIN_BYTES > 1000
    small = make_records(300, 1_700_000_000_000)
    big = [dataclasses.replace(rec, value=os.urandom(BIG))
           for rec in make_records(12, 1_700_000_100_000)]
    # From offset 0 of each partition: a large batch first (a region), then a small
    # run read as a window (which also takes in the large batches after it)
    rounds = [big[:6], small[:150], big[6:], small[150:]]
    clients.create_topic(plain, TOPIC)
    for recs in rounds:
        clients.produce_confluent(plain, TOPIC, recs, "none")
    produced = [rec for recs in rounds for rec in recs]
    yield broker, login, produced
    broker.stop()


@pytest.mark.parametrize("client", sorted(CONSUMERS))
def test_plain_tcp_consumers_get_every_record(
        served: tuple[BrokerProcess, Login, list[Rec]], client: str) -> None:
    broker, _login, produced = served
    plain = f"127.0.0.1:{broker.ports['PLAIN']}"
    got: list[Got] = getattr(clients, f"consume_{client.replace('-', '_')}")(
        plain, TOPIC, len(produced), PARTITIONS, 60)
    check_roundtrip(produced, got)


@pytest.mark.parametrize("client", sorted(CONSUMERS))
def test_tls_consumers_get_every_record(
        served: tuple[BrokerProcess, Login, list[Rec]], client: str) -> None:
    _broker, login, produced = served
    got = CONSUMERS[client](login, TOPIC, len(produced), PARTITIONS, 60)
    check_roundtrip(produced, got)


def _open_files(broker: BrokerProcess) -> int:
    assert broker.proc is not None
    return len(os.listdir(f"/proc/{broker.proc.pid}/fd"))


def _fetch_request(partition: int, max_wait_ms: int = 0, min_bytes: int = 1,
                   isolation: int = 0) -> Any:
    request = FetchRequest[12]
    return request(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=50 << 20,
        isolation_level=isolation, session_id=0, session_epoch=-1,
        topics=[request.FetchTopic(topic=TOPIC, partitions=[request.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=0,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=10 << 20)])],
        forgotten_topics_data=[], rack_id="")


def test_file_regions_never_leak_descriptors(
        served: tuple[BrokerProcess, Login, list[Rec]]) -> None:
    """Regions are released whether their response is sent, dropped by a client that
    goes away mid-response, or superseded in a long poll."""
    broker, _login, _produced = served
    port = broker.ports["PLAIN"]
    warm = RawConnection(port)
    warm.call(_fetch_request(0), 12, FetchResponse)  # open the ledgers once
    warm.close()
    before = _open_files(broker)
    for round_ in range(20):
        conn = RawConnection(port)
        if round_ % 2:  # ask, then leave without reading the answer
            conn.send_frame(conn.request_bytes(_fetch_request(round_ % PARTITIONS), 12))
        else:  # answered in full, read_committed or not
            answer = conn.call(_fetch_request(round_ % PARTITIONS, isolation=round_ % 4 // 2),
                               12, FetchResponse)
            assert answer.responses[0].partitions[0].error_code == 0
        conn.close()
    # a long poll that rereads the log while it waits for more bytes than there are
    conn = RawConnection(port)
    answer = conn.call(_fetch_request(1, max_wait_ms=300, min_bytes=1 << 30), 12,
                       FetchResponse)
    assert len(answer.responses[0].partitions[0].records) > BIG
    conn.close()
    deadline = time.monotonic() + 10
    while _open_files(broker) > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _open_files(broker) <= before
