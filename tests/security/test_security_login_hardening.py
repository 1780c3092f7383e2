"""Hostile logins (issue 15): oversized credentials get a bounded SASL_AUTHENTICATION_FAILED
answer, log line and audit event; control characters never forge a log line; tenants
``.``/``..`` are refused; a second SaslHandshake gets Kafka's ILLEGAL_SASL_STATE; tokens
need ``exp`` by default; every login outcome is audited with the tenant the client
claimed."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

from edge.config import load_config
from edge.security import token_expiration_notice, token_validator
from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.oauth_helpers import (
    bearer_message,
    good_login,
    issuer_token,
    make_issuer,
    oauth_file,
    rejected,
    start_broker,
)
from tests.security_helpers import (
    ILLEGAL_SASL_STATE,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    UNSUPPORTED_SASL_MECHANISM,
    UNSUPPORTED_VERSION,
    SecureConnection,
    TokenIssuer,
    plain_message,
)
from tests.sessions import wait_past_session

MAX_LIFETIME = 7200
HUGE = 60_000
FORGED = "2026-01-01 00:00:00,000 INFO edge.session: 127.0.0.1:1 logged in as admin"
AUDIT_TOPIC = "public/__kafka/__audit"

Event = dict[str, object]


class Env:
    """A broker with the default token rules (plus a maximum lifetime), PLAIN and
    OAUTHBEARER on a SASL listener, and a PLAINTEXT listener to read the audit topic."""

    def __init__(self, broker: BrokerProcess, issuer: TokenIssuer) -> None:
        self.broker = broker
        self.issuer = issuer
        self.sasl = broker.ports["SASL_PLAINTEXT"]
        self.plain = f"127.0.0.1:{broker.ports['PLAINTEXT']}"

    def connect(self) -> SecureConnection:
        return SecureConnection(self.sasl)

    def audit(self, wanted: Callable[[Event], bool], count: int = 1) -> list[Event]:
        """The audit events ``wanted`` picks, once ``count`` of them were written."""
        consumer = confluent_kafka.Consumer({"bootstrap.servers": self.plain,
                                             "group.id": "hardening-audit",
                                             "enable.auto.commit": False})
        consumer.assign([confluent_kafka.TopicPartition(AUDIT_TOPIC, 0, 0)])
        found: list[Event] = []
        deadline = time.monotonic() + 20
        try:
            while len(found) < count and time.monotonic() < deadline:
                for msg in consumer.consume(100, 0.5):
                    if msg.error() is None:
                        value = present(msg.value())
                        assert len(value) < 2048, value[:200]
                        event = json.loads(value)
                        if wanted(event):
                            found.append(event)
        finally:
            consumer.close()
        assert len(found) >= count, found
        return found


def start_env(tmp_path_factory: pytest.TempPathFactory, **settings: str) -> Env:
    base = Path(tmp_path_factory.mktemp("login-hardening"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "saslAllowedMechanisms": "PLAIN,OAUTHBEARER", "failedAuthenticationDelayMs": "0",
        # every bad login here comes from 127.0.0.1: each one is reported, none counted
        "auditDenialsPerWindow": "100000",
        **settings, **issuer.settings,
    }).start()
    return Env(broker, issuer)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The default token rules, plus a maximum lifetime."""
    started = start_env(tmp_path_factory, tokenMaxLifetimeSeconds=str(MAX_LIFETIME))
    yield started
    started.broker.stop()


@pytest.fixture(scope="module")
def lenient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Tokens without ``exp`` allowed (``tokenExpiration=optional``)."""
    started = start_env(tmp_path_factory, tokenExpiration="optional")
    yield started
    started.broker.stop()


@pytest.fixture(scope="module")
def defaults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Every token rule at its default (``tokenExpiration`` not set)."""
    started = start_env(tmp_path_factory)
    yield started
    started.broker.stop()


def plain_refusal(env: Env, message: bytes) -> str:
    """PLAIN handshake + ``message``: SASL_AUTHENTICATION_FAILED, then closed."""
    conn = env.connect()
    try:
        assert conn.handshake("PLAIN").error_code == NONE
        answer = conn.authenticate(message)
        assert answer.error_code == SASL_AUTHENTICATION_FAILED, answer
        assert conn.closed_by_peer()
        return str(answer.error_message)
    finally:
        conn.close()


