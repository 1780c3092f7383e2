"""OAuth acceptance 1 and 2: real clients log in with OAUTHBEARER against a real broker
whose tokens come from the dev issuer over HTTP on 127.0.0.1.

1. confluent-kafka with librdkafka's own OIDC support (client credentials at the issuer's
   token endpoint) produces and consumes.
2. confluent-kafka, kafka-python and aiokafka with this project's login callback produce
   and consume; the tenant comes from the token's claim or the ``tenant`` extension and
   the ``groupId`` extension reaches the broker.
"""

from __future__ import annotations

import confluent_kafka
import pytest

from oauth.adapters import confluent_oauth_cb
from oauth.dev_issuer import DevIssuer
from oauth.errors import OAuthError
from tests.broker_process import BrokerProcess
from tests.clients import present
from tests.oauth_helpers import (
    CLIENT_KINDS,
    NONE,
    BearerConnection,
    issuer_token,
    login_for,
)
from tests.security_helpers import UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture(scope="module")
def oauth_broker_settings() -> dict[str, str]:
    """The broker's own settings for this module."""
    return {"superUserRoles": "admin"}


def values(count: int, tag: str) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(count)]


def test_confluent_builtin_oidc(broker: BrokerProcess, issuer: DevIssuer,
                                topic_name: str) -> None:
    conf = {
        "bootstrap.servers": broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": "app-secret",
        "sasl.oauthbearer.token.endpoint.url": f"{issuer.url}/token",
        "sasl.oauthbearer.scope": "kafka",
    }
    sent = values(20, "oidc")
    producer = confluent_kafka.Producer({**conf, "acks": "all"})
    for value in sent:
        producer.produce(topic_name, value=value)
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({**conf, "group.id": "oidc-assign",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic_name, 0, 0)])
    got: list[bytes] = []
    try:
        while len(got) < len(sent):
            batch = consumer.consume(len(sent) - len(got), 10)
            assert batch, "no records within 10 s"
            for msg in batch:
                assert msg.error() is None, msg.error()
                got.append(present(msg.value()))
    finally:
        consumer.close()
    assert got == sent
    broker.wait_for_log(r"OAUTHBEARER token accepted: principal app, tenant \(default\)")


@pytest.mark.parametrize("kind", sorted(CLIENT_KINDS))
def test_login_callback_produces_and_consumes(broker: BrokerProcess, issuer: DevIssuer,
                                              topic_name: str, kind: str) -> None:
    settings, produce, consume = CLIENT_KINDS[kind]
    conf = settings(broker.bootstrap, login_for(issuer, "app", "app-secret"))
    sent = values(15, kind)
    produce(conf, topic_name, sent)
    assert consume(conf, topic_name, len(sent)) == sent
    assert (broker.data_dir / "topics" / "public" / "default" / topic_name).is_dir()


@pytest.mark.parametrize("kind", sorted(CLIENT_KINDS))
def test_tenant_claim_and_group_extension(broker: BrokerProcess, issuer: DevIssuer,
                                          topic_name: str, kind: str) -> None:
    settings, produce, consume = CLIENT_KINDS[kind]
    group = f"billing-{kind.replace('-', '')}"
    login = login_for(issuer, "acme-app", "acme-secret", tenant="acme", group_id=group)
    conf = settings(broker.bootstrap, login)
    sent = values(10, kind)
    produce(conf, topic_name, sent)
    assert consume(conf, topic_name, len(sent)) == sent
    assert (broker.data_dir / "topics" / "acme" / "default" / topic_name).is_dir()
    assert not (broker.data_dir / "topics" / "public" / "default" / topic_name).exists()
    broker.wait_for_log(r"OAUTHBEARER token accepted: principal acme-app, tenant acme, "
                        rf"extensions \[groupId={group}, tenant=acme\]")
    broker.wait_for_log(r"logged in as acme-app \(tenant acme\)")
    # A superuser of the default tenant sees the topic by its full name.
    admin = BearerConnection(broker.port)
    try:
        admin.login(issuer_token(issuer, "admin"))
        (topic,) = admin.metadata([f"acme/default/{topic_name}"]).topics
        assert topic.error_code == NONE
        (short,) = admin.metadata([topic_name]).topics
        # the short name is the default tenant's own topic, which does not exist
        assert short.error_code == UNKNOWN_TOPIC_OR_PARTITION
    finally:
        admin.close()


def test_tenant_from_extension_when_the_token_has_no_claim(
        broker: BrokerProcess, issuer: DevIssuer, topic_name: str) -> None:
    settings, produce, consume = CLIENT_KINDS["confluent"]
    login = login_for(issuer, "app", "app-secret", tenant="globex", group_id="reports")
    assert login.extensions() == {"tenant": "globex", "groupId": "reports"}
    conf = settings(broker.bootstrap, login)
    produce(conf, topic_name, values(3, "globex"))
    assert consume(conf, topic_name, 3) == values(3, "globex")
    assert (broker.data_dir / "topics" / "globex" / "default" / topic_name).is_dir()
    broker.wait_for_log(r"OAUTHBEARER token accepted: principal app, tenant globex, "
                        r"extensions \[groupId=reports, tenant=globex\]")


def test_bad_client_secret_fails_login_with_the_issuer_error(issuer: DevIssuer) -> None:
    login = login_for(issuer, "app", "wrong-secret")
    with pytest.raises(OAuthError, match=r"^invalid_client: bad secret$"):
        login.token()
    with pytest.raises(OAuthError, match=r"^invalid_client: bad secret$"):
        confluent_oauth_cb(login)("")
