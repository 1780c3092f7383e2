"""Helpers for the OAuth tests (no tests here): a dev issuer on loopback, a broker with an
OAUTHBEARER listener checking that issuer's tokens, raw OAUTHBEARER logins, and
produce/consume through the three clients with this project's login callback."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from oauth.adapters import confluent_config
from oauth.aiokafka_provider import AioKafkaTokenProvider
from oauth.dev_issuer import DevClient, DevIssuer
from oauth.kafka_python_provider import KafkaPythonTokenProvider
from oauth.login import ClientCredentialsLogin
from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

NONE = 0
SASL_AUTHENTICATION_FAILED = 58
ERROR_CHALLENGE = b'{"status":"invalid_token"}'
AUDIENCE = "edge-broker"
CLIENTS = (DevClient("app", "app-secret"), DevClient("acme-app", "acme-secret", "acme"),
           DevClient("admin", "admin-secret"))


def make_issuer(**kwargs: Any) -> DevIssuer:
    """A started dev issuer with the test clients and a ``tenant`` claim."""
    options: dict[str, Any] = {"clients": CLIENTS, "audience": AUDIENCE,
                               "tenant_claim": "tenant", **kwargs}
    return DevIssuer(**options).start()


def oauth_file(directory: Path, issuer_url: str, **extra: str) -> Path:
    """An ``oauth.*`` properties file for the broker (``extra``: ``a_b=x`` → ``oauth.a.b``)."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = {"oauth.issuer.url": issuer_url, "oauth.audience": AUDIENCE,
             "oauth.tenant.claim": "tenant"}
    lines.update({"oauth." + key.replace("_", "."): value for key, value in extra.items()})
    path = directory / f"oauth-{uuid.uuid4().hex[:8]}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
    return path


def start_broker(directory: Path, oauth_properties: Path, **settings: str) -> BrokerProcess:
    """A broker whose SASL_PLAINTEXT listener offers OAUTHBEARER only."""
    return BrokerProcess(directory / f"data-{uuid.uuid4().hex[:8]}", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "saslAllowedMechanisms": "OAUTHBEARER",
        "kopOauth2ConfigFile": str(oauth_properties),
        "defaultNumPartitions": "1",
        **settings,
    }).start()


def credentials_url(client_id: str, secret: str, **extra: str) -> str:
    """A ``data:application/json;base64,…`` credentials URL."""
    document = {"client_id": client_id, "client_secret": secret, **extra}
    return "data:application/json;base64," + base64.b64encode(
        json.dumps(document).encode()).decode()


def login_for(issuer: DevIssuer, client_id: str, secret: str, **extra: str) -> (
        ClientCredentialsLogin):
    """This project's login callback for one client of ``issuer``."""
    return ClientCredentialsLogin(issuer.url, credentials_url(client_id, secret, **extra),
                                  audience=AUDIENCE)


def bearer_message(token: str, header: str = "n,,", **extensions: str) -> bytes:
    """An RFC 7628 client initial response."""
    pairs = "".join(f"{k}={v}\x01" for k, v in extensions.items())
    return f"{header}\x01auth=Bearer {token}\x01{pairs}\x01".encode()


class BearerConnection(RawConnection):
    """A raw connection that logs in with OAUTHBEARER."""

    def handshake(self, mechanism: str = "OAUTHBEARER") -> Any:
        return self.call(SaslHandshakeRequest[1](mechanism=mechanism), 1,
                         SaslHandshakeResponse)

    def authenticate(self, auth_bytes: bytes) -> Any:
        return self.call(SaslAuthenticateRequest[2](auth_bytes=auth_bytes), 2,
                         SaslAuthenticateResponse)

    def login(self, token: str, **extensions: str) -> Any:
        """Handshake and authenticate; assert success; return the SaslAuthenticate answer."""
        assert self.handshake().error_code == NONE
        answer = self.authenticate(bearer_message(token, **extensions))
        assert answer.error_code == NONE, answer
        return answer

    def metadata(self, topics: list[str] | None) -> Any:
        wanted = None if topics is None else [
            MetadataRequest.MetadataRequestTopic(name=t, topic_id=None) for t in topics]
        return self.call(MetadataRequest[12](
            topics=wanted, allow_auto_topic_creation=False,
            include_topic_authorized_operations=False), 12, MetadataResponse)


