"""One connection's requests take effect in the order they arrived, by construction.

A client may pipeline requests (librdkafka sends up to ``max.in.flight`` produces at once);
the broker runs each request's dispatch stage (gate, authorizer, the handler up to its
append) one after another, and only waiting stages overlap (``broker_core.stages``). The
in-process tests make the gate slow by a random number of awaits, as a future change to
the session or the authorizer might: the order must hold anyway. The broker-process tests
show the waiting stages still overlap: a parked long-poll fetch or JoinGroup does not hold
up the requests behind it on the same connection.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.consumer import (
    FetchResponse,
    JoinGroupRequest,
    JoinGroupResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_core.dispatch import ParsedRequest
from edge.app import BrokerApp
from edge.config import load_config
from edge.session import Session
from tests.broker_process import BrokerProcess
from tests.conftest import engine_settings
from tests.raw import RawConnection, fetch_request, record_batch
from tests.txn_helpers import NONE, TxnConnection, batch

PIPELINED = 60
pytestmark = pytest.mark.storage_engines


def _produce(conn: RawConnection, topic: str, records: bytes) -> bytes:
    data = ProduceRequest.TopicProduceData(name=topic, partition_data=[
        ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])
    return conn.request_bytes(ProduceRequest[9](transactional_id=None, acks=-1,
                                                timeout_ms=5000, topic_data=[data]), 9)


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _responses(conn: RawConnection, count: int) -> list[tuple[int, bytes]]:
    """``count`` response frames: (correlation id, body after a v0 header)."""
    frames = [conn.read_frame() for _ in range(count)]
    return [(struct.unpack_from(">i", frame)[0], frame[4:]) for frame in frames]


def _pipeline_produces_and_metadata(port: int, topic: str) -> list[tuple[int, int, int]]:
    """Write ``PIPELINED`` idempotent one-record produces (sequences 0, 1, …) to partition 0
    interleaved with Metadata requests, all at once; return per produce (correlation id of
    the request, correlation id of the response at its place, base offset, error)."""
    conn = TxnConnection(port)
    try:
        assert conn.create_topic(topic) == NONE
        pid, epoch = conn.init_ok(None)
        frames = b""
        sent: list[tuple[int, str]] = []
        for sequence in range(PIPELINED):
            frames += _framed(_produce(conn, topic, batch(pid, epoch, sequence)))
            sent.append((conn.correlation_id, "produce"))
            frames += _framed(conn.request_bytes(MetadataRequest[1](topics=None), 1))
            sent.append((conn.correlation_id, "metadata"))
        conn.sock.sendall(frames)
        answers = _responses(conn, len(sent))
    finally:
        conn.close()
    assert [correlation for correlation, _ in answers] == [c for c, _ in sent], \
        "responses left out of request order"
    produced = []
    for (correlation, kind), (_, body) in zip(sent, answers, strict=True):
        if kind == "metadata":
            MetadataResponse[1].decode(body)
            continue
        part = ProduceResponse[9].decode(body[1:]).responses[0].partition_responses[0]
        produced.append((correlation, int(part.error_code), int(part.base_offset)))
    return produced


def _assert_in_request_order(produced: list[tuple[int, int, int]]) -> None:
    errors = [error for _, error, _ in produced]
    assert errors == [NONE] * PIPELINED, f"produce errors in request order: {errors}"
    offsets = [offset for _, _, offset in produced]
    assert offsets == list(range(PIPELINED)), f"base offsets in request order: {offsets}"


@pytest.fixture
def slow_gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every request waits a random number of event-loop turns and a random short sleep in
    the session before its handler runs (what one await added to the gate or the
    authorizer would do); yields the API keys in the order their handlers started."""
    started: list[int] = []
    rng = random.Random(17)
    real: Callable[[Session, ParsedRequest], Awaitable[object]] = Session._answer

    async def slow(self: Session, parsed: ParsedRequest) -> object:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        await asyncio.sleep(rng.random() / 500)
        started.append(parsed.header.api_key)
        return await real(self, parsed)

    monkeypatch.setattr(Session, "_answer", slow)
    yield started


