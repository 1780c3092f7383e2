"""Where a produced batch's records are walked (``validateRecords``): where it is admitted,
on the event loop, only while that costs about the bytes that came (an uncompressed batch,
or a compressed one inflating to at most 16 times its payload and 64 KiB); any other is
inflated and walked in the engine's rework step, in a worker thread: a few kilobytes of
zstd may inflate to the 64 MiB cap, work no other client's request may wait for. Either
way the outcome is the same. The engine is driven directly, on real (in-memory) storage;
what a client sees (INVALID_RECORD, nothing written) is tested against a broker in
test_record_validation."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.codec.batch_header import BatchHeader, read_header
from broker_core.codec.compression import deflate
from broker_core.codec.records import HERE_BYTES, check_records, checked_here
from broker_core.engine import Engine
from broker_core.engine_config import EngineConfig
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import LogConfig, open_storage
from broker_core.storage.cluster import BrokerRecord
from tests.bombs import BOMBS
from tests.raw import compressed_batch, resealed

TOPIC = "public/default/t"
CODECS = [1, 2, 3, 4]


def _batch(codec: int, count: int = 50, value: bytes = b"v") -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec,
                                        is_transactional=False, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 24)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=value + b"%d" % i,
                       headers=[])
    return bytes(builder.build())


def _roomy(codec: int) -> bytes:
    """A good batch whose payload inflates past 64 KiB and 16 times its size."""
    return _batch(codec, 200, b"x" * 2000)


async def _engine() -> Engine:
    engine = Engine(EngineConfig(offsets_topic_partitions=1, txn_topic_partitions=1,
                                 flush_interval_ms=0),
                    open_storage("memory://", LogConfig()))
    engine.start()
    await engine.join(BrokerRecord(0, None, ()))
    engine.logs.create_topic(TOPIC, 1, {})
    return engine


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_inflating_to_much_more_than_came_is_walked_in_a_worker_thread(
        codec: int) -> None:
    """A bomb passes admission uninflated and is refused INVALID_RECORD by the rework
    (which runs in the engine's rework threads); a good batch inflating as much is walked
    there too, then stored; a small compressed one is walked where it is admitted."""
    async def run() -> None:
        engine = await _engine()
        try:
            bomb = engine.admit(TOPIC, 0, compressed_batch(codec, BOMBS[codec]()), -1)
            assert bomb.rework is not None and bomb.rework.walk  # not inflated here
            with pytest.raises(KafkaApiError) as refused:
                await engine.reworked(bomb)
            assert refused.value.code == ErrorCode.INVALID_RECORD
            assert "malformed record" in refused.value.message
            roomy = engine.admit(TOPIC, 0, _roomy(codec), -1)
            assert roomy.rework is not None and roomy.rework.walk
            assert engine.append(await engine.reworked(roomy)).base_offset == 0
            small = engine.admit(TOPIC, 0, _batch(codec), -1)
            assert small.rework is None  # walked already
            assert engine.append(small).base_offset == 200
        finally:
            await engine.stop()

    asyncio.run(run())


def test_an_uncompressed_batch_is_walked_where_it_is_admitted() -> None:
    """Its walk costs what came, no more: no thread hop for it."""
    async def run() -> None:
        engine = await _engine()
        try:
            assert engine.admit(TOPIC, 0, _batch(0, 2000), -1).rework is None
            spoiled = bytearray(_batch(0))
            spoiled[61:] = b"\xff" * (len(spoiled) - 61)
            with pytest.raises(KafkaApiError) as refused:
                engine.admit(TOPIC, 0, resealed(spoiled), -1)
            assert refused.value.code == ErrorCode.INVALID_RECORD
        finally:
            await engine.stop()

    asyncio.run(run())


def _outcome(check: Callable[[bytes, BatchHeader], bool | None], batch: bytes) -> str:
    header = read_header(batch)
    try:
        done = check(batch, header)
    except KafkaApiError as error:
        return f"{error.code}: {error.message}"
    return "not here" if done is False else "fine"


def _spoiled_payloads(codec: int) -> list[bytes]:
    """Payloads that fail in many ways, each small enough to be checked here."""
    good = zlib.decompress(_batch(1)[61:], wbits=31)  # the plain records of _batch(1)
    packed = deflate(codec, good)
    return [
        deflate(codec, good[:-3]),  # the last record cut short
        deflate(codec, good + b"\x0c"),  # a record declaring 6 bytes past the end
        deflate(codec, b"\x00" * 64),  # a record declaring 0 bytes
        deflate(codec, good.replace(b"v7", b"w7", 1)[:40] + good[40:]),  # still fine
        packed[:len(packed) // 2],  # the stream cut in two
        bytes((i * 37 + 11) % 256 for i in range(40)),  # garbage no codec takes
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_a_batch_checked_where_it_is_admitted_fails_as_it_would_in_a_worker(
        codec: int) -> None:
    """What ``checked_here`` decides is what ``check_records`` (the worker's check) does,
    error message included; what inflates past its bound is left to the worker."""
    for payload in _spoiled_payloads(codec):
        batch = compressed_batch(codec, payload, count=50)
        here = _outcome(checked_here, batch)
        assert here in ("not here", _outcome(check_records, batch)), (here, payload[:20])
    roomy = _roomy(codec)
    assert len(zlib.decompress(_roomy(1)[61:], wbits=31)) > HERE_BYTES
    assert _outcome(checked_here, roomy) == "not here"
    assert _outcome(check_records, roomy) == "fine"
