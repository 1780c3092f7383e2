"""Helpers for the security acceptance tests: TLS material, signed tokens, SASL/TLS raw
connections, and produce/consume through the three clients with SASL and TLS settings."""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import jwt
from aiokafka.helpers import create_ssl_context
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kafka.protocol.admin import (
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from kafka.record.memory_records import MemoryRecords

from edge.certs import DEFAULT_HOSTS, Authority, make_certs
from tests import clients
from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS, Got, Rec
from tests.group_helpers import GroupConnection
from tests.raw import RawConnection, record_batch

# Kafka error codes used by the security tests.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
GROUP_ID_NOT_FOUND = 69
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
UNSUPPORTED_VERSION = 35
ILLEGAL_SASL_STATE = 34
SECURITY_DISABLED = 54
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58


# -- TLS material ------------------------------------------------------------------------

@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a test CA, a server certificate for 127.0.0.1/localhost and a client."""

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path

    def broker_settings(self) -> dict[str, str]:
        """The broker keys serving this server certificate."""
        return {"tlsCertificateFilePath": str(self.cert), "tlsKeyFilePath": str(self.key)}


def make_tls(directory: Path) -> TlsFiles:
    """Write a CA, a server certificate (SAN IP 127.0.0.1, DNS localhost) and a client
    certificate (CN client-role) into ``directory``, as ``edge-broker certs`` does."""
    files = make_certs(directory, client_cn="client-role", days=2, overwrite=True)
    assert files.client_cert is not None and files.client_key is not None
    return TlsFiles(files.ca, files.cert, files.key, files.client_cert, files.client_key)


class ClientAuthority:
    """A test CA that keeps its key: the broker's certificate and client certificates of
    any subject (``tlsTrustCertsFilePath`` is :attr:`ca`)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.authority = Authority(days=2)
        self.ca = directory / "ca.pem"
        self.ca.write_bytes(self.authority.cert.public_bytes(serialization.Encoding.PEM))
        self.cert, self.key = self._write("server", *self.authority.leaf(
            DEFAULT_HOSTS[0], DEFAULT_HOSTS))

    def _write(self, name: str, cert: bytes, key: bytes) -> tuple[Path, Path]:
        paths = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        paths[0].write_bytes(cert)
        paths[1].write_bytes(key)
        return paths

    def client(self, name: str, *attributes: tuple[x509.ObjectIdentifier, str]
               ) -> tuple[Path, Path]:
        """A client certificate and key whose subject holds ``attributes`` in that (DER)
        order."""
        subject = x509.Name([x509.NameAttribute(oid, value) for oid, value in attributes])
        return self._write(name, *self.authority.leaf(subject, ()))

    def broker_settings(self, require: bool = True) -> dict[str, str]:
        """The broker keys serving the server certificate and trusting this CA."""
        return {"tlsCertificateFilePath": str(self.cert), "tlsKeyFilePath": str(self.key),
                "tlsTrustCertsFilePath": str(self.ca),
                "tlsRequireTrustedClientCertOnConnect": str(require).lower()}


# -- tokens ------------------------------------------------------------------------------

class TokenIssuer:
    """Signs tokens the broker accepts: HS256 with a random secret or RS256 with an RSA key."""

    def __init__(self, kind: str, directory: Path) -> None:
        assert kind in ("hmac", "rsa")
        self.kind = kind
        if kind == "hmac":
            self.secret = secrets.token_bytes(32)
            self.signing_key: Any = self.secret
            self.algorithm = "HS256"
            self.settings = {
                "tokenSecretKey": "data:;base64," + base64.b64encode(self.secret).decode()}
        else:
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            self.signing_key = key
            self.algorithm = "RS256"
            directory.mkdir(parents=True, exist_ok=True)
            public = directory / "token-public.pem"
            public.write_bytes(key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
            self.settings = {"tokenPublicKey": public.resolve().as_uri()}

    def token(self, sub: str | None = "alice", expires_in: float | None = 3600,
              **claims: Any) -> str:
        """A signed token for role ``sub`` expiring in ``expires_in`` seconds (None: never)."""
        body: dict[str, Any] = dict(claims)
        if sub is not None:
            body["sub"] = sub
        if expires_in is not None:
            body["exp"] = int(time.time() + expires_in)
        return jwt.encode(body, self.signing_key, algorithm=self.algorithm)


def plain_message(username: str, password: str, authzid: str = "") -> bytes:
    """An RFC 4616 PLAIN message."""
    return f"{authzid}\x00{username}\x00{password}".encode()


# -- raw connections ---------------------------------------------------------------------

class SecureConnection(RawConnection):
    """A RawConnection, optionally over TLS, with SASL PLAIN login helpers."""

    def __init__(self, port: int, ca: Path | None = None, timeout: float = 10.0,
                 source: str | None = None) -> None:
        super().__init__(port, timeout=timeout, source=source)
        if ca is not None:
            context = ssl.create_default_context(cafile=str(ca))
            self.sock = context.wrap_socket(self.sock, server_hostname="localhost")

    def handshake(self, mechanism: str = "PLAIN", version: int = 1) -> Any:
        return self.call(SaslHandshakeRequest[version](mechanism=mechanism), version,
                         SaslHandshakeResponse)

    def authenticate(self, auth_bytes: bytes, version: int = 2) -> Any:
        return self.call(SaslAuthenticateRequest[version](auth_bytes=auth_bytes), version,
                         SaslAuthenticateResponse)

    def attempt_login(self, username: str, token: str, version: int = 2) -> Any:
        """Handshake v1 and SaslAuthenticate a PLAIN ``token:`` login; the answer."""
        hand = self.handshake("PLAIN")
        assert hand.error_code == NONE, hand
        return self.authenticate(plain_message(username, "token:" + token), version)

    def login(self, username: str, token: str, version: int = 2) -> Any:
        """:meth:`attempt_login`, which must succeed."""
        answer = self.attempt_login(username, token, version)
        assert answer.error_code == NONE, answer
        return answer

    def metadata(self, topics: list[str] | None = None, version: int = 12,
                 auto_create: bool = False) -> Any:
        wanted: list[MetadataRequest.MetadataRequestTopic] | None
        if version >= 1 and topics is not None:
            wanted = [MetadataRequest.MetadataRequestTopic(name=t, **(
                {"topic_id": None} if version >= 10 else {})) for t in topics]
        else:
            wanted = None if version >= 1 else [
                MetadataRequest.MetadataRequestTopic(name=t) for t in topics or []]
        kwargs: dict[str, Any] = {"topics": wanted}
        if version >= 4:
            kwargs["allow_auto_topic_creation"] = auto_create
        if 8 <= version <= 10:
            kwargs["include_cluster_authorized_operations"] = False
        if version >= 8:
            kwargs["include_topic_authorized_operations"] = False
        return self.call(MetadataRequest[version](**kwargs), version, MetadataResponse)

    def closed_after_request(self, request: Any, version: int, timeout: float = 5.0) -> bool:
        """Send ``request``; True if the broker closes the connection without answering."""
        try:
            self.send_frame(self.request_bytes(request, version))
        except OSError:
            return True
        self.sock.settimeout(timeout)
        try:
            self.read_frame()
        except (ConnectionError, ssl.SSLError, OSError):
            return True
        return False


def raw_frame(conn: RawConnection, payload: bytes) -> None:
    """Send ``payload`` behind a size prefix."""
    conn.sock.sendall(struct.pack(">i", len(payload)) + payload)


def login_error(port: int, username: str, token: str) -> int:
    """The error code of a PLAIN login on a new connection (closed after it)."""
    conn = SecureConnection(port, timeout=60)
    try:
        return int(conn.attempt_login(username, token).error_code)
    finally:
        conn.close()


# -- client configs ----------------------------------------------------------------------

@dataclass(frozen=True)
class Login:
    """Where and how a client logs in."""

    bootstrap: str
    protocol: str  # SASL_PLAINTEXT or SASL_SSL
    username: str
    token: str
    ca: Path | None = None

    def confluent(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "security.protocol": self.protocol,
            "sasl.mechanisms": "PLAIN", "sasl.username": self.username,
            "sasl.password": "token:" + self.token,
        }
        if self.protocol.endswith("SSL"):
            conf["ssl.ca.location"] = str(self.ca)
        return conf

    def kafka_python(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap, "security_protocol": self.protocol,
            "sasl_mechanism": "PLAIN", "sasl_plain_username": self.username,
            "sasl_plain_password": "token:" + self.token,
        }
        if self.protocol.endswith("SSL"):
            conf["ssl_cafile"] = str(self.ca)
        return conf

    def aiokafka(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap, "security_protocol": self.protocol,
            "sasl_mechanism": "PLAIN", "sasl_plain_username": self.username,
            "sasl_plain_password": "token:" + self.token,
        }
        if self.protocol.endswith("SSL"):
            conf["ssl_context"] = create_ssl_context(cafile=str(self.ca))
        return conf


def admin(login: Login) -> AdminClient:
    return AdminClient(login.confluent())


def create_topic(login: Login, name: str, partitions: int = PARTITIONS) -> None:
    client = admin(login)
    futures = client.create_topics([NewTopic(name, partitions, 1)])
    futures[name].result(30)
    del client


# -- producers and consumers: tests.clients' helpers, logged in -------------------------

def produce_confluent(login: Login, topic: str, recs: list[Rec]) -> None:
    clients.produce_confluent(login.bootstrap, topic, recs, "none", conf=login.confluent())


def produce_kafka_python(login: Login, topic: str, recs: list[Rec]) -> None:
    clients.produce_kafka_python(login.bootstrap, topic, recs, "none",
                                 conf=login.kafka_python())


def produce_aiokafka(login: Login, topic: str, recs: list[Rec]) -> None:
    clients.produce_aiokafka(login.bootstrap, topic, recs, "none", conf=login.aiokafka())


def consume_confluent(login: Login, topic: str, count: int, partitions: int = PARTITIONS,
                      timeout: float = 30) -> list[Got]:
    return clients.consume_confluent(login.bootstrap, topic, count, partitions, timeout,
                                     conf=login.confluent())


def consume_kafka_python(login: Login, topic: str, count: int, partitions: int = PARTITIONS,
                         timeout: float = 30) -> list[Got]:
    return clients.consume_kafka_python(login.bootstrap, topic, count, partitions, timeout,
                                        conf=login.kafka_python())


def consume_aiokafka(login: Login, topic: str, count: int, partitions: int = PARTITIONS,
                     timeout: float = 30) -> list[Got]:
    return clients.consume_aiokafka(login.bootstrap, topic, count, partitions, timeout,
                                    conf=login.aiokafka())


PRODUCERS: dict[str, Callable[[Login, str, list[Rec]], None]] = {
    "confluent": produce_confluent, "kafka-python": produce_kafka_python,
    "aiokafka": produce_aiokafka}
CONSUMERS: dict[str, Callable[..., list[Got]]] = {
    "confluent": consume_confluent, "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka}


def check_roundtrip(recs: list[Rec], got: list[Got]) -> None:
    """Every record came back once, byte for byte, at offsets 0..n-1 of its partition."""
    by_partition: dict[int, list[Got]] = {}
    for g in got:
        by_partition.setdefault(g.partition, []).append(g)
    expected: dict[int, list[Rec]] = {}
    for rec in recs:
        expected.setdefault(rec.partition, []).append(rec)
    assert sorted(by_partition) == sorted(expected)
    for partition, recs_of in expected.items():
        came = sorted(by_partition[partition], key=lambda g: g.offset)
        assert [g.offset for g in came] == list(range(len(recs_of)))
        assert [g.rec for g in came] == recs_of


AUDIT_TOPIC = "public/__kafka/__audit"


def audit_events(bootstrap: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Every event in the audit topic now (up to its high watermark), read with
    confluent-kafka by a caller that may read it (a superuser, or a connection without a
    tenant login while authorization is disabled)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap,
                                         "group.id": "audit-reader", "enable.auto.commit": False})
    try:
        partition = confluent_kafka.TopicPartition(AUDIT_TOPIC, 0)
        _low, high = consumer.get_watermark_offsets(partition, timeout)
        consumer.assign([confluent_kafka.TopicPartition(AUDIT_TOPIC, 0, 0)])
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(events) < high and time.monotonic() < deadline:
            events += [json.loads(clients.known_bytes(m.value()))
                       for m in consumer.consume(100, 0.5) if m.error() is None]
        assert len(events) >= high, f"read {len(events)} of {high} audit events"
        return events
    finally:
        consumer.close()


# -- one method per request, for attack and ACL tests ------------------------------------

TOPIC_RESOURCE = 2


class OpsConnection(SecureConnection, GroupConnection):
    """A SecureConnection with one method per topic/group request (errors as ints)."""

    def produce(self, topic: str, count: int = 1, partition: int = 0,
                value: bytes = b"v") -> int:
        data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=record_batch(count, value=value))])
        answer = self.call(ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=5000,
                                             topic_data=[data]), 9, ProduceResponse)
        return int(answer.responses[0].partition_responses[0].error_code)

    def fetch(self, topic: str, partition: int = 0, offset: int = 0
              ) -> tuple[int, list[tuple[int, bytes | None, bytes | None]]]:
        """(error, [(offset, key, value)]) of one partition from ``offset``."""
        parts = [FetchRequest.FetchTopic.FetchPartition(
            partition=partition, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)]
        request = FetchRequest[12](replica_id=-1, max_wait_ms=0, min_bytes=1,
                                   max_bytes=1 << 20, isolation_level=0, session_id=0,
                                   session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                       topic=topic, partitions=parts)],
                                   forgotten_topics_data=[], rack_id="")
        answer = self.call(request, 12, FetchResponse)
        part = answer.responses[0].partitions[0]
        found: list[tuple[int, bytes | None, bytes | None]] = []
        if part.records:
            memory = MemoryRecords(bytes(part.records))
            while memory.has_next():
                batch = memory.next_batch()
                found.extend((r.offset, r.key, r.value) for r in batch)
        return int(part.error_code), found

    def list_offset(self, topic: str, partition: int = 0, timestamp: int = -1
                    ) -> tuple[int, int]:
        """(error, offset) for a ListOffsets timestamp (-1 latest, -2 earliest)."""
        part = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=partition, current_leader_epoch=-1, timestamp=timestamp)
        answer = self.call(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
            ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[part])]), 7,
            ListOffsetsResponse)
        found = answer.topics[0].partitions[0]
        return int(found.error_code), int(found.offset)

    def create_topic(self, name: str, partitions: int = 1) -> int:
        topic = CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1, assignments=[],
            configs=[])
        answer = self.call(CreateTopicsRequest[5](topics=[topic], timeout_ms=5000,
                                                  validate_only=False), 5, CreateTopicsResponse)
        return int(answer.topics[0].error_code)

    def delete_topic(self, name: str) -> int:
        answer = self.call(DeleteTopicsRequest[5](topic_names=[name], timeout_ms=5000), 5,
                           DeleteTopicsResponse)
        return int(answer.responses[0].error_code)

    def delete_topic_by_id(self, topic_id: uuid.UUID) -> Any:
        """DeleteTopics v6 naming the topic only by its id; the one result."""
        state = DeleteTopicsRequest.DeleteTopicState(name=None, topic_id=topic_id)
        answer = self.call(DeleteTopicsRequest[6](topics=[state], timeout_ms=5000), 6,
                           DeleteTopicsResponse)
        (result,) = answer.responses
        return result

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        request = DeleteRecordsRequest[2](topics=[DeleteRecordsRequest.DeleteRecordsTopic(
            name=topic, partitions=[DeleteRecordsRequest.DeleteRecordsTopic
                                    .DeleteRecordsPartition(partition_index=partition,
                                                            offset=offset)])],
            timeout_ms=5000)
        answer = self.call(request, 2, DeleteRecordsResponse)
        return int(answer.topics[0].partitions[0].error_code)

    def create_partitions(self, topic: str, count: int) -> int:
        request = CreatePartitionsRequest[3](topics=[
            CreatePartitionsRequest.CreatePartitionsTopic(name=topic, count=count,
                                                          assignments=None)],
            timeout_ms=5000, validate_only=False)
        answer = self.call(request, 3, CreatePartitionsResponse)
        return int(answer.results[0].error_code)

    def cluster_errors(self) -> tuple[int, int]:
        """Top-level error codes of DescribeLogDirs v4 and ElectLeaders v2 (cluster ACLs)."""
        log_dirs = self.call(DescribeLogDirsRequest[4](topics=None), 4, DescribeLogDirsResponse)
        election = self.call(ElectLeadersRequest[2](election_type=0, topic_partitions=None,
                                                    timeout_ms=5000), 2, ElectLeadersResponse)
        return int(log_dirs.error_code), int(election.error_code)

    def alter_config(self, topic: str, name: str, value: str) -> int:
        """IncrementalAlterConfigs v1: SET one config of a topic; the error code."""
        resource = IncrementalAlterConfigsRequest.AlterConfigsResource
        request = IncrementalAlterConfigsRequest[1](resources=[resource(
            resource_type=TOPIC_RESOURCE, resource_name=topic, configs=[
                resource.AlterableConfig(name=name, config_operation=0, value=value)])],
            validate_only=False)
        answer = self.call(request, 1, IncrementalAlterConfigsResponse)
        return int(answer.responses[0].error_code)

    def describe_configs(self, topic: str) -> int:
        request = DescribeConfigsRequest[4](resources=[
            DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=TOPIC_RESOURCE, resource_name=topic, configuration_keys=None)],
            include_synonyms=False, include_documentation=False)
        answer = self.call(request, 4, DescribeConfigsResponse)
        return int(answer.results[0].error_code)

    def delete_group(self, group: str) -> int:
        answer = self.call(DeleteGroupsRequest[2](groups_names=[group]), 2,
                           DeleteGroupsResponse)
        return int(answer.results[0].error_code)

    def offset_delete(self, group: str, topic: str, partitions: list[int]) -> Any:
        T = OffsetDeleteRequest.OffsetDeleteRequestTopic
        request = OffsetDeleteRequest[0](group_id=group, topics=[T(name=topic, partitions=[
            T.OffsetDeleteRequestPartition(partition_index=p) for p in partitions])])
        return self.call(request, 0, OffsetDeleteResponse)

    def list_groups(self) -> list[str]:
        answer = self.call(ListGroupsRequest[3](), 3, ListGroupsResponse)
        assert answer.error_code == NONE
        return [g.group_id for g in answer.groups]

    def describe_group(self, group: str) -> Any:
        answer = self.call(DescribeGroupsRequest[5](groups=[group],
                                                    include_authorized_operations=False),
                           5, DescribeGroupsResponse)
        return answer.groups[0]

    def simple_commit(self, group: str, topic: str, offsets: dict[int, int]) -> dict[int, int]:
        """Commit for a group that only stores offsets (generation -1, no member)."""
        return self.commit(group, -1, "", topic, {p: (o, None) for p, o in offsets.items()})

    def all_offsets(self, group: str) -> tuple[int, dict[tuple[str, int], int]]:
        """(group error, {(topic, partition): offset}) of every committed offset (v7,
        topics=None)."""
        answer = self.call(OffsetFetchRequest[7](group_id=group, topics=None,
                                                 require_stable=False), 7, OffsetFetchResponse)
        return int(answer.error_code), {
            (t.name, p.partition_index): int(p.committed_offset)
            for t in answer.topics for p in t.partitions}


