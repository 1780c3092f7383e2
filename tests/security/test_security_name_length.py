"""Tenant and namespace names are at most 64 characters, wherever they enter: a login
naming a longer one is refused (SASL_AUTHENTICATION_FAILED, one bounded log line), a full
topic name with one is INVALID_TOPIC_EXCEPTION, a quota entity with one INVALID_REQUEST.
Before, a 5000-character tenant logged in and its CreateTopics failed in the file engine
("File name too long"): KAFKA_STORAGE_ERROR, an ERROR line and a storage alarm any client
could raise. The longest names allowed fit every engine: a 64-character tenant and
namespace with a 249-character topic are created."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse

from tests import quota_helpers as q
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection
from tests.security_helpers import (
    NONE,
    SASL_AUTHENTICATION_FAILED,
    SecureConnection,
    TokenIssuer,
)

INVALID_TOPIC_EXCEPTION = 17
INVALID_REQUEST = 42
LONGEST = 64


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, TokenIssuer]]:
    base = Path(tmp_path_factory.mktemp("name-length"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "failedAuthenticationDelayMs": "0", **issuer.settings}).start()
    yield broker, issuer
    broker.stop()


def create(conn: RawConnection, name: str) -> tuple[int, str | None]:
    request = CreateTopicsRequest[4](topics=[CreateTopicsRequest[4].CreatableTopic(
        name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
        timeout_ms=10000, validate_only=False)
    topic = conn.call(request, 4, CreateTopicsResponse).topics[0]
    return topic.error_code, topic.error_message


@pytest.mark.parametrize("username", ["t" * (LONGEST + 1), "acme/" + "n" * (LONGEST + 1),
                                      "t" * 5000])
def test_a_login_naming_a_long_tenant_or_namespace_is_refused(
        env: tuple[BrokerProcess, TokenIssuer], username: str) -> None:
    broker, issuer = env
    start = len(broker.lines)
    conn = SecureConnection(broker.ports["SASL_PLAINTEXT"])
    try:
        answer = conn.attempt_login(username, issuer.token())
    finally:
        conn.close()
    assert answer.error_code == SASL_AUTHENTICATION_FAILED
    assert f"at most {LONGEST} characters" in str(answer.error_message)
    line = broker.wait_for_log("SASL PLAIN login .* failed: invalid username", after=start)
    assert len(line) < 1500


def test_the_longest_names_fit_the_storage(env: tuple[BrokerProcess, TokenIssuer]) -> None:
    broker, issuer = env
    tenant, namespace, topic = "t" * LONGEST, "n" * LONGEST, "x" * 249
    conn = SecureConnection(broker.ports["SASL_PLAINTEXT"])
    try:
        conn.login(f"{tenant}/{namespace}", issuer.token())
        assert create(conn, topic) == (NONE, None)
    finally:
        conn.close()
    assert (broker.data_dir / "topics" / tenant / namespace / topic).is_dir()


def test_long_names_elsewhere_are_refused_without_a_storage_error(
        env: tuple[BrokerProcess, TokenIssuer]) -> None:
    broker, _ = env
    start = len(broker.lines)
    conn = RawConnection(broker.ports["PLAINTEXT"])
    try:
        for name in ("t" * 5000 + "/ns/x", "acme/" + "n" * (LONGEST + 1) + "/x"):
            code, message = create(conn, name)
            assert code == INVALID_TOPIC_EXCEPTION, message
            assert f"longer than {LONGEST} characters" in str(message)
        entities: list[q.Entity] = [{"tenant": "t" * (LONGEST + 1)},
                                    {"namespace": "acme/" + "n" * (LONGEST + 1)}]
        for entity in entities:
            [(code, message)] = q.alter(conn, [(entity, {"producer_byte_rate": 1024.0})])
            assert code == INVALID_REQUEST, message
    finally:
        conn.close()
    assert broker.alive()
    assert not [line for line in broker.lines[start:] if " ERROR " in line]
