"""A login names its tenant; with authorizationEnabled=true the role must be allowed there.

The PLAIN username names the tenant. With authorization enabled, a login to tenant T
succeeds only for a superuser or a role holding at least one ALLOW ACL of T (any resource
type; ``User:*`` included); anyone else gets SASL_AUTHENTICATION_FAILED ("role X may not use
tenant T"), logged and audited as other failed logins, before the connection counts in T's quotas on
connections: a stranger cannot squat a tenant's ``max_connections``. ACL changes apply to
the next login.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import quota_helpers as q
from tests.broker_process import BrokerProcess
from tests.security.test_audit import read_audit
from tests.security_helpers import (
    ACL_ALL,
    ACL_CLUSTER,
    ACL_GROUP,
    ACL_IDEMPOTENT_WRITE,
    ACL_READ,
    ACL_TOPIC,
    ACL_TRANSACTIONAL_ID,
    ACL_WRITE,
    DENY,
    LITERAL,
    NONE,
    PREFIXED,
    SASL_AUTHENTICATION_FAILED,
    OpsConnection,
    TokenIssuer,
    grant,
    revoke,
)


@dataclass
class Broker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def attempt(self, tenant: str, role: str) -> tuple[OpsConnection, int, str | None]:
        """A PLAIN login; the connection, the answer's error code and message."""
        conn = OpsConnection(self.broker.ports["SASL_PLAINTEXT"], timeout=60)
        answer = conn.attempt_login(tenant, self.issuer.token(role))
        return conn, answer.error_code, answer.error_message

    def login(self, tenant: str, role: str) -> OpsConnection:
        conn, code, message = self.attempt(tenant, role)
        assert code == NONE, message
        return conn

    def refused(self, tenant: str, role: str) -> OpsConnection:
        """Assert the login is refused for the tenant, and the connection closed."""
        conn, code, message = self.attempt(tenant, role)
        assert code == SASL_AUTHENTICATION_FAILED, (code, message)
        assert message is not None and f"role {role} may not use tenant {tenant}" in message
        assert conn.closed_by_peer(30)
        return conn


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    base = Path(tmp_path_factory.mktemp("tenant-login"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "authorizationEnabled": "true", "superUserRoles": "admin,ANONYMOUS",  # reads __audit
        "failedAuthenticationDelayMs": "0", **issuer.settings}).start()
    try:
        yield Broker(broker, issuer)
    finally:
        broker.stop()


def test_a_login_needs_an_allow_acl_in_its_tenant(secured: Broker) -> None:
    """No ACL in the tenant: refused, with the reason, and logged as a failed login."""
    secured.refused("t1", "bob")
    assert secured.broker.wait_for_log(r"\(tenant t1\) failed: role bob may not use tenant t1", 30)
    events = read_audit(f"127.0.0.1:{secured.broker.ports['PLAINTEXT']}",
                        {("authentication", "failure")})
    assert [(e["tenant"], e["reason"]) for e in events if e["outcome"] == "failure"] == [
        ("t1", "role bob may not use tenant t1")], events
    root = secured.login("t1", "admin")  # a superuser uses any tenant
    assert grant(root, ACL_GROUP, "g", "User:bob") == NONE  # a group ACL of tenant t1
    secured.login("t1", "bob")  # the next login sees the new ACL
    secured.refused("t2", "bob")  # an ACL of t1 says nothing about t2
    assert grant(root, ACL_TOPIC, "t1/ns/", "User:carol", ACL_ALL, DENY, PREFIXED) == NONE
    secured.refused("t1", "carol")  # a DENY alone is no reason to be there
    assert revoke(root, ACL_GROUP, "g", "User:bob") == (NONE, 1)
    secured.refused("t1", "bob")  # nor is a revoked ACL


@pytest.mark.parametrize(("tenant", "resource", "name", "principal", "operation", "pattern"), [
    ("t3", ACL_TOPIC, "t3/default/", "User:dave", ACL_READ, PREFIXED),
    ("t4", ACL_TOPIC, "orders", "User:*", ACL_READ, LITERAL),
    ("t5", ACL_CLUSTER, "kafka-cluster", "User:dave", ACL_IDEMPOTENT_WRITE, LITERAL),
    ("t6", ACL_TRANSACTIONAL_ID, "tx-", "User:dave", ACL_WRITE, PREFIXED),
])
def test_any_allow_acl_of_the_tenant_lets_the_role_in(
        secured: Broker, tenant: str, resource: int, name: str, principal: str,
        operation: int, pattern: int) -> None:
    """A topic (prefixed, or literal for every user), cluster or transactional-id ACL."""
    secured.refused(tenant, "dave")
    assert grant(secured.login(tenant, "admin"), resource, name, principal, operation,
                 pattern=pattern) == NONE
    secured.login(tenant, "dave").metadata([])


def test_a_refused_login_holds_none_of_the_tenants_connections(secured: Broker) -> None:
    """bob (no ACL in q1) tries to fill q1's max_connections; q1's own alice still gets in."""
    root = secured.login("q1", "admin")  # one of q1's connections
    assert q.alter(root, [({"tenant": "q1"}, {"max_connections": 3.0})]) == [(NONE, None)]
    assert grant(root, ACL_TOPIC, "q1/default/", "User:alice", pattern=PREFIXED) == NONE
    squatters = [secured.refused("q1", "bob") for _ in range(2)]
    alices = [secured.login("q1", "alice") for _ in range(2)]
    for conn in alices:
        conn.metadata([])
    for conn in [root, *squatters, *alices]:
        conn.close()