def _in_process(tmp_path: Path, engine: str, work: Callable[[int], Any]) -> Any:
    """Run a broker on ``engine`` in this process and ``work(port)`` in a thread beside it."""
    config = load_config(None, [f"dataDir={tmp_path / 'data'}",
                                "kafkaListeners=PLAINTEXT://127.0.0.1:0",
                                *(f"{k}={v}" for k, v in engine_settings(engine).items())])

    async def run() -> Any:
        app = BrokerApp(config)
        bound = await app.start()
        try:
            return await asyncio.to_thread(work, bound[0].port)
        finally:
            await app.stop(quiet=True)

    return asyncio.run(run())


def test_pipelined_produces_keep_request_order_through_a_slow_gate(
        tmp_path: Path, topic_name: str, storage_engine: str, slow_gate: list[int]) -> None:
    """Were requests of a connection run side by side, the random awaits before the
    handler would reorder the appends (OUT_OF_ORDER_SEQUENCE_NUMBER, offsets out of
    request order). On PostgreSQL each produce also has a waiting stage (its commit)."""
    produced = _in_process(tmp_path, storage_engine,
                           lambda port: _pipeline_produces_and_metadata(port, topic_name))
    _assert_in_request_order(produced)
    produce_key = ProduceRequest.API_KEY
    assert slow_gate.count(produce_key) == PIPELINED  # the slow gate did run


def test_pipelined_produces_keep_request_order(broker: BrokerProcess, topic_name: str) -> None:
    _assert_in_request_order(_pipeline_produces_and_metadata(broker.port, topic_name))


def test_a_parked_fetch_does_not_hold_up_the_produce_behind_it(
        broker: BrokerProcess, topic_name: str) -> None:
    """A long-poll fetch of an empty partition, then a produce to it, pipelined on one
    connection: the produce is dispatched while the fetch waits, so the fetch wakes with
    its record (were the fetch's wait in its dispatch stage, the fetch would park for its
    60 s and the socket time out)."""
    conn = TxnConnection(broker.port)
    try:
        assert conn.create_topic(topic_name) == NONE
        fetch = fetch_request(topic_name, 0, max_wait_ms=60_000)
        frames = _framed(conn.request_bytes(fetch, 11))
        fetched_id = conn.correlation_id
        frames += _framed(_produce(conn, topic_name, record_batch(1)))
        conn.sock.sendall(frames)
        (first, fetched), (second, produced) = _responses(conn, 2)
    finally:
        conn.close()
    assert (first, second) == (fetched_id, fetched_id + 1)
    answer = FetchResponse[11].decode(fetched).responses[0].partitions[0]
    assert answer.error_code == NONE
    assert answer.high_watermark == 1 and answer.records, "the fetch did not see the produce"
    assert ProduceResponse[9].decode(produced[1:]).responses[0].partition_responses[0] \
        .error_code == NONE


def test_two_members_joining_on_one_connection_join_one_generation(
        broker: BrokerProcess) -> None:
    """Two JoinGroups pipelined on one connection (v3: no member id round trip): the first
    waits for the rebalance in its waiting stage, so the second joins the same
    generation; were the first's wait in its dispatch stage, it would complete alone and
    the second would start another rebalance."""
    conn = RawConnection(broker.port)
    # as a client does first: on a shared database the broker claims the group's
    # partition on this request (until then a JoinGroup is answered NOT_COORDINATOR)
    found = conn.call(FindCoordinatorRequest[1](key="order-group", key_type=0), 1,
                      FindCoordinatorResponse[1])
    assert found.error_code == NONE
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"meta")
    frames = b""
    for _ in range(2):
        frames += _framed(conn.request_bytes(JoinGroupRequest[3](
            group_id="order-group", session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
            member_id="", protocol_type="consumer", protocols=[protocol]), 3))
    try:
        conn.sock.sendall(frames)
        answers = [JoinGroupResponse[3].decode(body) for _, body in _responses(conn, 2)]
    finally:
        conn.close()
    assert [a.error_code for a in answers] == [NONE, NONE]
    assert answers[0].generation_id == answers[1].generation_id
    leader = next(a for a in answers if a.member_id == a.leader)
    assert len(leader.members) == 2