def bearer_refusal(env: Env, message: bytes) -> str:
    """OAUTHBEARER: the RFC 7628 error challenge, then SASL_AUTHENTICATION_FAILED."""
    return rejected(env.sasl, message)


def bearer_login(env: Env, token: str, **extensions: str) -> SaslAuthenticateResponse:
    return good_login(env.sasl, token, **extensions)


def first_client_error(env: Env, **settings: str) -> confluent_kafka.KafkaError:
    """The first error a librdkafka producer logging in with ``settings`` reports."""
    errors: list[confluent_kafka.KafkaError] = []
    producer = confluent_kafka.Producer({
        "bootstrap.servers": f"127.0.0.1:{env.sasl}", "security.protocol": "SASL_PLAINTEXT",
        **settings, "error_cb": errors.append})
    deadline = time.monotonic() + 15
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    del producer
    assert errors
    return errors[0]


def assert_log_lines_bounded(env: Env, mark: int, limit: int = 3000) -> None:
    lines = env.broker.lines[mark:]
    assert lines
    assert max(len(line) for line in lines) < limit, max(lines, key=len)[:300]


# -- 3: oversized credentials -----------------------------------------------------------

@pytest.mark.parametrize("message", [
    pytest.param(plain_message("acme", "A" * HUGE + ":x"), id="60 KB password method"),
    pytest.param(plain_message("acme", "token:" + "A" * HUGE), id="60 KB token"),
    pytest.param(plain_message("B" * HUGE, "token:x"), id="60 KB username"),
])
def test_huge_plain_credentials_get_a_bounded_refusal(env: Env, message: bytes) -> None:
    mark = len(env.broker.lines)
    reason = plain_refusal(env, message)
    assert reason.startswith("Authentication failed") and len(reason) < 400, reason[:500]
    env.broker.wait_for_log(r"SASL PLAIN login from .* failed", after=mark)
    assert_log_lines_bounded(env, mark)
    logged = reason.removeprefix("Authentication failed: ")
    env.audit(lambda e: e["mechanism"] == "PLAIN" and e["reason"] == logged)
    assert env.broker.alive()


def test_huge_oauthbearer_extension_key_gets_a_bounded_refusal(env: Env) -> None:
    mark = len(env.broker.lines)
    message = bearer_message(env.issuer.token("app"), **{"k" * HUGE: "bad\x00value"})
    reason = bearer_refusal(env, message)
    assert "bad value" in reason and len(reason) < 400, reason[:500]
    env.broker.wait_for_log(r"SASL OAUTHBEARER login from .* failed", after=mark)
    assert_log_lines_bounded(env, mark)


def test_huge_oauthbearer_extension_value_is_logged_bounded(env: Env) -> None:
    mark = len(env.broker.lines)
    bearer_login(env, env.issuer.token("app"), note="v" * HUGE)
    env.broker.wait_for_log(r"OAUTHBEARER token accepted: principal app", after=mark)
    assert_log_lines_bounded(env, mark)


def test_stock_client_with_a_huge_password_gets_an_authentication_error(env: Env) -> None:
    """librdkafka sees SASL_AUTHENTICATION_FAILED (before: a closed connection, retried as
    a transport error)."""
    error = first_client_error(env, **{"sasl.mechanisms": "PLAIN", "sasl.username": "acme",
                                       "sasl.password": "P" * HUGE + ":x"})
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION, error.str()
    assert "unsupported authentication method" in error.str()


# -- 4: log injection -------------------------------------------------------------------

def test_crlf_in_an_extension_forges_no_log_line(env: Env) -> None:
    mark = len(env.broker.lines)
    bearer_login(env, env.issuer.token("app"), note="x\r\n" + FORGED)
    line = env.broker.wait_for_log(r"OAUTHBEARER token accepted: principal app, .*note=x",
                                   after=mark)
    assert "x\\r\\n" + FORGED in line
    assert not any(line.startswith(FORGED) for line in env.broker.lines[mark:])


