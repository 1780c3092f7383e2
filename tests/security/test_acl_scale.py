"""Thousands of ACLs and a request naming thousands of resources: stored with
confluent-kafka's AdminClient in one CreateAcls request, then one DescribeGroups (with
the authorized operations, kafka-python's KafkaAdminClient) naming 5,000 groups is
answered, each group right (each check once scanned every binding: 5,000 x 5,000 checks
stalled the broker for minutes). DeleteAcls and CreateAcls then change the answers at
once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka.admin import KafkaAdminClient

from tests.broker_process import BrokerProcess
from tests.security_helpers import Login, TokenIssuer

TENANT = "acme"
NOISE = 4_000
"""Group ACLs of other principals (literal), and a tenth as many prefixed ones."""
LITERAL_GRANTS = 500
"""bob's literal READ grants ``lit-<i>`` (READ implies DESCRIBE)."""


def group_acl(name: str, role: str, operation: AclOperation,
              pattern: ResourcePatternType = ResourcePatternType.LITERAL,
              permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(ResourceType.GROUP, name, pattern, f"User:{role}", "*", operation,
                      permission)


ANY_TEXT = cast(str, None)
"""A filter's name or host matching any (confluent-kafka's stubs only say str)."""
DENIED_OK = group_acl("ok-3", "bob", AclOperation.DESCRIBE,
                      permission=AclPermissionType.DENY)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, TokenIssuer]]:
    base = Path(tmp_path_factory.mktemp("acl-scale"))
    issuer = TokenIssuer("hmac", base / "keys")
    process = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizationEnabled": "true",
        "superUserRoles": "admin", "maxAclBindingsPerTenant": "10000",
        **issuer.settings}).start()
    try:
        yield process, issuer
    finally:
        process.stop(120)


def login(broker: tuple[BrokerProcess, TokenIssuer], role: str) -> Login:
    process, issuer = broker
    return Login(process.bootstrap, "SASL_PLAINTEXT", TENANT, issuer.token(role))


def described(bob: KafkaAdminClient, groups: list[str]) -> dict[str, str | None]:
    """Each group's error (None: described) from one DescribeGroups naming them all."""
    found = bob.describe_groups(groups, group_coordinator_id=0)
    return {name: found[name]["error"] for name in groups}


def refused(error: str | None) -> bool:
    assert error is None or "GroupAuthorizationFailed" in error, error
    return error is not None


def test_thousands_of_acls_and_a_request_naming_thousands_of_groups(
        broker: tuple[BrokerProcess, TokenIssuer]) -> None:
    admin = AdminClient(login(broker, "admin").confluent())
    bindings = [group_acl(f"g{i}", f"u{i}", AclOperation.READ) for i in range(NOISE)]
    bindings += [group_acl(f"p{i}-", f"u{i}", AclOperation.READ, ResourcePatternType.PREFIXED)
                 for i in range(NOISE // 10)]
    bindings += [group_acl(f"lit-{i}", "bob", AclOperation.READ) for i in range(LITERAL_GRANTS)]
    bindings += [group_acl("ok-", "bob", AclOperation.DESCRIBE, ResourcePatternType.PREFIXED),
                 DENIED_OK]
    for future in admin.create_acls(bindings, request_timeout=120).values():
        future.result(120)
    stored = admin.describe_acls(AclBindingFilter(
        ResourceType.GROUP, "ok-3", ResourcePatternType.MATCH, "User:bob", "*",
        AclOperation.ANY, AclPermissionType.ANY), request_timeout=120).result(120)
    assert sorted(map(str, stored)) == sorted(map(str, bindings[-2:]))

    groups = ([f"ok-{i}" for i in range(2_000)] + [f"lit-{i}" for i in range(1_000)]
              + [f"x{i}" for i in range(2_000)])
    bob = KafkaAdminClient(**login(broker, "bob").kafka_python(), request_timeout_ms=120_000)
    try:
        answers = described(bob, groups)
        wrong = [name for name in groups if refused(answers[name]) != (
            name == "ok-3" or name.startswith("x")
            or (name.startswith("lit-") and int(name[4:]) >= LITERAL_GRANTS))]
        assert not wrong, wrong[:20]

        # The index follows the ACLs: a DENY deleted, another created, answered at once.
        for future in admin.delete_acls([AclBindingFilter(
                ResourceType.GROUP, "ok-3", ResourcePatternType.LITERAL, "User:bob", "*",
                AclOperation.DESCRIBE, AclPermissionType.DENY)], request_timeout=60).values():
            assert len(future.result(60)) == 1
        for future in admin.create_acls([group_acl("ok-4", "bob", AclOperation.ALL,
                                                   permission=AclPermissionType.DENY)],
                                        request_timeout=60).values():
            future.result(60)
        answers = described(bob, ["ok-3", "ok-4", "ok-5"])
        assert [refused(answers[name]) for name in ("ok-3", "ok-4", "ok-5")] == \
            [False, True, False]

        # One DeleteAcls of two filters selecting ok-4's DENY both: it is one change, and
        # the DENY is counted under the first filter only (as Kafka counts it).
        first = AclBindingFilter(ResourceType.GROUP, "ok-4", ResourcePatternType.LITERAL,
                                 "User:bob", "*", AclOperation.ANY, AclPermissionType.DENY)
        every = AclBindingFilter(ResourceType.GROUP, ANY_TEXT, ResourcePatternType.ANY,
                                 "User:bob", ANY_TEXT, AclOperation.ANY, AclPermissionType.ANY)
        futures = admin.delete_acls([first, every], request_timeout=60)
        assert len(futures[first].result(60)) == 1
        assert len(futures[every].result(60)) == LITERAL_GRANTS + 1  # lit-<i> and ok-
        answers = described(bob, ["ok-4", "ok-5", "lit-0", "g1"])
        assert all(refused(error) for error in answers.values()), answers
    finally:
        bob.close()
