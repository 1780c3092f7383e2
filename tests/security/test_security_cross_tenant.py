"""Who reaches another tenant's topics, as the README's "Tenants" paragraph says: a
superuser role always; a login of another tenant never; the PLAIN username (not the token)
picks the login's tenant, so without ACLs any valid token may log in as any tenant (with
them, only a role holding an ACL of the tenant may); and a connection without a SASL login
(a PLAINTEXT or SSL listener) has no tenant boundary, only the ACLs. Each case reads tenant
a's topic ``a/default/t`` by its full name."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.security_helpers import (
    ACL_GROUP,
    NONE,
    SASL_AUTHENTICATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    OpsConnection,
    TokenIssuer,
    grant,
)

TOPIC = "a/default/t"


@dataclass
class Setup:
    broker: BrokerProcess
    issuer: TokenIssuer
    authorization: bool

    def read(self, username: str | None, role: str = "") -> int:
        """Fetch's error for ``TOPIC`` after a PLAIN login (None: no login, plain listener),
        or the login's; on success, the record that tenant a wrote must be there."""
        port = self.broker.ports["PLAINTEXT" if username is None else "SASL_PLAINTEXT"]
        conn = OpsConnection(port)
        try:
            if username is not None:
                login = conn.attempt_login(username, self.issuer.token(role))
                if login.error_code != NONE:
                    return int(login.error_code)
            error, records = conn.fetch(TOPIC)
        finally:
            conn.close()
        if error == NONE:
            assert [value for _offset, _key, value in records] == [b"from-a"]
        return error


@pytest.fixture(scope="module", params=[False, True], ids=["no-acls", "acls"])
def setup(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    base = Path(tmp_path_factory.mktemp("cross-tenant"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
        "superUserRoles": "admin", "authorizationEnabled": str(request.param).lower(),
        **issuer.settings}).start()
    try:
        owner = OpsConnection(broker.ports["SASL_PLAINTEXT"])
        owner.login("a", issuer.token("admin"))
        assert owner.create_topic("t") == NONE
        assert owner.produce("t", value=b"from-a") == NONE
        owner.close()
        if request.param:  # bob may log in to tenant b: he holds an ACL there
            b_admin = OpsConnection(broker.ports["SASL_PLAINTEXT"])
            b_admin.login("b", issuer.token("admin"))
            assert grant(b_admin, ACL_GROUP, "g", "User:bob") == NONE
            b_admin.close()
        yield Setup(broker, issuer, request.param)
    finally:
        broker.stop()


def test_a_login_of_another_tenant_never_reaches_it(setup: Setup) -> None:
    assert setup.read("b", "bob") == TOPIC_AUTHORIZATION_FAILED
    assert setup.read("b/default", "bob") == TOPIC_AUTHORIZATION_FAILED


def test_a_superuser_reaches_every_tenant_by_full_name(setup: Setup) -> None:
    assert setup.read("b", "admin") == NONE


def test_the_username_picks_the_tenant_and_acls_decide(setup: Setup) -> None:
    """bob's token logs in as tenant a: without authorization it reads a's topic; with
    it, the login is refused (bob's role holds no ACL of tenant a)."""
    expected = SASL_AUTHENTICATION_FAILED if setup.authorization else NONE
    assert setup.read("a", "bob") == expected


def test_without_a_login_only_acls_apply(setup: Setup) -> None:
    expected = TOPIC_AUTHORIZATION_FAILED if setup.authorization else NONE
    assert setup.read(None) == expected