def test_crlf_in_a_username_forges_no_log_line(lenient: Env) -> None:
    """(On the broker with few failed logins, so that no rate limit of repeated warnings
    hides the line this test reads.)"""
    mark = len(lenient.broker.lines)
    plain_refusal(lenient, plain_message("evil\r\n" + FORGED,
                                         "token:" + lenient.issuer.token()))
    lenient.broker.wait_for_log(r"tenant evil\\r\\n2026", after=mark)
    assert not any(line.startswith(FORGED) for line in lenient.broker.lines[mark:])


# -- 7: tenant names --------------------------------------------------------------------

@pytest.mark.parametrize("username", [".", "..", "../ns", "acme/..", "acme/.", "a:b"])
def test_dot_tenants_are_refused(env: Env, username: str) -> None:
    reason = plain_refusal(env, plain_message(username, "token:" + env.issuer.token()))
    assert "invalid username" in reason and "not '.' or '..'" in reason


@pytest.mark.parametrize("tenant", [".", ".."])
def test_dot_tenant_extension_is_refused(env: Env, tenant: str) -> None:
    reason = bearer_refusal(env, bearer_message(env.issuer.token("app"), tenant=tenant))
    assert "invalid tenant in extension 'tenant'" in reason


def test_stock_client_with_a_dot_tenant_is_refused(env: Env) -> None:
    error = first_client_error(env, **{"sasl.mechanisms": "PLAIN", "sasl.username": "..",
                                       "sasl.password": "token:" + env.issuer.token()})
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION, error.str()
    assert "invalid username" in error.str()


SYSTEM_NAMESPACE_REASON = "namespace '__kafka' holds the broker's own topics"


@pytest.mark.parametrize("username", ["public/__kafka", "acme/__kafka"])
def test_a_login_into_the_system_namespace_is_refused(env: Env, username: str) -> None:
    """kafkaMetadataNamespace (``__kafka``) holds the broker's topics, refused to every
    login's topics: a PLAIN username naming it is refused at login, not accepted into a
    namespace where every topic is then refused."""
    reason = plain_refusal(env, plain_message(username, "token:" + env.issuer.token()))
    assert "invalid username" in reason and SYSTEM_NAMESPACE_REASON in reason


def test_stock_client_logging_into_the_system_namespace_is_refused(env: Env) -> None:
    error = first_client_error(env, **{"sasl.mechanisms": "PLAIN",
                                       "sasl.username": "public/__kafka",
                                       "sasl.password": "token:" + env.issuer.token()})
    assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION, error.str()
    assert SYSTEM_NAMESPACE_REASON in error.str()


