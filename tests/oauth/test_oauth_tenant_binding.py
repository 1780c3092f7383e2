"""``oauth.tenant.claim`` binds a token to its tenant on every mechanism: a token whose
claim names tenant ``acme`` logs in to ``acme`` only, by PLAIN (``token:<JWT>``, the
username naming the tenant) as by OAUTHBEARER (a ``tenant`` extension naming another
tenant is refused, not ignored). A token without the claim logs in to the tenant the
client names, as the README states."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka
import pytest

from oauth.dev_issuer import DevIssuer
from tests.broker_process import BrokerProcess
from tests.clients import Rec
from tests.oauth_helpers import (
    SASL_AUTHENTICATION_FAILED,
    bearer_message,
    good_login,
    issuer_token,
    rejected,
)
from tests.security_helpers import Login, SecureConnection, create_topic, produce_confluent

MISMATCH = "not the one the token was issued for"


@pytest.fixture(scope="module")
def oauth_broker_settings(issuer: DevIssuer,
                          tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """PLAIN beside OAUTHBEARER on the listener, checking the same issuer's tokens (its
    signing key as ``tokenPublicKey``)."""
    pem = Path(tmp_path_factory.mktemp("issuer-key")) / "issuer-public.pem"
    pem.write_bytes(issuer.keys.current.as_pem(private=False))
    return {"saslAllowedMechanisms": "PLAIN,OAUTHBEARER", "tokenPublicKey": pem.as_uri(),
            "failedAuthenticationDelayMs": "0"}


def plain_answer(broker: BrokerProcess, username: str, token: str) -> tuple[int, str]:
    conn = SecureConnection(broker.port)
    try:
        answer = conn.attempt_login(username, token)
        return answer.error_code, str(answer.error_message)
    finally:
        conn.close()


def test_plain_logs_in_to_the_tokens_tenant_only(broker: BrokerProcess,
                                                 issuer: DevIssuer, topic_name: str) -> None:
    acme_token = issuer_token(issuer, "acme-app")  # claim tenant=acme
    code, reason = plain_answer(broker, "victim", acme_token)
    assert (code, MISMATCH in reason) == (SASL_AUTHENTICATION_FAILED, True), reason
    assert plain_answer(broker, "victim/default", acme_token)[0] == SASL_AUTHENTICATION_FAILED

    # A real client: refused as victim, served as acme.
    errors: list[str] = []
    producer = confluent_kafka.Producer({
        **Login(broker.bootstrap, "SASL_PLAINTEXT", "victim", acme_token).confluent(),
        "error_cb": lambda e: errors.append(e.str()), "message.timeout.ms": 3000})
    delivered: list[object] = []
    producer.produce(topic_name, b"never", on_delivery=lambda err, _m: delivered.append(err))
    producer.flush(10)
    assert len(delivered) == 1 and delivered[0] is not None  # timed out, never written
    assert any(MISMATCH in e for e in errors), errors
    acme = Login(broker.bootstrap, "SASL_PLAINTEXT", "acme", acme_token)
    create_topic(acme, topic_name, 1)
    produce_confluent(acme, topic_name, [Rec(0, None, b"acme's", (), 1_700_000_000_000)])
    assert (broker.data_dir / "topics" / "acme" / "default" / topic_name).is_dir()
    assert not (broker.data_dir / "topics" / "victim").exists()
    broker.wait_for_log(r"logged in as acme-app \(tenant acme\)")


def test_a_conflicting_tenant_extension_is_refused(broker: BrokerProcess,
                                                   issuer: DevIssuer) -> None:
    acme_token = issuer_token(issuer, "acme-app")
    assert MISMATCH in rejected(broker.port, bearer_message(acme_token, tenant="victim"))
    assert good_login(broker.port, acme_token, tenant="acme").error_code == 0
    assert good_login(broker.port, acme_token).error_code == 0


def test_a_token_without_the_claim_uses_the_named_tenant(broker: BrokerProcess,
                                                         issuer: DevIssuer) -> None:
    unbound = issuer_token(issuer, "app")  # the dev issuer's client 'app' has no tenant
    assert plain_answer(broker, "globex", unbound)[0] == 0
    assert good_login(broker.port, unbound, tenant="globex").error_code == 0
    broker.wait_for_log(r"logged in as app \(tenant globex\)")
