"""Tenant quotas with real SASL logins: the operator's tenant quota is a ceiling a tenant
admin's namespace quota cannot lift (a producer in the namespace is held near the
tenant's rate). Rates are reported; only coarse bounds are asserted."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.broker_process import BrokerProcess
from tests.quota_helpers import alter, produce_flat_out
from tests.security_helpers import Login, OpsConnection, TokenIssuer, create_topic

MB = 1 << 20


@dataclass
class TenantBroker:
    broker: BrokerProcess
    issuer: TokenIssuer

    def login(self, username: str, role: str) -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", username,
                     self.issuer.token(role))

    def conn(self, username: str, role: str) -> OpsConnection:
        conn = OpsConnection(self.broker.port)
        conn.login(username, self.issuer.token(role))
        return conn


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TenantBroker]:
    base = Path(tmp_path_factory.mktemp("tenant-quotas"))
    issuer = TokenIssuer("hmac", base / "keys")
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "superUserRoles": "admin",
        "quotaWindowNum": "5", **issuer.settings}).start()
    try:
        yield TenantBroker(broker, issuer)
    finally:
        broker.stop()


def test_a_namespace_quota_cannot_lift_the_tenants(setup: TenantBroker) -> None:
    operator = setup.conn("acme", "admin")
    assert alter(operator, [({"tenant": "acme"}, {"producer_byte_rate": MB})]) == [(0, None)]
    tenant_admin = setup.conn("acme", "acme-admin")
    assert alter(tenant_admin, [({"namespace": "acme/prod"},
                                 {"producer_byte_rate": 10 * MB})]) == [(0, None)]
    producer = setup.login("acme/prod", "alice")
    create_topic(producer, "ceiling", 1)
    rate, throttles = produce_flat_out(producer.confluent(), "ceiling")
    print(f"producer in acme/prod (namespace quota 10 MiB/s, tenant quota 1 MiB/s): "
          f"{rate / MB:.2f} x the tenant's quota, {len(throttles)} throttle callbacks")
    assert 0.5 <= rate / MB <= 1.5
    assert throttles
