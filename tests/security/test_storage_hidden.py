"""Where the storage lives is the operator's: a tenant's login (not a superuser) is shown a
log dir that names nothing of it (the same for every tenant) with
unknown (-1) total and usable bytes in DescribeLogDirs, may "move" its replicas only to
that name (the real location is LOG_DIR_NOT_FOUND to it, so it cannot be probed for), and
the BROKER resource's DescribeConfigs leaves ``log.dirs`` out; a superuser gets the full
answer. On a SASL listener, with confluent-kafka's and kafka-python's admin clients, on
the file engine (a data directory and its file system) and on PostgreSQL (the database's
URL: user, host, database; never the password the URL carries, which no DescribeConfigs
value shows to anyone)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kafka.admin
import kafka.errors
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from kafka.structs import TopicPartitionReplica

from tests.broker_process import BrokerProcess
from tests.conftest import engine_settings
from tests.security_helpers import Login, TokenIssuer, create_topic

PASSWORD = "pg-s3cret"
"""In the PostgreSQL URL (the test server trusts 127.0.0.1, and ignores it)."""
TENANT_LOG_DIR = "/edge-broker/data"
"""As the README documents it (``broker_core.tenancy.TENANT_LOG_DIR``)."""


@dataclass
class Setup:
    broker: BrokerProcess
    issuer: TokenIssuer
    engine: str

    def login(self, role: str, tenant: str = "acme") -> Login:
        return Login(self.broker.bootstrap, "SASL_PLAINTEXT", tenant, self.issuer.token(role))


@pytest.fixture(scope="module", params=["file", "postgres"])
def setup(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    engine: str = request.param
    base = Path(tmp_path_factory.mktemp(f"hidden-{engine}"))
    issuer = TokenIssuer("hmac", base / "keys")
    settings = engine_settings(engine)
    if engine == "postgres":  # postgres://user@host... with a password, in two places
        url = settings["storageUrl"].replace("@", f":{PASSWORD}@", 1)
        settings["storageUrl"] = f"{url}?password={PASSWORD}"
    broker = BrokerProcess(base / "data", {
        "kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0", "superUserRoles": "admin",
        **issuer.settings, **settings}).start()
    try:
        yield Setup(broker, issuer, engine)
    finally:
        broker.stop()


def _broker_configs(login: Login) -> dict[str, str | None]:
    admin = AdminClient(login.confluent())
    resource = ConfigResource(ResourceType.BROKER, "0")
    found = admin.describe_configs([resource])[resource].result(15)
    return {name: entry.value for name, entry in found.items()}


def _log_dir(login: Login) -> dict[str, Any]:
    client = kafka.admin.KafkaAdminClient(**login.kafka_python())
    try:
        [result] = client.describe_log_dirs()
        [log_dir] = result["log_dirs"]
        assert isinstance(log_dir, dict)
        return log_dir
    finally:
        client.close()


def _moved(login: Login, topic: str, path: str) -> object:
    client = kafka.admin.KafkaAdminClient(**login.kafka_python())
    try:
        replica = TopicPartitionReplica(topic, 0, 0)
        return client.alter_replica_log_dirs({replica: path})[replica]
    finally:
        client.close()


def test_a_tenant_is_not_shown_where_the_storage_lives(setup: Setup, topic_name: str) -> None:
    tenant, operator = setup.login("alice"), setup.login("admin")
    create_topic(tenant, topic_name, 1)

    full = _log_dir(operator)
    location = full["log_dir"]
    if setup.engine == "file":
        assert Path(location) == setup.broker.data_dir.resolve()
        assert 0 < full["usable_bytes"] <= full["total_bytes"]
    else:
        assert location.startswith("postgres://") and "@" in location
    described = _broker_configs(operator)
    assert described["log.dirs"] == location
    assert not any(PASSWORD in (value or "") for value in [location, *described.values()])

    seen = _log_dir(tenant)
    assert (seen["log_dir"], seen["total_bytes"], seen["usable_bytes"]) == \
        (TENANT_LOG_DIR, -1, -1)
    assert [t["name"] for t in seen["topics"]] == [topic_name]  # its partitions all the same
    configs = _broker_configs(tenant)
    assert "log.dirs" not in configs and configs["broker.id"] == "0"
    assert not any(location in (value or "") for value in configs.values())

    # the name a tenant is shown is the one it may move its replicas to; the real one is
    # unknown to it, as any other path
    assert _moved(tenant, topic_name, TENANT_LOG_DIR) is kafka.errors.NoError
    assert _moved(tenant, topic_name, location) is kafka.errors.LogDirNotFoundError
    assert _moved(operator, f"acme/default/{topic_name}", location) is kafka.errors.NoError
