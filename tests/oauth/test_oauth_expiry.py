"""OAuth acceptance 5: a connection outliving its token is closed unless it
re-authenticates (KIP-368), and librdkafka's automatic token refresh keeps a producer
alive across several expiries of short-lived (6 s) tokens."""

from __future__ import annotations

import re
import time
from typing import Any

import confluent_kafka
import pytest
from kafka.protocol.metadata import MetadataRequest

from oauth.adapters import confluent_config
from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    BearerConnection,
    issuer_token,
    login_for,
)
from tests.sessions import wait_past_session, wait_until

LIFETIME = 6


@pytest.fixture(scope="module")
def issuer_options() -> dict[str, object]:
    """The dev issuer's options for this module."""
    return {"token_lifetime_seconds": LIFETIME}


def short_token(issuer: DevIssuer, seconds: int) -> str:
    return issuer_token(issuer, exp=int(time.time()) + seconds)


def test_connection_outliving_its_token_is_closed(broker: BrokerProcess,
                                                  issuer: DevIssuer) -> None:
    conn = BearerConnection(broker.port)
    try:
        answer = conn.login(short_token(issuer, 2))
        answered = time.time()
        assert 0 < answer.session_lifetime_ms <= 2000
        assert conn.metadata(None).brokers
        wait_past_session(answered, answer.session_lifetime_ms)
        conn.send_frame(conn.request_bytes(MetadataRequest[1](topics=None), 1))
        with pytest.raises((ConnectionError, OSError)):
            conn.read_frame()
    finally:
        conn.close()
    broker.wait_for_log("SASL session of app expired without re-authentication")


def test_reauthenticated_connection_lives_on(broker: BrokerProcess,
                                             issuer: DevIssuer) -> None:
    conn = BearerConnection(broker.port)
    try:
        sent = time.time()
        first = conn.login(short_token(issuer, 2))
        answered = time.time()
        wait_until(sent + first.session_lifetime_ms / 2000)  # re-authenticate half-way
        again = conn.login(short_token(issuer, 60))
        assert again.session_lifetime_ms > 50_000
        wait_past_session(answered, first.session_lifetime_ms)  # the first session is over
        assert conn.metadata(None).brokers
    finally:
        conn.close()
    broker.wait_for_log(r"re-authenticated as app \(tenant public\)")


def builtin_oidc(broker: BrokerProcess, issuer: DevIssuer) -> dict[str, Any]:
    return {"sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": "app-secret",
            "sasl.oauthbearer.token.endpoint.url": f"{issuer.url}/token"}


def login_callback(broker: BrokerProcess, issuer: DevIssuer) -> dict[str, Any]:
    return confluent_config(login_for(issuer, "app", "app-secret"))


@pytest.mark.parametrize("how", [builtin_oidc, login_callback], ids=["oidc", "oauth_cb"])
def test_librdkafka_refresh_keeps_a_producer_alive(broker: BrokerProcess, issuer: DevIssuer,
                                                   topic_name: str, how: Any) -> None:
    producer = confluent_kafka.Producer({
        "bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
        **how(broker, issuer), "acks": "all", "linger.ms": 20,
    })
    delivered: list[int] = []
    errors: list[object] = []

    def report(err: object, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        else:
            delivered.append(int(msg.value()))

    first_line = len(broker.lines)
    sent = 0
    deadline = time.monotonic() + 2.5 * LIFETIME
    while time.monotonic() < deadline:
        producer.produce(topic_name, value=str(sent).encode(), on_delivery=report)
        sent += 1
        producer.poll(0.05)
    assert producer.flush(30) == 0
    assert errors == []
    assert sorted(delivered) == list(range(sent))
    log = broker.lines[first_line:]
    reauth = [line for line in log if re.search(r"re-authenticated as app", line)]
    assert len(reauth) >= 2, "\n".join(log)
    assert not any("expired without re-authentication" in line for line in log), \
        "\n".join(log)
