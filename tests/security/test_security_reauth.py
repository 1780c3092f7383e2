"""Security acceptance 6: KIP-368 re-authentication.

SaslAuthenticate v1+ reports a session lifetime no later than the token's expiry, capped
by connectionsMaxReauthMs; a connection that goes past its lifetime without
re-authenticating is closed on its next request; re-authenticating with a fresh token on
the same connection keeps it working; re-authenticating as someone else fails."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
)
from kafka.protocol.sasl import SaslHandshakeRequest

from tests.broker_process import BrokerProcess
from tests.security_helpers import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    Login,
    SecureConnection,
    TokenIssuer,
    plain_message,
)
from tests.sessions import wait_past_session, wait_until

CAP_MS = 1500


class Env:
    def __init__(self, broker: BrokerProcess, issuer: TokenIssuer) -> None:
        self.broker = broker
        self.issuer = issuer

    def connect(self) -> SecureConnection:
        return SecureConnection(self.broker.port)


def start(base: Path, issuer: TokenIssuer, **settings: str) -> BrokerProcess:
    return BrokerProcess(base, {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "failedAuthenticationDelayMs": "0",
        **issuer.settings, **settings}).start()


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> TokenIssuer:
    return TokenIssuer("hmac", Path(tmp_path_factory.mktemp("reauth-keys")))


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[Env]:
    """A broker where only token expiry limits sessions (tokens without ``exp``, whose
    sessions these tests check, are allowed)."""
    broker = start(Path(tmp_path_factory.mktemp("reauth")), issuer, tokenExpiration="optional")
    yield Env(broker, issuer)
    broker.stop()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory, issuer: TokenIssuer) -> Iterator[Env]:
    """A broker with connectionsMaxReauthMs=1500 (and tokens without ``exp`` allowed)."""
    broker = start(Path(tmp_path_factory.mktemp("reauth-capped")), issuer,
                   connectionsMaxReauthMs=str(CAP_MS), tokenExpiration="optional")
    yield Env(broker, issuer)
    broker.stop()


def exp_in(seconds: float) -> tuple[int, float]:
    """An ``exp`` claim about ``seconds`` ahead (whole seconds, rounded up) and the epoch
    time it stands for."""
    exp = int(time.time() + seconds) + 1
    return exp, float(exp)


def login(conn: SecureConnection, issuer: TokenIssuer, version: int = 1,
          username: str = "acme", role: str = "alice", **claims: object) -> int:
    """Log in; return the reported session lifetime (v1+)."""
    answer = conn.login(username, issuer.token(role, expires_in=None, **claims), version)
    return int(answer.session_lifetime_ms) if version >= 1 else -1


def metadata_ok(conn: SecureConnection) -> bool:
    return conn.metadata(None).brokers[0].port == conn.sock.getpeername()[1]


def test_lifetime_is_no_later_than_token_expiry(plain: Env) -> None:
    for version in (1, 2):
        conn = plain.connect()
        try:
            exp, exp_epoch = exp_in(3)
            before = time.time()
            lifetime = login(conn, plain.issuer, version, exp=exp)
            assert 0 < lifetime <= 4000
            assert before + lifetime / 1000 <= exp_epoch + 0.05
            assert lifetime >= (exp_epoch - time.time()) * 1000 - 500
            assert metadata_ok(conn)
        finally:
            conn.close()


def test_token_without_expiry_has_no_lifetime(plain: Env) -> None:
    conn = plain.connect()
    try:
        assert login(conn, plain.issuer, 2) == 0
        assert metadata_ok(conn)
    finally:
        conn.close()


def test_connections_max_reauth_caps_the_lifetime(capped: Env) -> None:
    for claims in ({}, {"exp": int(time.time()) + 3600}):
        conn = capped.connect()
        try:
            lifetime = login(conn, capped.issuer, 2, **claims)
            assert 0 < lifetime <= CAP_MS
            assert lifetime >= CAP_MS - 200
        finally:
            conn.close()
    # A token expiring sooner than the cap wins.
    conn = capped.connect()
    try:
        exp, exp_epoch = exp_in(0.2)
        lifetime = login(conn, capped.issuer, 2, exp=exp)
        assert 0 < lifetime <= min(CAP_MS, (exp_epoch - time.time()) * 1000 + 50)
    finally:
        conn.close()


def test_expired_session_is_closed_on_its_next_request(plain: Env) -> None:
    conn = plain.connect()
    try:
        exp, _ = exp_in(1)
        lifetime = login(conn, plain.issuer, 2, exp=exp)
        answered = time.time()
        assert 0 < lifetime <= 2000
        assert metadata_ok(conn)
        wait_past_session(answered, lifetime)
        assert conn.closed_after_request(MetadataRequest[1](topics=None), 1)
    finally:
        conn.close()
    plain.broker.wait_for_log(r"SASL session of alice expired without re-authentication")
    fresh = plain.connect()
    try:
        login(fresh, plain.issuer, 2, exp=int(time.time()) + 3600)
        assert metadata_ok(fresh)
    finally:
        fresh.close()


def test_expired_session_by_the_cap_is_closed(capped: Env) -> None:
    conn = capped.connect()
    try:
        lifetime = login(conn, capped.issuer, 2)
        answered = time.time()
        assert metadata_ok(conn)
        wait_past_session(answered, lifetime)
        assert conn.closed_after_request(MetadataRequest[1](topics=None), 1)
    finally:
        conn.close()


@pytest.mark.parametrize("late", ["SaslHandshake", "ApiVersions"])
def test_an_expired_session_cannot_reauthenticate_late(capped: Env, late: str) -> None:
    """Kafka closes an expired connection on whatever request comes next: a late
    SaslHandshake (which used to restore the session) or ApiVersions included."""
    conn = capped.connect()
    try:
        lifetime = login(conn, capped.issuer, 2)
        wait_past_session(time.time(), lifetime)
        request = (SaslHandshakeRequest[1](mechanism="PLAIN") if late == "SaslHandshake"
                   else ApiVersionsRequest[0]())
        assert conn.closed_after_request(request, 1 if late == "SaslHandshake" else 0)
    finally:
        conn.close()


def test_a_reauthentication_in_time_keeps_the_session(capped: Env) -> None:
    """Re-authenticating before the session ends restores it for another lifetime."""
    conn = capped.connect()
    try:
        login(conn, capped.issuer, 2)
        answer = conn.login("acme", capped.issuer.token("alice", expires_in=3600))
        answered = time.time()
        assert 0 < answer.session_lifetime_ms <= CAP_MS
        assert conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse).error_code == NONE
        assert metadata_ok(conn)
        wait_past_session(answered, answer.session_lifetime_ms)
        assert conn.closed_after_request(MetadataRequest[1](topics=None), 1)
    finally:
        conn.close()


def test_reauthentication_keeps_the_connection(plain: Env) -> None:
    conn = plain.connect()
    try:
        exp, _ = exp_in(1.5)
        first = login(conn, plain.issuer, 2, exp=exp)
        first_answered = time.time()
        assert 0 < first <= 2500
        assert metadata_ok(conn)
        # Re-authenticate on the same connection with a fresh token before expiry.
        again = conn.login("acme", plain.issuer.token("alice", expires_in=60))
        assert 50_000 < again.session_lifetime_ms <= 60_000
        wait_past_session(first_answered, first)  # the first token's session is over
        for _ in range(3):
            assert metadata_ok(conn)
    finally:
        conn.close()
    plain.broker.wait_for_log(r"re-authenticated as alice \(tenant acme\)")


def test_repeated_reauthentication_under_the_cap(capped: Env) -> None:
    conn = capped.connect()
    try:
        login(conn, capped.issuer, 2)
        started = time.monotonic()
        while time.monotonic() - started < 3 * CAP_MS / 1000:
            sent = time.time()
            answer = conn.login("acme", capped.issuer.token("alice", expires_in=3600))
            assert 0 < answer.session_lifetime_ms <= CAP_MS
            # Requests only in the first half of the session (which the broker started
            # after ``sent``), then re-authenticate at its middle: never near its end.
            middle = sent + answer.session_lifetime_ms / 2000
            for _ in range(3):
                if time.time() < middle:
                    assert metadata_ok(conn)
            wait_until(middle)
    finally:
        conn.close()


@pytest.mark.parametrize("who", [("acme", "bob"), ("other", "alice"), ("acme/ns2", "alice")])
def test_reauthentication_as_someone_else_fails(plain: Env, who: tuple[str, str]) -> None:
    username, role = who
    conn = plain.connect()
    try:
        login(conn, plain.issuer, 2, exp=int(time.time()) + 600)
        assert metadata_ok(conn)
        assert conn.handshake("PLAIN").error_code == NONE
        answer = conn.authenticate(plain_message(
            username, "token:" + plain.issuer.token(role, expires_in=600)))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        assert answer.error_message and "re-authentication" in answer.error_message
        assert conn.closed_by_peer()
    finally:
        conn.close()


def test_reauthentication_with_a_bad_token_fails(plain: Env) -> None:
    conn = plain.connect()
    try:
        login(conn, plain.issuer, 2, exp=int(time.time()) + 600)
        assert conn.handshake("PLAIN").error_code == NONE
        answer = conn.authenticate(plain_message(
            "acme", "token:" + plain.issuer.token("alice", expires_in=-10)))
        assert answer.error_code == SASL_AUTHENTICATION_FAILED
        assert conn.closed_by_peer()
    finally:
        conn.close()


def test_reauthentication_needs_handshake_v1(plain: Env) -> None:
    conn = plain.connect()
    try:
        login(conn, plain.issuer, 2, exp=int(time.time()) + 600)
        answer = conn.handshake("PLAIN", 0)
        assert answer.error_code == ILLEGAL_SASL_STATE
        assert conn.closed_by_peer()
    finally:
        conn.close()


def test_librdkafka_reauthenticates_by_itself(capped: Env, topic_name: str) -> None:
    """librdkafka (>= 2.2) re-authenticates PLAIN sessions before the reported lifetime
    ends, so a producer keeps one working connection past several lifetimes."""
    login_ = Login(capped.broker.bootstrap, "SASL_PLAINTEXT", "acme",
                   capped.issuer.token("alice", expires_in=3600))
    errors: list[object] = []
    reports: list[object] = []
    mark = len(capped.broker.lines)
    producer = confluent_kafka.Producer({**login_.confluent(), "acks": "all",
                                         "error_cb": errors.append})
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < 3 * CAP_MS / 1000 + 0.5:
        producer.produce(topic_name, value=f"{sent}".encode(),
                         on_delivery=lambda err, _msg: reports.append(err))
        sent += 1
        producer.poll(0.1)
    assert producer.flush(15) == 0
    assert reports == [None] * sent
    del producer
    lines = capped.broker.lines[mark:]
    assert sum("re-authenticated as alice (tenant acme)" in line for line in lines) >= 2, lines
    assert not any("expired without re-authentication" in line for line in lines), lines
    assert errors == []