def test_the_reserved_namespace_follows_kafka_metadata_namespace(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """With kafkaMetadataNamespace=sys, ``acme/sys`` is refused and ``acme/__kafka`` is an
    ordinary namespace."""
    started = start_env(tmp_path_factory, kafkaMetadataNamespace="sys")
    try:
        reason = plain_refusal(started, plain_message("acme/sys",
                                                      "token:" + started.issuer.token()))
        assert "namespace 'sys' holds the broker's own topics" in reason
        conn = started.connect()
        try:
            assert conn.login("acme/__kafka", started.issuer.token()).error_code == NONE
        finally:
            conn.close()
    finally:
        started.broker.stop()


# -- 8: a second SaslHandshake ----------------------------------------------------------

def mid_login(env: Env, conn: SecureConnection) -> str:
    assert conn.handshake("PLAIN").error_code == NONE
    return "PLAIN"


def after_error_challenge(env: Env, conn: SecureConnection) -> str:
    assert conn.handshake("OAUTHBEARER").error_code == NONE
    assert conn.authenticate(bearer_message("not.a.token")).error_code == NONE
    return "OAUTHBEARER"


def mid_reauthentication(env: Env, conn: SecureConnection) -> str:
    conn.login("acme", env.issuer.token())
    assert conn.handshake("PLAIN").error_code == NONE  # re-authentication begins
    return "PLAIN"


@pytest.mark.parametrize("prelude", [mid_login, after_error_challenge, mid_reauthentication])
def test_handshake_during_an_exchange_is_illegal_and_closes(
        env: Env, prelude: Callable[[Env, SecureConnection], str]) -> None:
    conn = env.connect()
    try:
        answer = conn.handshake(prelude(env, conn))
        assert answer.error_code == ILLEGAL_SASL_STATE and list(answer.mechanisms) == []
        assert conn.closed_by_peer()
    finally:
        conn.close()


def test_handshake_on_a_session_without_lifetime_is_answered_and_kept(
        lenient: Env) -> None:
    """Nothing to re-authenticate: Kafka's request handler answers ILLEGAL_SASL_STATE
    and the connection goes on."""
    conn = lenient.connect()
    try:
        answer = conn.login("acme", lenient.issuer.token(expires_in=None))
        assert answer.session_lifetime_ms == 0
        second = conn.handshake("PLAIN")
        assert second.error_code == ILLEGAL_SASL_STATE and list(second.mechanisms) == []
        assert conn.metadata(None).brokers
    finally:
        conn.close()


def test_sasl_requests_on_a_listener_without_sasl_are_answered_and_kept(env: Env) -> None:
    conn = SecureConnection(env.broker.ports["PLAINTEXT"])
    try:
        assert conn.handshake("PLAIN").error_code == ILLEGAL_SASL_STATE
        answer = conn.authenticate(b"\x00a\x00b")
        assert answer.error_code == ILLEGAL_SASL_STATE
        assert conn.metadata(None).brokers
    finally:
        conn.close()


def test_authenticate_after_login_is_answered_and_kept(env: Env) -> None:
    conn = env.connect()
    try:
        conn.login("acme", env.issuer.token())
        answer = conn.call(SaslAuthenticateRequest[2](auth_bytes=b"x"), 2,
                           SaslAuthenticateResponse)
        assert answer.error_code == ILLEGAL_SASL_STATE and answer.error_message
        assert conn.metadata(None).brokers
        assert not conn.closed_after_request(MetadataRequest[1](topics=None), 1)
    finally:
        conn.close()


# -- 9: tokens without exp --------------------------------------------------------------

def test_tokens_without_exp_are_refused_by_default(env: Env) -> None:
    token = env.issuer.token(expires_in=None)
    assert "token has no 'exp' claim" in plain_refusal(
        env, plain_message("acme", "token:" + token))
    assert "token has no 'exp' claim" in bearer_refusal(env, bearer_message(token))


def test_refusing_a_token_without_exp_names_the_key_that_accepts_it(defaults: Env) -> None:
    token = defaults.issuer.token(expires_in=None)
    reason = "token has no 'exp' claim (tokenExpiration=OPTIONAL accepts tokens without one)"
    assert reason in plain_refusal(defaults, plain_message("acme", "token:" + token))
    assert reason in bearer_refusal(defaults, bearer_message(token))


EXP_NOTICE = "token logins refuse tokens without an 'exp' claim"


def test_start_up_says_once_that_tokens_without_exp_are_refused(
        defaults: Env, env: Env, lenient: Env) -> None:
    """One INFO line at start-up while tokenExpiration is left at its default (with or
    without a maximum lifetime); none once the operator set the key."""
    for started in (defaults, env):
        notes = [line for line in started.broker.lines if EXP_NOTICE in line]
        assert len(notes) == 1, notes
        assert " INFO edge.broker: " in notes[0]
        assert "set tokenExpiration=OPTIONAL to accept them" in notes[0]
    assert not any(EXP_NOTICE in line for line in lenient.broker.lines)


def test_the_exp_notice_needs_a_token_key_and_the_default(tmp_path: Path) -> None:
    """The note's conditions, on configurations as ``load_config`` reads them: a token key
    and tokenExpiration not set, whether from the file or the command line."""
    secret = "tokenSecretKey=data:;base64,c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMy"

    def notice(*overrides: str, text: str | None = None) -> str | None:
        path = None
        if text is not None:
            path = tmp_path / "broker.properties"
            path.write_text(text)
        config = load_config(path, overrides)
        return token_expiration_notice(config, token_validator(config))

    assert notice(secret) is not None and EXP_NOTICE in str(notice(secret))
    assert notice(secret, "tokenMaxLifetimeSeconds=60") is not None
    assert notice() is None
    assert notice(secret, "tokenExpiration=required") is None
    assert notice(secret, "tokenExpiration=OPTIONAL") is None
    assert notice(secret, text="tokenExpiration = REQUIRED\n") is None
    assert notice(text=secret + "\n") is not None


def test_tokens_without_exp_are_accepted_when_optional(lenient: Env) -> None:
    token = lenient.issuer.token(expires_in=None)
    conn = lenient.connect()
    try:
        assert conn.login("acme", token).session_lifetime_ms == 0
    finally:
        conn.close()
    assert bearer_login(lenient, token).error_code == NONE


def test_tokens_living_too_long_are_refused(env: Env) -> None:
    now = int(time.time())
    long_lived = env.issuer.token(expires_in=MAX_LIFETIME + 600)
    assert "exceeds the maximum of 7200 s" in plain_refusal(
        env, plain_message("acme", "token:" + long_lived))
    assert "exceeds the maximum" in bearer_refusal(env, bearer_message(long_lived))
    issued_long_ago = env.issuer.token(expires_in=600, iat=now - MAX_LIFETIME)
    assert "exceeds the maximum" in plain_refusal(
        env, plain_message("acme", "token:" + issued_long_ago))
    conn = env.connect()
    try:
        conn.login("acme", env.issuer.token(expires_in=600, iat=now - 60))
    finally:
        conn.close()


def test_a_future_iat_does_not_stretch_the_maximum_lifetime(env: Env) -> None:
    now = int(time.time())
    month = 30 * 86400
    # Valid for a month, claiming to be issued a minute before it expires.
    stretched = env.issuer.token(expires_in=month, iat=now + month - 60)
    assert "'iat' is" in plain_refusal(env, plain_message("acme", "token:" + stretched))
    assert "in the future" in bearer_refusal(env, bearer_message(stretched))
    # An iat ahead of the broker's clock by more than the skew allowed (0 s for PLAIN).
    ahead = env.issuer.token(expires_in=600, iat=now + 120)
    assert "in the future" in plain_refusal(env, plain_message("acme", "token:" + ahead))


# -- 10: the audit trail ----------------------------------------------------------------

@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "GSSAPI"])
def test_unsupported_mechanisms_are_audited(env: Env, mechanism: str) -> None:
    conn = env.connect()
    try:
        assert conn.handshake(mechanism).error_code == UNSUPPORTED_SASL_MECHANISM
        assert conn.closed_by_peer()
    finally:
        conn.close()
    event = env.audit(lambda e: e["mechanism"] == mechanism)[0]
    assert (event["kind"], event["outcome"]) == ("authentication", "failure")
    assert "not enabled" in str(event["reason"])


