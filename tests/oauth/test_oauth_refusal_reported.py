"""A refused OAUTHBEARER login is reported when the broker answers its error challenge
(RFC 7628), not when the client replies ``\\x01``: a client that closes after the
challenge still leaves its log line, audit event and metric, and waited
``failedAuthenticationDelayMs`` for the challenge; one that replies gets
SASL_AUTHENTICATION_FAILED at once, without a second report."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.oauth_helpers import (
    ERROR_CHALLENGE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    BearerConnection,
    bearer_message,
    issuer_token,
    oauth_file,
    start_broker,
)
from tests.operations.test_metrics import scrape
from tests.ports import free_port
from tests.security_helpers import audit_events

DELAY_S = 0.4
FAILURES = r'kop_server_authentications_total\{mechanism="OAUTHBEARER",outcome="failure"\}'


class Broker:
    def __init__(self, process: BrokerProcess, metrics_port: int) -> None:
        self.process = process
        self.metrics_port = metrics_port

    @property
    def sasl_port(self) -> int:
        return self.process.ports["SASL_PLAINTEXT"]

    @property
    def plain_bootstrap(self) -> str:
        return f"127.0.0.1:{self.process.ports['PLAINTEXT']}"

    def failures(self) -> float:
        """Failed OAUTHBEARER logins counted so far (none: no sample yet)."""
        return sum(value for name, value in scrape(self.metrics_port).items()
                   if re.fullmatch(FAILURES, name))


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory,
           issuer: DevIssuer) -> Iterator[Broker]:
    directory = Path(tmp_path_factory.mktemp("refusal-reported"))
    metrics_port = free_port()
    process = start_broker(
        directory, oauth_file(directory, issuer.url),
        kafkaListeners="SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        saslListenerMechanisms="SASL_PLAINTEXT:OAUTHBEARER",
        failedAuthenticationDelayMs=str(int(DELAY_S * 1000)), metricsPort=str(metrics_port),
        # every refused login here comes from 127.0.0.1: each one is reported
        auditDenialsPerWindow="100000")
    process.wait_for_log(rf"metrics on http://127.0.0.1:{metrics_port}/metrics")
    yield Broker(process, metrics_port)
    process.stop()


def forged(issuer: DevIssuer) -> str:
    good = issuer_token(issuer)
    return good[:-8] + ("AAAAAAAA" if not good.endswith("AAAAAAAA") else "BBBBBBBB")


def challenged(broker: Broker, issuer: DevIssuer) -> tuple[BearerConnection, str]:
    """A connection whose forged-token login got the error challenge (after the delay);
    its local address."""
    conn = BearerConnection(broker.sasl_port)
    assert conn.handshake().error_code == NONE
    started = time.monotonic()
    first = conn.authenticate(bearer_message(forged(issuer)))
    assert time.monotonic() - started >= DELAY_S  # the delay comes before the challenge
    assert first.error_code == NONE and bytes(first.auth_bytes) == ERROR_CHALLENGE
    host, port = conn.sock.getsockname()[:2]
    return conn, f"{host}:{port}"


def reports(broker: Broker, client: str) -> tuple[list[str], list[dict[str, object]]]:
    """The log lines and audit events of ``client``'s failed login, once there is one of
    each (both are written as the broker answers; the audit event soon after)."""
    broker.process.wait_for_log(f"SASL OAUTHBEARER login from {client} ")
    deadline = time.monotonic() + 20
    while True:
        events = [e for e in audit_events(broker.plain_bootstrap)
                  if e["client"] == client and e["kind"] == "authentication"]
        if events or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lines = [line for line in broker.process.log_text().splitlines()
             if f"SASL OAUTHBEARER login from {client} " in line]
    return lines, events


def test_a_client_closing_after_the_challenge_is_reported(broker: Broker,
                                                          issuer: DevIssuer) -> None:
    before = broker.failures()
    conn, client = challenged(broker, issuer)
    conn.close()  # no \x01
    lines, events = reports(broker, client)
    assert len(lines) == 1 and lines[0].endswith("failed: token signature invalid"), lines
    assert [(e["outcome"], e["mechanism"], e["reason"]) for e in events] == [
        ("failure", "OAUTHBEARER", "token signature invalid")]
    assert broker.failures() == before + 1


def test_the_reply_ends_the_login_without_a_second_report(broker: Broker,
                                                          issuer: DevIssuer) -> None:
    before = broker.failures()
    conn, client = challenged(broker, issuer)
    try:
        second = conn.authenticate(b"\x01")
        assert second.error_code == SASL_AUTHENTICATION_FAILED
        assert second.error_message == "Authentication failed: token signature invalid"
        assert conn.closed_by_peer()
    finally:
        conn.close()
    # the listener's closing line comes after anything the broker said of the login
    broker.process.wait_for_log(f"closing connection from {client} ")
    lines, events = reports(broker, client)
    assert len(lines) == 1, lines
    assert len(events) == 1, events
    assert broker.failures() == before + 1
