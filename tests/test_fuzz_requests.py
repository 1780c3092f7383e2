"""Well-formed requests with hostile field values, thousands of them over every served API
and version (``tests/fuzz_requests.py``): the broker answers each one, never closes the
connection on one, logs no traceback, and loses nothing it acknowledged before."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from tests.broker_process import BrokerProcess
from tests.clients import PARTITIONS, consume_confluent, make_records, produce_confluent
from tests.fuzz_requests import TOPIC, run
from tests.test_admin import admin

KEPT = "fuzz-kept"
"""A topic the fuzzer never names: its records must all be there afterwards."""


@pytest.mark.parametrize("seed", [1, 2])
def test_hostile_field_values_get_answers(tmp_path: Path, seed: int) -> None:
    broker = BrokerProcess(tmp_path, {"groupInitialRebalanceDelayMs": "0"}).start()
    try:
        client = admin(broker)
        for name in (TOPIC, KEPT):
            client.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(10)
        kept = make_records(40, 1_700_000_000_000)
        produce_confluent(broker.bootstrap, KEPT, kept, "none")
        produce_confluent(broker.bootstrap, TOPIC, make_records(30, 1_700_000_000_000), "none")

        outcome = run(broker.port, 5000, seed)

        assert outcome.broken == [], "\n".join(outcome.broken or [])[:4000]
        assert outcome.answered > 4500
        log = broker.log_text()
        assert "Traceback" not in log and "failed; closing" not in log, log[-4000:]
        assert broker.alive()
        got = consume_confluent(broker.bootstrap, KEPT, len(kept))
        assert sorted((g.partition, g.rec.value) for g in got) == \
            sorted((r.partition, r.value) for r in kept)
    finally:
        broker.stop()
