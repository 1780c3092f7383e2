"""Security acceptance 5: bad logins are refused with SASL_AUTHENTICATION_FAILED and a
message after failedAuthenticationDelayMs, the connection is closed, and the broker keeps
serving good logins; SASL protocol mistakes get their own errors or a closed connection;
the v0 handshake flow with raw tokens works."""

from __future__ import annotations

import base64
import select
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import jwt
import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
)
from kafka.protocol.sasl import SaslAuthenticateRequest

from tests.broker_process import BrokerProcess
from tests.security_helpers import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    Login,
    SecureConnection,
    TokenIssuer,
    plain_message,
    raw_frame,
)

AUDIENCE = "edge-test"
DELAY_MS = 500


class Env:
    def __init__(self, broker: BrokerProcess, issuer: TokenIssuer) -> None:
        self.broker = broker
        self.issuer = issuer

    def token(self, role: str = "alice", **claims: object) -> str:
        claims.setdefault("aud", AUDIENCE)
        return self.issuer.token(role, **claims)

    def good_login_works(self) -> None:
        """A fresh connection logs in and gets Metadata answered."""
        conn = SecureConnection(self.broker.port)
        try:
            answer = conn.login("acme", self.token())
            assert answer.error_message is None
            meta = conn.metadata(None)
            assert meta.brokers[0].port == self.broker.port
        finally:
            conn.close()
        assert self.broker.alive()


def _env(base: Path, delay_ms: int) -> Env:
    """A broker whose failed logins are answered after ``delay_ms``, and its issuer."""
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "tokenAudience": AUDIENCE,
        "failedAuthenticationDelayMs": str(delay_ms), **issuer.settings,
        # every bad login here comes from 127.0.0.1: each one is reported, none counted
        "auditDenialsPerWindow": "100000",
    }).start()
    return Env(broker, issuer)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    started = _env(Path(tmp_path_factory.mktemp("bad-logins")), DELAY_MS)
    yield started
    started.broker.stop()