def test_stock_scram_client_is_audited(env: Env) -> None:
    error = first_client_error(env, **{"sasl.mechanisms": "SCRAM-SHA-512",
                                       "sasl.username": "scram-tenant",
                                       "sasl.password": "secret"})
    assert "Unsupported SASL mechanism" in error.str()
    event = env.audit(lambda e: e["mechanism"] == "SCRAM-SHA-512")[0]
    assert (event["kind"], event["outcome"]) == ("authentication", "failure")


def claiming(tenant: str) -> Callable[[Event], bool]:
    return lambda event: event["tenant"] == tenant


def test_failed_logins_are_audited_with_the_claimed_tenant(env: Env) -> None:
    plain_refusal(env, plain_message("claimed-t/ns", "token:" + env.issuer.token(
        expires_in=-30)))
    bearer_refusal(env, bearer_message("not.a.token", tenant="claimed-b"))
    plain_refusal(env, plain_message("..", "token:x"))
    for tenant in ("claimed-t", "claimed-b", ".."):
        event = env.audit(claiming(tenant))[0]
        assert (event["kind"], event["outcome"]) == ("authentication", "failure"), event


def test_oauthbearer_logins_are_audited_with_their_tenant(env: Env) -> None:
    bearer_login(env, env.issuer.token("bearer-default"))
    bearer_login(env, env.issuer.token("bearer-acme"), tenant="acme")
    default = env.audit(lambda e: e["principal"] == "bearer-default")[0]
    acme = env.audit(lambda e: e["principal"] == "bearer-acme")[0]
    assert (default["outcome"], default["tenant"]) == ("success", "public")
    assert (acme["outcome"], acme["tenant"]) == ("success", "acme")


