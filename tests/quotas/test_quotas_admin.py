"""AlterClientQuotas and DescribeClientQuotas against a real broker with SASL logins and
ACLs: advertised in ApiVersions, Kafka's validation (unknown keys and entity types,
values that are not positive), validate_only, Kafka's match filters (exact, default, any
name; strict), the cluster ACLs (ALTER_CONFIGS / DESCRIBE_CONFIGS), and the tenant
boundary: a tenant's admin manages its own namespaces' quotas only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.broker_process import BrokerProcess
from tests.quota_helpers import DEFAULT, EXACT, SPECIFIED, alter, describe, parts
from tests.security_helpers import ACL_GROUP, NONE, Login, OpsConnection, TokenIssuer, grant

CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
P, C, R = "producer_byte_rate", "consumer_byte_rate", "request_percentage"


@dataclass
class QuotaBroker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def conn(self, role: str, tenant: str = "acme") -> OpsConnection:
        conn = OpsConnection(self.broker.port)
        conn.login(tenant, self.issuer.token(role))
        return conn


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuotaBroker]:
    base = Path(tmp_path_factory.mktemp("quotas"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", **issuer.settings}).start()
    try:
        # acme's admin may alter and describe configs of the cluster (inside acme)
        tenant_admin = AdminClient(Login(broker.bootstrap, "SASL_PLAINTEXT", "acme",
                                         issuer.token("admin")).confluent())
        for future in tenant_admin.create_acls([
                AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                           "User:acme-admin", "*", operation, AclPermissionType.ALLOW)
                for operation in (AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS)
        ], request_timeout=15).values():
            future.result(15)
        yield QuotaBroker(broker, issuer)
    finally:
        broker.stop()


def test_api_versions_advertises_both_apis(setup: QuotaBroker) -> None:
    conn = OpsConnection(setup.broker.port)
    versions = conn.call(ApiVersionsRequest[3](client_software_name="t",
                                               client_software_version="1"), 3,
                         ApiVersionsResponse)
    served = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert served[48] == (0, 1) and served[49] == (0, 1)


def test_an_operator_sets_describes_and_removes_quotas(setup: QuotaBroker) -> None:
    conn = setup.conn("admin")
    alice_app = {"user": "alice", "client-id": "app"}
    changes = [
        ({"user": "alice"}, {P: 1024.0, R: 50.0}),
        (alice_app, {C: 2048.0}),
        ({"user": None}, {P: 4096.0}),
        ({"client-id": "app"}, {P: 8192.0}),
        ({"tenant": "acme"}, {P: 1e6}),
        ({"namespace": "acme/prod"}, {C: 5e5}),
    ]
    assert alter(conn, changes, version=0) == [(0, None)] * len(changes)
    code, everything = describe(conn, [])
    assert code == 0
    for entity, ops in changes:
        assert everything[parts(entity)] == ops
    # exact user match, not strict: the user alone and the user with a client id
    _, found = describe(conn, [("user", EXACT, "alice")])
    assert set(found) == {parts({"user": "alice"}), parts(alice_app)}
    _, found = describe(conn, [("user", EXACT, "alice")], strict=True)
    assert set(found) == {parts({"user": "alice"})}
    _, found = describe(conn, [("user", DEFAULT, None)], strict=True, version=0)
    assert found == {parts({"user": None}): {P: 4096.0}}
    _, found = describe(conn, [("user", SPECIFIED, None), ("client-id", SPECIFIED, None)])
    assert set(found) == {parts(alice_app)}
    _, found = describe(conn, [("namespace", SPECIFIED, None)])
    assert set(found) == {parts({"namespace": "acme/prod"})}
    # remove one key, then the last key: the entity is gone
    assert alter(conn, [({"user": "alice"}, {R: None}), (alice_app, {C: None})]) == \
        [(0, None), (0, None)]
    _, found = describe(conn, [("user", EXACT, "alice")])
    assert found == {parts({"user": "alice"}): {P: 1024.0}}


@pytest.mark.parametrize(("entity", "ops"), [
    ({"user": "bob"}, {"no_such_rate": 5.0}),
    ({"user": "bob"}, {P: -1.0}),
    ({"user": "bob"}, {P: 0.0}),
    ({"user": "bob"}, {P: 10.5}),
    ({"user": "bob"}, {R: -0.5}),
    ({"ip": "127.0.0.1"}, {"controller_mutation_rate": 10.0}),
    ({"user": "bob"}, {"controller_mutation_rate": 0.0}),
    ({"ip": "127.0.0.1"}, {P: 10.0}),
    ({"ip": "not-an-address"}, {"connection_creation_rate": 10.0}),
    ({"user": "bob"}, {"max_topics": 10.0}),
    ({"group": "g"}, {P: 10.0}),
    ({"tenant": "acme", "user": "bob"}, {P: 10.0}),
    ({"namespace": "just-one-part"}, {P: 10.0}),
])
def test_invalid_alterations_answer_invalid_request(setup: QuotaBroker,
                                                    entity: dict[str, str | None],
                                                    ops: dict[str, float | None]) -> None:
    conn = setup.conn("admin")
    [(code, message)] = alter(conn, [(entity, ops)])
    assert code == INVALID_REQUEST and message
    _, found = describe(conn, [])
    assert parts(entity) not in found


def test_one_bad_entry_does_not_stop_the_others(setup: QuotaBroker) -> None:
    conn = setup.conn("admin")
    results = alter(conn, [({"user": "carol"}, {P: -5.0}), ({"user": "dave"}, {P: 100.0})])
    assert [code for code, _ in results] == [INVALID_REQUEST, 0]
    _, found = describe(conn, [("user", EXACT, "dave")])
    assert found == {parts({"user": "dave"}): {P: 100.0}}


def test_validate_only_checks_without_storing(setup: QuotaBroker) -> None:
    conn = setup.conn("admin")
    assert alter(conn, [({"user": "erin"}, {P: 100.0})], validate_only=True) == [(0, None)]
    assert alter(conn, [({"user": "erin"}, {P: -1.0})], validate_only=True)[0][0] == \
        INVALID_REQUEST
    assert describe(conn, [("user", EXACT, "erin")]) == (0, {})


def test_invalid_filters_answer_invalid_request(setup: QuotaBroker) -> None:
    conn = setup.conn("admin")
    for components in ([("user", EXACT, None)], [("user", DEFAULT, "x")],
                       [("user", 7, None)], [("group", SPECIFIED, None)],
                       [("user", SPECIFIED, None), ("user", DEFAULT, None)],
                       # Kafka: ip is never filtered together with user or client-id
                       [("ip", SPECIFIED, None), ("user", SPECIFIED, None)],
                       [("client-id", EXACT, "c"), ("ip", DEFAULT, None)],
                       [("ip", EXACT, "1.2.3.4"), ("user", DEFAULT, None),
                        ("client-id", SPECIFIED, None)]):
        code, found = describe(conn, components)
        assert (code, found) == (INVALID_REQUEST, {}), components


def test_a_role_without_the_cluster_acls_is_refused(setup: QuotaBroker) -> None:
    assert grant(setup.conn("admin"), ACL_GROUP, "unused", "User:nobody") == NONE  # a login
    conn = setup.conn("nobody")
    [(code, _)] = alter(conn, [({"namespace": "acme/prod"}, {P: 100.0})])
    assert code == CLUSTER_AUTHORIZATION_FAILED
    assert describe(conn, [])[0] == CLUSTER_AUTHORIZATION_FAILED


def test_a_tenant_admin_manages_its_own_namespaces_only(setup: QuotaBroker) -> None:
    operator = setup.conn("admin")
    assert alter(operator, [({"tenant": "globex"}, {P: 3e6}),
                            ({"namespace": "globex/ns"}, {P: 2e6}),
                            ({"tenant": "acme"}, {P: 1e6})]) == [(0, None)] * 3
    conn = setup.conn("acme-admin")
    assert alter(conn, [({"namespace": "acme/team1"}, {P: 5e5})]) == [(0, None)]
    refused = [
        ({"tenant": "globex"}, {P: 1e9}),          # another tenant
        ({"namespace": "globex/ns"}, {P: 1e9}),    # another tenant's namespace
        ({"tenant": "acme"}, {P: 1e9}),            # its own cap is the operator's
        ({"user": "acme-admin"}, {P: 1e9}),        # users cross tenants
        ({"client-id": None}, {P: 1e9}),
    ]
    results = alter(conn, refused)
    assert [code for code, _ in results] == [CLUSTER_AUTHORIZATION_FAILED] * len(refused)
    code, seen = describe(conn, [])
    assert code == 0
    assert parts({"namespace": "acme/team1"}) in seen and parts({"tenant": "acme"}) in seen
    assert all(dict(entity).get("tenant", "acme") == "acme"
               and dict(entity).get("namespace", "acme/").startswith("acme/")
               and not {"user", "client-id"} & dict(entity).keys() for entity in seen)
    _, everything = describe(operator, [])
    assert everything[parts({"tenant": "globex"})] == {P: 3e6}