def tampered(token: str) -> str:
    head, body, signature = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)))
    raw[len(raw) // 2] ^= 0x01
    return ".".join([head, body, base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()])


def forged_body(env: Env) -> str:
    """A valid token whose claims were swapped for admin's, keeping the old signature."""
    head, _body, signature = env.token("alice").split(".")
    _h, other_body, _s = env.token("admin").split(".")
    return ".".join([head, other_body, signature])


BAD_MESSAGES = {
    "no token prefix": lambda env: plain_message("acme", env.token()),
    "unknown method": lambda env: plain_message("acme", "password:" + env.token()),
    "empty token": lambda env: plain_message("acme", "token:"),
    "garbage token": lambda env: plain_message("acme", "token:not.a.jwt"),
    "tampered signature": lambda env: plain_message("acme", "token:" + tampered(env.token())),
    "forged claims": lambda env: plain_message("acme", "token:" + forged_body(env)),
    "other secret": lambda env: plain_message("acme", "token:" + jwt.encode(
        {"sub": "alice", "aud": AUDIENCE}, b"x" * 32, algorithm="HS256")),
    "expired": lambda env: plain_message("acme", "token:" + env.token(
        expires_in=-30)),
    "not yet valid": lambda env: plain_message("acme", "token:" + env.token(
        nbf=int(time.time()) + 600)),
    "wrong audience": lambda env: plain_message("acme", "token:" + env.token(aud="other")),
    "no audience": lambda env: plain_message("acme", "token:" + env.issuer.token("alice")),
    "no subject": lambda env: plain_message("acme", "token:" + env.issuer.token(
        None, aud=AUDIENCE)),
    "alg none": lambda env: plain_message("acme", "token:" + jwt.encode(
        {"sub": "admin", "aud": AUDIENCE, "exp": int(time.time()) + 600}, None,
        algorithm="none")),
    "alg none unsigned edit": lambda env: plain_message("acme", "token:" + ".".join([
        base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode(),
        env.token("admin").split(".")[1], ""])),
    "missing NUL": lambda env: f"acme\x00token:{env.token()}".encode(),
    "no NUL": lambda env: f"acmetoken:{env.token()}".encode(),
    "extra NUL": lambda env: f"\x00acme\x00token:{env.token()}\x00".encode(),
    "extra NUL in password": lambda env: f"\x00acme\x00token:\x00{env.token()}".encode(),
    "authzid differs": lambda env: plain_message("acme", "token:" + env.token(), "other"),
    "bad username": lambda env: plain_message("a/b/c", "token:" + env.token()),
    "empty username": lambda env: plain_message("", "token:" + env.token()),
    # signed, with a time no date has (an OverflowError or an int64 overflow broke the
    # connection instead of refusing the login)
    "exp 1e306": lambda env: plain_message("acme", "token:" + env.token(
        expires_in=None, exp=1e306)),
    "exp 10**400": lambda env: plain_message("acme", "token:" + env.token(
        expires_in=None, exp=10**400)),
    "exp year 3e9": lambda env: plain_message("acme", "token:" + env.token(
        expires_in=None, exp=10**17)),
    "iat 10**400": lambda env: plain_message("acme", "token:" + env.token(iat=10**400)),
    "not utf-8": lambda env: b"\x00acme\x00token:\xff\xfe",
    "empty message": lambda env: b"",
    "256 KiB message": lambda env: plain_message("acme", "token:" + "A" * (1 << 18)),
}


def assert_refused_and_closed(env: Env, conn: SecureConnection, message: bytes,
                              version: int = 2) -> str:
    """Send ``message`` as SaslAuthenticate after a handshake; check the delayed refusal
    and the close; return the error message."""
    hand = conn.handshake("PLAIN")
    assert hand.error_code == NONE and list(hand.mechanisms) == ["PLAIN"]
    started = time.monotonic()
    answer = conn.authenticate(message, version)
    elapsed = time.monotonic() - started
    assert answer.error_code == SASL_AUTHENTICATION_FAILED, answer
    assert answer.error_message, answer
    assert answer.auth_bytes == b""
    if version >= 1:
        assert answer.session_lifetime_ms == 0
    assert elapsed >= 0.4, elapsed  # the delay is the property: a lower bound only
    assert conn.closed_by_peer()
    return str(answer.error_message)


@pytest.mark.parametrize("case", list(BAD_MESSAGES))
def test_bad_plain_login_is_refused(env: Env, case: str) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        text = assert_refused_and_closed(env, conn, BAD_MESSAGES[case](env))
        assert text.startswith("Authentication failed"), text
    finally:
        conn.close()
    env.good_login_works()


def test_error_messages_say_why(env: Env) -> None:
    reasons = {
        "no token prefix": "token:",
        "expired": "expired",
        "wrong audience": "audience",
        "alg none": "none",
        "tampered signature": "signature",
        "missing NUL": "3 fields",
        "256 KiB message": "too large",
        "exp year 3e9": "'exp' is out of range",
        "exp 10**400": "'exp' is out of range",
        "iat 10**400": "'iat' is out of range",
    }
    for case, fragment in reasons.items():
        conn = SecureConnection(env.broker.port)
        try:
            text = assert_refused_and_closed(env, conn, BAD_MESSAGES[case](env), version=1)
            assert fragment in text, (case, text)
        finally:
            conn.close()
    env.broker.wait_for_log(r"SASL PLAIN login from .* failed: token expired")
    # The token itself is never logged.
    secret_part = env.token().split(".")[2]
    assert secret_part not in env.broker.log_text()


def test_saslauthenticate_v0_failure_has_no_lifetime_field(env: Env) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        assert_refused_and_closed(env, conn, BAD_MESSAGES["expired"](env), version=0)
    finally:
        conn.close()
    env.good_login_works()


def test_disabled_mechanism(env: Env) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        for version in (1,):
            answer = conn.handshake("OAUTHBEARER", version)
            assert answer.error_code == UNSUPPORTED_SASL_MECHANISM
            assert list(answer.mechanisms) == ["PLAIN"]
            assert conn.closed_by_peer()
    finally:
        conn.close()
    for mechanism in ("SCRAM-SHA-256", "plain", "GSSAPI"):
        conn = SecureConnection(env.broker.port)
        try:
            answer = conn.handshake(mechanism, 0)
            assert answer.error_code == UNSUPPORTED_SASL_MECHANISM
            assert list(answer.mechanisms) == ["PLAIN"]
            assert conn.closed_by_peer()
        finally:
            conn.close()
    env.good_login_works()


def test_request_before_authentication_closes_the_connection(env: Env) -> None:
    for before_handshake in (True, False):
        conn = SecureConnection(env.broker.port)
        try:
            # ApiVersions is served before login (clients need it to pick versions).
            versions = conn.call(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
            assert versions.error_code == NONE
            assert {17, 36} <= {api.api_key for api in versions.api_keys}
            if not before_handshake:
                assert conn.handshake("PLAIN").error_code == NONE
            request = MetadataRequest[1](topics=None)
            assert conn.closed_after_request(request, 1)
        finally:
            conn.close()
    env.broker.wait_for_log(r"Metadata request before SASL authentication")
    env.good_login_works()


def test_authenticate_before_handshake(env: Env) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        answer = conn.authenticate(plain_message("acme", "token:" + env.token()))
        assert answer.error_code == ILLEGAL_SASL_STATE
        assert answer.error_message
        assert conn.closed_by_peer()
    finally:
        conn.close()
    env.good_login_works()


def test_second_authenticate_after_plain_failure_is_not_possible(env: Env) -> None:
    """The failed connection is gone: a retry on it gets nothing."""
    conn = SecureConnection(env.broker.port)
    try:
        assert_refused_and_closed(env, conn, BAD_MESSAGES["expired"](env))
        request = SaslAuthenticateRequest[2](
            auth_bytes=plain_message("acme", "token:" + env.token()))
        assert conn.closed_after_request(request, 2)
    finally:
        conn.close()


def test_v0_handshake_with_raw_tokens(env: Env) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        answer = conn.handshake("PLAIN", 0)
        assert answer.error_code == NONE and list(answer.mechanisms) == ["PLAIN"]
        raw_frame(conn, plain_message("acme", "token:" + env.token()))
        (size,) = struct.unpack(">i", conn._read_exactly(4))
        assert size == 0  # the empty PLAIN server token
        meta = conn.metadata(None)
        assert meta.brokers[0].port == env.broker.port
        assert conn.metadata(["v0-topic"], version=9, auto_create=True).topics[0].error_code \
            == NONE
    finally:
        conn.close()
    env.broker.wait_for_log(r"logged in as alice \(tenant acme\)")


def test_v0_handshake_with_a_bad_raw_token(env: Env) -> None:
    conn = SecureConnection(env.broker.port)
    try:
        assert conn.handshake("PLAIN", 0).error_code == NONE
        started = time.monotonic()
        raw_frame(conn, plain_message("acme", "token:" + env.token(expires_in=-30)))
        assert conn.closed_by_peer()
        assert time.monotonic() - started >= 0.4  # the delay: a lower bound only
    finally:
        conn.close()
    env.good_login_works()


def test_v0_handshake_then_saslauthenticate_is_refused(env: Env) -> None:
    """After a v0 handshake the next frame is a raw token, never a SaslAuthenticate:
    a SaslAuthenticate frame is taken as a (malformed) token and the login fails."""
    conn = SecureConnection(env.broker.port)
    try:
        assert conn.handshake("PLAIN", 0).error_code == NONE
        request = SaslAuthenticateRequest[1](
            auth_bytes=plain_message("acme", "token:" + env.token()))
        assert conn.closed_after_request(request, 1)
    finally:
        conn.close()
    env.good_login_works()


def test_stock_client_with_a_bad_token_is_refused(env: Env) -> None:
    errors: list[confluent_kafka.KafkaError] = []
    login = Login(env.broker.bootstrap, "SASL_PLAINTEXT", "acme",
                  env.token(expires_in=-30))
    producer = confluent_kafka.Producer({**login.confluent(), "error_cb": errors.append})
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert any("Authentication failed" in e.str() and "expired" in e.str() for e in errors), \
        [e.str() for e in errors]
    assert errors[0].code() == confluent_kafka.KafkaError._AUTHENTICATION
    client = AdminClient(login.confluent())
    with pytest.raises(confluent_kafka.KafkaException):
        client.list_topics(timeout=2)
    del client, producer
    env.good_login_works()


def _failing_logins(env: Env, count: int) -> list[SecureConnection]:
    """``count`` connections, each having sent a PLAIN login with a tampered token (its
    answer, after the failure delay, not read)."""
    conns = []
    for _ in range(count):
        conn = SecureConnection(env.broker.port)
        assert conn.handshake("PLAIN").error_code == NONE
        conn.send_frame(conn.request_bytes(SaslAuthenticateRequest[2](
            auth_bytes=BAD_MESSAGES["tampered signature"](env)), 2))
        conns.append(conn)
    return conns


def test_broker_survives_a_burst_of_bad_logins(env: Env) -> None:
    """Many concurrent failures are each delayed, answered and closed, and the broker
    stays up."""
    conns = _failing_logins(env, 20)
    for conn in conns:
        assert conn.closed_by_peer(5.0)
        conn.close()
    env.good_login_works()


def test_delayed_failures_do_not_hold_a_good_login_up(tmp_path: Path) -> None:
    """A good login is answered while failures are still waiting out their delay: an
    order of events, not a stopwatch (the delay, 10 minutes, is never waited)."""
    slow = _env(tmp_path, 600_000)
    try:
        conns = _failing_logins(slow, 20)
        slow.good_login_works()
        # each failure still waits its delay: nothing to read, not even a close
        readable, _, _ = select.select([conn.sock for conn in conns], [], [], 0)
        assert readable == []
        for conn in conns:
            conn.close()
    finally:
        slow.broker.kill()  # a clean stop would wait on the sessions still in their delay