# -- the order before a login: one ApiVersions, then SaslHandshake ------------------------

def api_versions(conn: SecureConnection, version: int = 3) -> int:
    return int(conn.call(ApiVersionsRequest[version](), version,
                         ApiVersionsResponse).error_code)


def test_a_second_api_versions_before_the_handshake_closes(env: Env) -> None:
    """Kafka answers one ApiVersions before SaslHandshake (SaslServerAuthenticator's
    HANDSHAKE_OR_VERSIONS_REQUEST, then HANDSHAKE_REQUEST); a second one closes the
    connection (it used to be answered 2,000 times over)."""
    conn = env.connect()
    try:
        assert api_versions(conn) == NONE
        conn.send_frame(conn.request_bytes(ApiVersionsRequest[3](), 3))
        assert conn.closed_by_peer()
    finally:
        conn.close()
    env.broker.wait_for_log(r"ApiVersions repeated before SaslHandshake")
    env.audit(lambda e: e["kind"] == "connection"
              and e["reason"] == "ApiVersions repeated before SaslHandshake")


def test_api_versions_during_the_exchange_closes(env: Env) -> None:
    conn = env.connect()
    try:
        assert api_versions(conn) == NONE
        assert conn.handshake("PLAIN").error_code == NONE
        conn.send_frame(conn.request_bytes(ApiVersionsRequest[0](), 0))
        assert conn.closed_by_peer()
    finally:
        conn.close()
    env.broker.wait_for_log(r"ApiVersions during a SASL exchange")


def test_an_api_versions_of_a_version_not_served_may_be_retried(env: Env) -> None:
    """A client asking a version the broker does not serve gets UNSUPPORTED_VERSION and
    asks again lower (librdkafka, the Java client): that does not use up the one allowed."""
    conn = env.connect()
    try:
        conn.correlation_id += 1
        header = struct.pack(">hhih", 18, 99, conn.correlation_id, 3) + b"raw" + b"\x00"
        conn.send_frame(header + b"\x00\x00\x00")  # two empty compact strings, no tags
        frame = conn.read_frame()
        assert ApiVersionsResponse[0].decode(frame[4:]).error_code == UNSUPPORTED_VERSION
        assert api_versions(conn) == NONE
        assert conn.login("acme", env.issuer.token()).error_code == NONE
        assert conn.metadata(None).brokers
        assert api_versions(conn) == NONE  # logged in: as often as it likes
    finally:
        conn.close()


def test_rejected_requests_and_expired_sessions_are_audited(lenient: Env) -> None:
    conn = lenient.connect()
    try:
        answer = conn.login("expiring", lenient.issuer.token(expires_in=1))
        wait_past_session(time.time(), answer.session_lifetime_ms)
        assert conn.closed_after_request(MetadataRequest[1](topics=None), 1)
    finally:
        conn.close()
    event = lenient.audit(lambda e: e["tenant"] == "expiring" and e["kind"] == "connection")[0]
    assert event["outcome"] == "rejected" and "expired" in str(event["reason"])


def test_issuer_tokens_living_too_long_are_refused(tmp_path: Path) -> None:
    """``tokenMaxLifetimeSeconds`` also bounds tokens checked with the issuer's JWKS."""
    issuer = make_issuer()
    try:
        broker = start_broker(tmp_path, oauth_file(tmp_path, issuer.url),
                              tokenMaxLifetimeSeconds="600")
        try:
            assert "exceeds the maximum of 600 s" in rejected(
                broker.port, bearer_message(issuer_token(issuer)))  # an hour's token
            now = int(time.time())
            short = issuer_token(issuer, iat=now, exp=now + 300)
            assert good_login(broker.port, short).error_code == NONE
            stretched = issuer_token(issuer, iat=now + 86400 - 60, exp=now + 86400,
                                     nbf=None)
            assert "in the future (clock skew allowed: 30 s)" in rejected(
                broker.port, bearer_message(stretched))
            # An issuer whose clock runs ahead within the skew: measured from its iat.
            skewed = issuer_token(issuer, iat=now + 10, nbf=now + 10, exp=now + 600)
            assert good_login(broker.port, skewed).error_code == NONE
        finally:
            broker.stop()
    finally:
        issuer.stop()
