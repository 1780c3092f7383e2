"""A compressed batch is inflated and its records walked (``validateRecords``) in the
engine's rework step, in a worker thread, never where it is admitted on the event loop: a
few kilobytes of zstd may inflate to the 64 MiB cap, work no other client's request may
wait for. The engine is driven directly, on real (in-memory) storage; what a client sees
(INVALID_RECORD, nothing written) is tested against a broker in test_record_validation."""

from __future__ import annotations

import asyncio

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from tests.bombs import BOMBS
from tests.raw import compressed_batch, resealed

TOPIC = "public/default/t"


def _good(codec: int) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i in range(50):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i,
                       headers=[])
    return bytes(builder.build())


async def _engine() -> Engine:
    engine = Engine(EngineConfig(offsets_topic_partitions=1, txn_topic_partitions=1,
                                 flush_interval_ms=0),
                    open_storage("memory://", LogConfig()))
    engine.start()
    await engine.join(BrokerRecord(0, None, ()))
    engine.logs.create_topic(TOPIC, 1, {})
    return engine


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_compressed_batch_is_walked_in_a_worker_thread(codec: int) -> None:
    """A bomb passes admission untouched and is refused INVALID_RECORD by the rework (which
    runs in the engine's rework threads); a good batch is walked there too, then stored."""
    async def run() -> None:
        engine = await _engine()
        try:
            bomb = engine.admit(TOPIC, 0, compressed_batch(codec, BOMBS[codec]()), -1)
            assert bomb.rework is not None  # nothing inflated on the event loop
            with pytest.raises(KafkaApiError) as refused:
                await engine.reworked(bomb)
            assert refused.value.code == ErrorCode.INVALID_RECORD
            assert "malformed record" in refused.value.message
            good = engine.admit(TOPIC, 0, _good(codec), -1)
            assert good.rework is not None and good.rework.walk
            assert engine.append(await engine.reworked(good)).base_offset == 0
        finally:
            await engine.stop()

    asyncio.run(run())


def test_an_uncompressed_batch_is_walked_where_it_is_admitted() -> None:
    """Its walk costs what came, no more: no thread hop for it."""
    async def run() -> None:
        engine = await _engine()
        try:
            assert engine.admit(TOPIC, 0, _good(0), -1).rework is None
            spoiled = bytearray(_good(0))
            spoiled[61:] = b"\xff" * (len(spoiled) - 61)
            with pytest.raises(KafkaApiError) as refused:
                engine.admit(TOPIC, 0, resealed(spoiled), -1)
            assert refused.value.code == ErrorCode.INVALID_RECORD
        finally:
            await engine.stop()

    asyncio.run(run())
