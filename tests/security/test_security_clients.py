"""Security acceptance 1: stock clients produce and consume over SASL_PLAINTEXT and SASL_SSL
with PLAIN ``token:`` logins, with HMAC-signed and with RSA-signed tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.clients import make_records
from tests.security_helpers import (
    CONSUMERS,
    PRODUCERS,
    Login,
    TlsFiles,
    TokenIssuer,
    check_roundtrip,
    create_topic,
    make_tls,
)

COUNT = 300
CLIENTS = ["confluent", "kafka-python", "aiokafka"]


@dataclass
class SecureBroker:
    broker: BrokerProcess
    issuer: TokenIssuer
    tls: TlsFiles

    def login(self, protocol: str, username: str = "acme", role: str = "app") -> Login:
        listener = "INTERNAL" if protocol == "SASL_PLAINTEXT" else "EXTERNAL"
        return Login(f"127.0.0.1:{self.broker.ports[listener]}", protocol, username,
                     self.issuer.token(role), self.tls.ca)


@pytest.fixture(scope="module", params=["hmac", "rsa"])
def secure(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """One broker per token kind with a SASL_PLAINTEXT and a SASL_SSL listener."""
    material = Path(tmp_path_factory.mktemp(f"material-{request.param}"))
    tls = make_tls(material / "tls")
    issuer = TokenIssuer(request.param, material / "keys")
    broker = BrokerProcess(Path(tmp_path_factory.mktemp(f"data-{request.param}")), {
        "kafkaListeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "kafkaProtocolMap": "INTERNAL:SASL_PLAINTEXT,EXTERNAL:SASL_SSL",
        **issuer.settings, **tls.broker_settings(),
    }).start()
    yield SecureBroker(broker, issuer, tls)
    broker.stop()


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_and_consume_with_token_login(secure: SecureBroker, protocol: str,
                                              client: str, topic_name: str) -> None:
    login = secure.login(protocol)
    create_topic(login, topic_name)
    recs = make_records(COUNT, int(time.time() * 1000) - 10_000)
    PRODUCERS[client](login, topic_name, recs)
    got = CONSUMERS[client](login, topic_name, COUNT)
    check_roundtrip(recs, got)
    # The records are in the login's tenant: the full name reads the same records.
    secure.broker.wait_for_log(r"logged in as app \(tenant acme\) on " +
                               ("INTERNAL" if protocol == "SASL_PLAINTEXT" else "EXTERNAL"))


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_mixed_clients_and_full_names(secure: SecureBroker, protocol: str,
                                      topic_name: str) -> None:
    """What one client wrote under a short name another reads under the full name, and the
    other listener sees the same data."""
    login = secure.login(protocol)
    create_topic(login, topic_name)
    recs = make_records(120, int(time.time() * 1000) - 10_000)
    PRODUCERS["kafka-python"](login, topic_name, recs)
    other = secure.login("SASL_SSL" if protocol == "SASL_PLAINTEXT" else "SASL_PLAINTEXT")
    check_roundtrip(recs, CONSUMERS["confluent"](other, f"acme/default/{topic_name}", 120))
    check_roundtrip(recs, CONSUMERS["aiokafka"](login, f"persistent://acme/default/{topic_name}",
                                                120))
