"""CreateAcls is bounded, all tenants' ACLs being one document every broker holds, rewrites
whole and indexes again on each change: a tenant admin's creation beyond
``maxAclBindingsPerTenant`` of its tenant answers POLICY_VIOLATION and is not stored (one
that exists already passes, other tenants are apart, DeleteAcls frees room), a superuser's
count for the tenant they name, and a CreateAcls of more creations than the limit answers
INVALID_REQUEST for each, storing nothing. confluent-kafka's AdminClient against a real
broker with SASL and authorization."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.broker_process import BrokerProcess
from tests.security_helpers import Login, TokenIssuer

CAP = 5
ANY_TEXT = cast(str, None)
"""A filter's name or host matching any (confluent-kafka's stubs only say str)."""

Broker = tuple[BrokerProcess, TokenIssuer]


@pytest.fixture()
def broker(tmp_path: Path) -> Iterator[Broker]:
    issuer = TokenIssuer("hmac", tmp_path / "keys")
    process = BrokerProcess(tmp_path / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", "maxAclBindingsPerTenant": str(CAP),
        **issuer.settings}).start()
    try:
        yield process, issuer
    finally:
        process.stop(30)


def admin(broker: Broker, tenant: str, role: str) -> AdminClient:
    process, issuer = broker
    return AdminClient(Login(process.bootstrap, "SASL_PLAINTEXT", tenant,
                             issuer.token(role)).confluent())


def group_acl(name: str, role: str = "reader") -> AclBinding:
    return AclBinding(ResourceType.GROUP, name, ResourcePatternType.LITERAL, f"User:{role}",
                      "*", AclOperation.READ, AclPermissionType.ALLOW)


def create(client: AdminClient, bindings: list[AclBinding]) -> list[int]:
    """Each binding's error code (0: created), from one CreateAcls."""
    codes = []
    for future in client.create_acls(bindings, request_timeout=30).values():
        try:
            future.result()
            codes.append(0)
        except KafkaException as error:
            print("refused:", error.args[0])
            codes.append(cast(KafkaError, error.args[0]).code())
    return codes


ALL_GROUPS = AclBindingFilter(ResourceType.GROUP, ANY_TEXT, ResourcePatternType.ANY, ANY_TEXT,
                              ANY_TEXT, AclOperation.ANY, AclPermissionType.ANY)


def groups(client: AdminClient) -> set[str]:
    """The names of the GROUP bindings the caller sees."""
    return {b.name for b in client.describe_acls(ALL_GROUPS, request_timeout=30).result()}


def test_a_tenant_admin_is_stopped_at_the_cap_and_others_are_apart(broker: Broker) -> None:
    root_a = admin(broker, "a", "admin")
    assert create(root_a, [AclBinding(ResourceType.BROKER, "kafka-cluster",
                                      ResourcePatternType.LITERAL, "User:aadm", "*",
                                      AclOperation.ALL, AclPermissionType.ALLOW)]) == [0]
    tenant_admin = admin(broker, "a", "aadm")  # tenant a: 1 binding of CAP
    names = [f"g{i}" for i in range(CAP + 1)]
    codes = create(tenant_admin, [group_acl(name) for name in names[:CAP]])
    assert codes == [0] * (CAP - 1) + [KafkaError.POLICY_VIOLATION]
    assert groups(tenant_admin) == set(names[:CAP - 1])  # the refused one is not stored
    assert create(tenant_admin, [group_acl("g0")]) == [0]  # an existing one passes
    assert create(tenant_admin, [group_acl(names[CAP])]) == [KafkaError.POLICY_VIOLATION]
    assert create(root_a, [group_acl("by-root")]) == [KafkaError.POLICY_VIOLATION]

    root_b = admin(broker, "b", "admin")  # another tenant is apart
    assert create(root_b, [group_acl(f"b{i}") for i in range(CAP)]) == [0] * CAP
    assert groups(root_b) >= {f"b{i}" for i in range(CAP)}

    deleted = tenant_admin.delete_acls([AclBindingFilter(
        ResourceType.GROUP, "g1", ResourcePatternType.LITERAL, ANY_TEXT, ANY_TEXT,
        AclOperation.ANY, AclPermissionType.ANY)], request_timeout=30)
    assert [len(f.result()) for f in deleted.values()] == [1]
    assert create(tenant_admin, [group_acl(names[CAP]), group_acl("g1")]) == [
        0, KafkaError.POLICY_VIOLATION]  # room for one
    assert groups(tenant_admin) == {*names[:CAP - 1], names[CAP]} - {"g1"}


def test_a_create_acls_of_more_creations_than_the_cap_stores_nothing(broker: Broker) -> None:
    root_b = admin(broker, "b", "admin")
    flood = [group_acl(f"f{i}", "p") for i in range(CAP + 1)]
    assert create(root_b, flood) == [KafkaError.INVALID_REQUEST] * (CAP + 1)
    assert groups(root_b) == set()
    assert create(root_b, flood[:CAP]) == [0] * CAP
