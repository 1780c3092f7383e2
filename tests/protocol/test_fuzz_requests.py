"""Well-formed requests with hostile field values, thousands of them over every served API
and version (``tests/fuzz_requests.py``): the broker answers each one, never closes the
connection on one, logs no traceback, and loses nothing it acknowledged before.

Three callers: an anonymous one on a plain listener; and on a SASL listener with
authorization on, a tenant's superuser (deep into every handler, through tenant naming)
and a tenant's role with no grants (through every refusal)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS, consume_confluent, make_records, produce_confluent
from tests.fuzz_requests import TOPIC, run
from tests.raw import RawConnection
from tests.security_helpers import ACL_GROUP, NONE, SecureConnection, TokenIssuer, grant

KEPT = "fuzz-kept"
"""A topic the fuzzer never names: its records must all be there afterwards."""
TENANT = "fuzzco"


@pytest.mark.parametrize(("caller", "seed"), [
    ("anonymous", 1), ("anonymous", 2), ("superuser", 3), ("no-grants", 4)])
def test_hostile_field_values_get_answers(tmp_path: Path, caller: str, seed: int) -> None:
    settings = {"groupInitialRebalanceDelayMs": "0"}
    role: str | None = None
    client_conf = {}
    if caller != "anonymous":
        issuer = TokenIssuer("hmac", tmp_path / "keys")
        settings |= {"kafkaListeners": "SASL_PLAINTEXT://127.0.0.1:0",
                     "validateRecords": str(caller == "superuser").lower(),
                     "authorizationEnabled": "true", "superUserRoles": "admin",
                     **issuer.settings}
        role = "admin" if caller == "superuser" else "nobody"
        client_conf = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                       "sasl.username": TENANT,
                       "sasl.password": "token:" + issuer.token("admin")}
    broker = BrokerProcess(tmp_path / "data", settings).start()
    try:
        conf = {"bootstrap.servers": broker.bootstrap, **client_conf}
        client = AdminClient(conf)
        for name in (TOPIC, KEPT):
            client.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(10)
        kept = make_records(40, 1_700_000_000_000)
        produce_confluent(broker.bootstrap, KEPT, kept, "none", conf=conf)
        produce_confluent(broker.bootstrap, TOPIC, make_records(30, 1_700_000_000_000), "none",
                          conf=conf)

        if role is not None and role != "admin":  # an ACL of the tenant lets it log in
            root = SecureConnection(broker.port)
            root.login(TENANT, issuer.token("admin"))
            assert grant(root, ACL_GROUP, "unused", f"User:{role}") == NONE
            root.close()

        def connect() -> RawConnection:
            conn = SecureConnection(broker.port, timeout=3.0)
            if role is not None:
                conn.login(TENANT, issuer.token(role))
            return conn

        outcome = run(broker.port, 4000, seed, connect=connect)

        assert outcome.broken == [], "\n".join(outcome.broken or [])[:4000]
        assert outcome.answered > 3500
        log = broker.log_text()
        assert "Traceback" not in log and "failed; closing" not in log, log[-4000:]
        assert broker.alive()
        got = consume_confluent(broker.bootstrap, KEPT, len(kept), conf=conf)
        assert sorted((g.partition, g.rec.value) for g in got) == \
            sorted((r.partition, r.value) for r in kept)
    finally:
        broker.stop()
