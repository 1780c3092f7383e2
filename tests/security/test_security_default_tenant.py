"""The CLUSTER ACLs of the default tenant are the superusers' (authorizationEnabled=true).

Connections without a tenant login (PLAINTEXT, or a client certificate) are judged by the
CLUSTER ACLs of the default tenant ``public`` and reach every tenant: with ALTER_CONFIGS on
the cluster they alter any tenant's quotas. So a tenant admin of ``public`` (CLUSTER ALTER
there, not a superuser) manages public's topic, group and transactional-id ACLs, but not its
CLUSTER ACLs: creating one answers CLUSTER_AUTHORIZATION_FAILED, deleting one too (a filter
of any resource type leaves them alone). Admins of other tenants keep their CLUSTER ACLs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import quota_helpers as q
from tests.broker_process import BrokerProcess
from tests.security_helpers import (
    ACL_ALTER,
    ACL_ALTER_CONFIGS,
    ACL_CLUSTER,
    ACL_GROUP,
    ACL_TOPIC,
    ANY,
    CLUSTER_AUTHORIZATION_FAILED,
    DENY,
    NONE,
    OpsConnection,
    TokenIssuer,
    grant,
    revoke,
)

CLUSTER = "kafka-cluster"


@dataclass
class Secured:
    broker: BrokerProcess
    issuer: TokenIssuer

    def login(self, tenant: str, role: str) -> OpsConnection:
        conn = OpsConnection(self.broker.ports["SASL_PLAINTEXT"], timeout=60)
        conn.login(tenant, self.issuer.token(role))
        return conn

    def anonymous(self) -> OpsConnection:
        return OpsConnection(self.broker.ports["PLAINTEXT"], timeout=60)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = Path(tmp_path_factory.mktemp("default-tenant"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "authorizationEnabled": "true", "superUserRoles": "admin", **issuer.settings}).start()
    try:
        yield Secured(broker, issuer)
    finally:
        broker.stop()


def alter_acme(conn: OpsConnection) -> int:
    """Set tenant acme's producer_byte_rate (an operator's quota); the error code."""
    ((code, _message),) = q.alter(conn, [({"tenant": "acme"}, {"producer_byte_rate": 1e6})])
    return code


def test_a_public_tenant_admin_cannot_make_tenantless_connections_operators(
        secured: Secured) -> None:
    root = secured.login("public", "admin")
    assert grant(root, ACL_CLUSTER, CLUSTER, "User:padmin", ACL_ALTER) == NONE
    padmin = secured.login("public", "padmin")
    for principal in ("User:ANONYMOUS", "User:*", "User:some-cn"):
        assert grant(padmin, ACL_CLUSTER, CLUSTER, principal, ACL_ALTER_CONFIGS) == \
            CLUSTER_AUTHORIZATION_FAILED
    assert alter_acme(secured.anonymous()) == CLUSTER_AUTHORIZATION_FAILED
    # the rest of tenant public's ACLs are still padmin's to manage
    assert grant(padmin, ACL_TOPIC, "orders", "User:ANONYMOUS") == NONE
    assert grant(padmin, ACL_GROUP, "g", "User:ANONYMOUS") == NONE
    # nor may padmin delete a CLUSTER ACL of public, such as a superuser's DENY
    assert grant(root, ACL_CLUSTER, CLUSTER, "User:ANONYMOUS", ACL_ALTER_CONFIGS, DENY) == NONE
    assert revoke(padmin, ACL_CLUSTER, CLUSTER, "User:ANONYMOUS")[0] == \
        CLUSTER_AUTHORIZATION_FAILED
    assert revoke(padmin, ANY, CLUSTER, "User:ANONYMOUS") == (NONE, 0)
    assert revoke(padmin, ANY, "orders", "User:ANONYMOUS") == (NONE, 1)
    assert revoke(root, ACL_CLUSTER, CLUSTER, "User:ANONYMOUS") == (NONE, 1)
    # an operator the superuser names: as before
    assert grant(root, ACL_CLUSTER, CLUSTER, "User:ANONYMOUS", ACL_ALTER_CONFIGS) == NONE
    assert alter_acme(secured.anonymous()) == NONE


def test_other_tenant_admins_keep_their_cluster_acls(secured: Secured) -> None:
    assert grant(secured.login("acme", "admin"), ACL_CLUSTER, CLUSTER, "User:aadmin",
                 ACL_ALTER) == NONE
    aadmin = secured.login("acme", "aadmin")
    assert grant(aadmin, ACL_CLUSTER, CLUSTER, "User:ops", ACL_ALTER_CONFIGS) == NONE
    assert revoke(aadmin, ACL_CLUSTER, CLUSTER, "User:ops") == (NONE, 1)