# -- ACLs over raw frames (Kafka's codes) --------------------------------------------------

ANY = 1
ACL_TOPIC, ACL_GROUP, ACL_CLUSTER, ACL_TRANSACTIONAL_ID = 2, 3, 4, 5
LITERAL, PREFIXED = 3, 4
ACL_ALL, ACL_READ, ACL_WRITE, ACL_ALTER, ACL_DESCRIBE = 2, 3, 4, 7, 8
ACL_CLUSTER_ACTION, ACL_DESCRIBE_CONFIGS, ACL_ALTER_CONFIGS, ACL_IDEMPOTENT_WRITE = 9, 10, 11, 12
DENY, ALLOW = 2, 3


def grant(conn: RawConnection, resource: int, name: str, principal: str,
          operation: int = ACL_READ, permission: int = ALLOW, pattern: int = LITERAL) -> int:
    """CreateAcls of one binding (from any host); its error code."""
    answer = conn.call(CreateAclsRequest[2](creations=[CreateAclsRequest.AclCreation(
        resource_type=resource, resource_name=name, resource_pattern_type=pattern,
        principal=principal, host="*", operation=operation, permission_type=permission)]),
        2, CreateAclsResponse)
    return int(answer.results[0].error_code)


def revoke(conn: RawConnection, resource: int, name: str, principal: str) -> tuple[int, int]:
    """DeleteAcls of every binding of the resource name and principal; the error code and
    how many were deleted."""
    F = DeleteAclsRequest.DeleteAclsFilter
    answer = conn.call(DeleteAclsRequest[2](filters=[F(
        resource_type_filter=resource, resource_name_filter=name, pattern_type_filter=1,
        principal_filter=principal, host_filter=None, operation=1, permission_type=1)]),
        2, DeleteAclsResponse)
    result = answer.filter_results[0]
    return int(result.error_code), len(result.matching_acls)


class TenantLogins:
    """One tenant's roles logging in through any broker with tokens from ``issuer``
    (mixed into a test's dataclass, which declares ``issuer`` as a field)."""

    tenant: str = "acme"
    issuer: TokenIssuer

    def login(self, broker: BrokerProcess, role: str = "admin") -> Login:
        """A stock client's login of ``role`` through ``broker``."""
        return Login(broker.bootstrap, "SASL_PLAINTEXT", self.tenant, self.issuer.token(role))

    def conn(self, broker: BrokerProcess, role: str = "admin") -> OpsConnection:
        """A raw connection logged in as ``role`` through ``broker``."""
        conn = OpsConnection(broker.port)
        conn.login(self.tenant, self.issuer.token(role))
        return conn

    def login_error(self, broker: BrokerProcess, role: str) -> int:
        """The error code of a login of ``role`` to the tenant through ``broker``."""
        return login_error(broker.port, self.tenant, self.issuer.token(role))
