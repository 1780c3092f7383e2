"""Fetch sends large batches from the file and small ones from memory; both reach every
client whole, over plain TCP (``sendfile``) and over TLS (regions read into memory).

The records mix 150 kB values (batches well above ``REGION_MIN_BYTES``) with small ones,
produced in rounds so that file regions and read batches alternate in one response.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_core.storage.ledger import REGION_MIN_BYTES
from tests import clients
from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS, Got, Rec, make_records
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
    rounds = [small[:150], big[:6], small[150:], big[6:]]
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
