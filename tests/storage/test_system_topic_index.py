"""A system topic partition's keys as another broker reads them from PostgreSQL
(``system_topic_index.KeyIndex`` through ``PgPartition.search``): the newest record of any
key, or that it has none, exactly as reading every stored batch says, through writes and
snapshot compactions; the partition read once, then one statement per lookup. On a real
PostgreSQL server (``tests/postgres_server.py``)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import REGISTRY

from broker_core.codec.batch_header import read_header
from broker_core.codec.records import encode_batch, key_values
from broker_core.storage import LogConfig, PartitionStore, SharedLog, Storage, open_storage
from broker_core.system_topic_index import PAGE, KeyIndex, Record
from tests.postgres_server import shared_server

TOPIC = "public/__kafka/__transaction_state"


@pytest.fixture
def storage() -> Iterator[Storage]:
    opened = open_storage(shared_server().new_database_url(), LogConfig())
    try:
        yield opened
    finally:
        opened.close()


def _log(storage: Storage) -> PartitionStore:
    storage.create_topic(TOPIC, 1, {"retention.ms": "-1"})
    found = storage.partition(TOPIC, 0)
    assert found is not None
    return found


def _write(log: PartitionStore, records: Sequence[Record]) -> int:
    batch = encode_batch(records, 1_000)
    return log.append(batch, read_header(batch))


def _lookup(log: PartitionStore, index: KeyIndex, key: bytes) -> Record | None:
    assert isinstance(log, SharedLog)
    return log.search(lambda read: index.newest(key, read, log.log_start_offset))


def _truth(log: PartitionStore, key: bytes) -> Record | None:
    """The newest record of ``key`` by reading every stored batch forward."""
    found: Record | None = None
    if log.log_start_offset < log.next_offset:
        for info in log.batches_from(log.log_start_offset):
            for record in key_values(info.batch):
                if record[0] == key:
                    found = record
    return found


def _costs() -> tuple[float, float]:
    def value(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0
    return (value("kop_server_state_lookup_statements_total"),
            value("kop_server_state_lookup_batches_total"))


def _cost_of(log: PartitionStore, index: KeyIndex, key: bytes
             ) -> tuple[Record | None, tuple[float, float]]:
    before = _costs()
    found = _lookup(log, index, key)
    after = _costs()
    return found, (after[0] - before[0], after[1] - before[1])


def test_an_absent_key_reads_the_partition_once(storage: Storage) -> None:
    """The first lookup of a key the partition lacks reads it whole; the next ones, of it
    or any other absent key, one statement of what was written since."""
    log = _log(storage)
    for n in range(3 * PAGE):
        _write(log, [(f"k{n}".encode(), b"v")])
    index = KeyIndex()
    found, (statements, batches) = _cost_of(log, index, b"absent")
    assert found is None and batches == 3 * PAGE and statements > 1  # each batch once
    for key in (b"absent", b"other", b"absent"):
        assert _cost_of(log, index, key) == (None, (1, 0))
    assert _cost_of(log, index, b"k0") == ((b"k0", b"v"), (1, 1))  # its batch only
    _write(log, [(b"absent", b"now")])  # a record written later is seen at once
    assert _cost_of(log, index, b"absent") == ((b"absent", b"now"), (1, 1))


def test_a_key_near_the_top_costs_one_statement_cold(storage: Storage) -> None:
    """A cold index reads from the newest batch back to the key only."""
    log = _log(storage)
    for n in range(3 * PAGE):
        _write(log, [(f"k{n}".encode(), b"v")])
    found, (statements, batches) = _cost_of(log, KeyIndex(), f"k{3 * PAGE - 2}".encode())
    assert found == (f"k{3 * PAGE - 2}".encode(), b"v") and statements == 1
    assert batches == PAGE


def test_it_agrees_with_the_stored_batches_through_writes_and_compactions(
        storage: Storage) -> None:
    """Random writes (tombstones too), snapshot compactions (the live state written again
    after the newest batch, then everything before it deleted) and lookups of present,
    overwritten, deleted and absent keys: every lookup says what the stored batches say."""
    log = _log(storage)
    rng = random.Random(890)
    keys = [f"tid-{n}".encode() for n in range(40)]
    index = KeyIndex()
    live: dict[bytes, bytes] = {}
    for step in range(600):
        action = rng.random()
        if action < 0.45:
            records: list[Record] = []
            for key in rng.sample(keys, rng.randint(1, 4)):
                value = None if rng.random() < 0.15 else f"{step}".encode()
                records.append((key, value))
                if value is None:
                    live.pop(key, None)
                else:
                    live[key] = value
            _write(log, records)
        elif action < 0.48 and live:
            start = log.next_offset
            for key, value in live.items():
                _write(log, [(key, value)])
            log.delete_records_before(start)
        else:
            key = rng.choice([*keys, b"never"])
            assert _lookup(log, index, key) == _truth(log, key), (step, key)