def rejected(port: int, message: bytes) -> str:
    """Log in with ``message``; assert the RFC 7628 flow (error challenge, then 58 after
    the ``\\x01`` reply); return the error message."""
    conn = BearerConnection(port)
    try:
        assert conn.handshake().error_code == NONE
        first = conn.authenticate(message)
        assert first.error_code == NONE, first
        assert bytes(first.auth_bytes) == ERROR_CHALLENGE
        second = conn.authenticate(b"\x01")
        assert second.error_code == SASL_AUTHENTICATION_FAILED, second
        return str(second.error_message)
    finally:
        conn.close()


def good_login(port: int, token: str, **extensions: str) -> Any:
    """A successful raw login; returns the SaslAuthenticate answer."""
    conn = BearerConnection(port)
    try:
        return conn.login(token, **extensions)
    finally:
        conn.close()


def issuer_token(issuer: DevIssuer, who: str = "app", scope: str | None = None,
                 **overrides: Any) -> str:
    """A token the issuer would issue to client ``who`` (claims overridable; ``None``
    removes a claim), signed with its current key."""
    claims = issuer.claims_for(issuer.clients[who], scope)
    for name, value in overrides.items():
        if value is None:
            claims.pop(name, None)
        else:
            claims[name] = value
    return issuer.sign(claims)


# -- clients with the login callback ------------------------------------------------------

def confluent_settings(bootstrap: str, login: ClientCredentialsLogin) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            **confluent_config(login)}


def produce_confluent(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    errors: list[object] = []
    producer = confluent_kafka.Producer({**conf, "acks": "all", "linger.ms": 5})

    def report(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for value in values:
        producer.produce(topic, value=value, on_delivery=report)
        producer.poll(0)
    assert producer.flush(30) == 0
    assert errors == []


def consume_confluent(conf: dict[str, Any], topic: str, count: int,
                      timeout: float = 30) -> list[bytes]:
    consumer = confluent_kafka.Consumer({**conf, "group.id": "oauth-assign-only",
                                         "enable.auto.commit": False})
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert value is not None, msg
                got.append(value)
    finally:
        consumer.close()
    return got


def kafka_python_settings(bootstrap: str, login: ClientCredentialsLogin) -> dict[str, Any]:
    return {"bootstrap_servers": bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": KafkaPythonTokenProvider(login)}


def produce_kafka_python(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = kafka.KafkaProducer(**conf, acks="all", linger_ms=5, enable_idempotence=False)
    try:
        futures = [producer.send(topic, value=value) for value in values]
        producer.flush(30)
        for future in futures:
            future.get(10)
    finally:
        producer.close()


def consume_kafka_python(conf: dict[str, Any], topic: str, count: int,
                         timeout: float = 30) -> list[bytes]:
    consumer = kafka.KafkaConsumer(**conf, group_id=None, enable_auto_commit=False)
    tp = kafka.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < count and time.monotonic() < deadline:
            for msgs in consumer.poll(500).values():
                got.extend(m.value for m in msgs)
    finally:
        consumer.close()
    return got


def aiokafka_settings(bootstrap: str, login: ClientCredentialsLogin) -> dict[str, Any]:
    return {"bootstrap_servers": bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": AioKafkaTokenProvider(login)}


def produce_aiokafka(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(**conf, acks="all", linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send(topic, value=value) for value in values]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


def consume_aiokafka(conf: dict[str, Any], topic: str, count: int,
                     timeout: float = 30) -> list[bytes]:
    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(**conf, group_id=None, enable_auto_commit=False)
        await consumer.start()
        got: list[bytes] = []
        try:
            tp = AioTopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            deadline = time.monotonic() + timeout
            while len(got) < count and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                for msgs in batch.values():
                    got.extend(m.value for m in msgs)
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


CLIENT_KINDS = {
    "confluent": (confluent_settings, produce_confluent, consume_confluent),
    "kafka-python": (kafka_python_settings, produce_kafka_python, consume_kafka_python),
    "aiokafka": (aiokafka_settings, produce_aiokafka, consume_aiokafka),
}


def issuer_count(issuer: DevIssuer, name: str) -> int:
    """One of the dev issuer's request counters (``DevIssuer.stats``)."""
    value = issuer.stats()[name]
    assert isinstance(value, int), (name, value)
    return value
