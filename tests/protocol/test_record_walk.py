"""The C record walker and the Python one answer alike: the same batches pass, and the
same error (same message) fails the rest. The corpus: batches from kafka-python's encoder
(every codec, keys, null keys and values, headers) and hostile mutations of them
(truncations, huge and over-long varints, negative lengths, wrong counts, trailing bytes,
random byte changes). Under ``make test`` the library must be the one loaded."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_core.codec.batch_header import read_header
from broker_core.codec.errors import MalformedBatch
from broker_core.codec.record_walk import LIBRARY_ENV, NATIVE, NOTE, NativeWalker, load
from broker_core.codec.records import records_buffer, walk_records
from broker_core.codec.varints import Buffer
from tests.batches import build_batch
from tests.broker_process import BrokerProcess
from tests.protocol.test_bad_input import INVALID_RECORD, create, latest_offset, produce
from tests.raw import RawConnection, record_batch, resealed

SOURCE = Path(__file__).resolve().parents[2] / "broker_core" / "codec" / "native" / "record_walk.c"


def test_the_native_walker_is_loaded_when_make_built_it() -> None:
    """The Makefile builds the library and names it in $EDGE_RECORD_WALK_LIB for pytest:
    then it must load (a broken build fails here instead of silently walking in Python)."""
    if not os.environ.get(LIBRARY_ENV):
        pytest.skip(f"${LIBRARY_ENV} unset: not run by make ({NOTE})")
    assert NATIVE is not None, NOTE


def test_a_missing_library_falls_back_with_a_reason(tmp_path: Path) -> None:
    walker, note = load(str(tmp_path / "absent.so"))
    assert walker is None and "walks records in Python" in note and "absent.so" in note
    junk = tmp_path / "junk.so"
    junk.write_bytes(b"not a library")
    walker, note = load(str(junk))
    assert walker is None and "does not load" in note


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> NativeWalker:
    """The loaded walker, else one compiled here (when a C compiler is around)."""
    if NATIVE is not None:
        return NATIVE
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip(f"no C compiler, no native walker ({NOTE})")
    library = tmp_path_factory.mktemp("native") / "record_walk.so"
    subprocess.run([compiler, "-O2", "-std=c11", "-shared", "-fPIC", "-o", str(library),
                    str(SOURCE)], check=True)
    walker, note = load(str(library))
    assert walker is not None, note
    return walker


Shape = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]]


def _batch(records: Shape, compression: int = 0) -> tuple[bytes, int, int]:
    """A batch from kafka-python's encoder: its records' buffer, their start and count."""
    batch = bytes(build_batch(records, timestamp=1_700_000_000_000, timestamp_step=7,
                              compression=compression, batch_size=1 << 24))
    header = read_header(batch)
    buf, start = records_buffer(batch, header.compression)
    return bytes(buf), start, header.record_count


def _corpus() -> list[tuple[bytes, int, int]]:
    rng = random.Random(21)
    shapes: list[Shape] = [
        [(None, b"v", [])],
        [(b"k", b"value", [("h", b"x")])],
        [(None, None, [])] * 3,
        [(b"key-%d" % i, b"x" * (i * 37 % 300), [("a", b"1"), ("b", None)]) for i in range(20)],
        [(None if i % 3 == 0 else b"k", rng.randbytes(100), []) for i in range(10)],
        [(b"k", rng.randbytes(1024), [("trace", rng.randbytes(16))]) for i in range(4)],
        [(b"", b"", [("", b"")])],
    ]
    return [_batch(shape, codec) for shape in shapes for codec in (0, 1, 2, 3, 4)]


def _zigzag(value: int) -> bytes:
    """``value`` as a zigzag varint; past 64 bits as many 7-bit groups as it takes."""
    raw = value * 2 if value >= 0 else -value * 2 - 1
    out = bytearray()
    while raw >= 0x80:
        out.append(raw & 0x7F | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _record(body: bytes) -> bytes:
    return _zigzag(len(body)) + body


def _handmade() -> list[tuple[bytes, int, int]]:
    """Records written field by field: the hostile values a real encoder never writes."""
    fine = b"\x00" + _zigzag(0) + _zigzag(0)  # attributes, timestamp delta, offset delta
    huge = [2**62, 2**63 - 1, 2**63, 2**64, 2**69 + 5, -(2**63), -(2**63) - 1, -(2**69)]
    cases: list[bytes] = [
        _record(fine + _zigzag(-1) + _zigzag(-1) + _zigzag(0)),  # null key and value
        _record(fine + _zigzag(-2) + _zigzag(1) + b"v" + _zigzag(0)),
        _record(fine + _zigzag(1) + b"k" + _zigzag(-7) + _zigzag(0)),
        _record(fine + _zigzag(-1) + _zigzag(0) + _zigzag(-1)),  # -1 headers
        _record(fine + _zigzag(-1) + _zigzag(0) + _zigzag(1) + _zigzag(-1) + _zigzag(0)),
        _record(fine + _zigzag(-1) + _zigzag(0) + _zigzag(1) + _zigzag(0) + _zigzag(-1)),
        _record(fine + _zigzag(-1) + _zigzag(0) + _zigzag(2**62) + b"\x00\x00"),
        _record(b"\x00" + _zigzag(0) + _zigzag(1) + _zigzag(-1) + _zigzag(0) + _zigzag(0)),
        _record(b"\x00" + b"\xff" * 11 + b"\x01"),  # an over-long varint
        _zigzag(5) + b"\x00" * 5,  # too short a record
        _zigzag(-1) + b"\x00" * 8,
        b"\x80" * 10,  # a varint cut off
        b"",
    ]
    for value in huge:
        varint = _zigzag(value)
        if len(varint) > 10:
            continue
        cases.append(varint + fine)  # as the record length
        cases.append(_record(fine + varint + b"k" + _zigzag(0) + _zigzag(0)))  # key
        cases.append(_record(fine + _zigzag(0) + _zigzag(0) + varint))  # headers
        cases.append(_record(b"\x00" + varint + _zigzag(0) + _zigzag(-1) + _zigzag(-1)
                             + _zigzag(0)))  # timestamp delta
        cases.append(_record(b"\x00" + _zigzag(0) + varint + _zigzag(-1) + _zigzag(-1)
                             + _zigzag(0)))  # offset delta
    return [(case, 0, count) for case in cases for count in (0, 1, 2)]


def _mutations(buf: bytes, start: int, count: int,
               rng: random.Random) -> Iterator[tuple[bytes, int, int]]:
    yield buf, start, count
    yield buf, start, count + 1
    yield buf, start, count - 1
    yield buf + b"\x00", start, count
    yield buf + b"\x0c" + b"\x00" * 6, start, count  # a trailing record that is wrong
    for cut in range(start, len(buf), max(1, (len(buf) - start) // 60)):
        yield buf[:cut], start, count
    for _ in range(40):
        spoilt = bytearray(buf)
        at = rng.randrange(start, len(buf))
        choice = rng.randrange(4)
        if choice == 0:
            spoilt[at] = rng.randrange(256)
        elif choice == 1:
            spoilt[at:at] = b"\xff" * rng.randrange(1, 12)
        elif choice == 2:
            del spoilt[at:at + rng.randrange(1, 4)]
        else:
            spoilt[at:at + 10] = b"\xfe" * 9 + bytes([rng.randrange(128)])
        yield bytes(spoilt), start, count


def _outcome(buf: Buffer, start: int, count: int, keyed: bool,
             native: NativeWalker | None) -> str | None:
    try:
        walk_records(buf, start, count, keyed, native=native)
    except MalformedBatch as exc:
        return str(exc)
    return None


def _cases() -> Iterator[tuple[bytes, int, int]]:
    rng = random.Random(2026)
    for buf, start, count in _corpus():
        yield from _mutations(buf, start, count, rng)
    yield from _handmade()


def test_both_walkers_answer_alike(native: NativeWalker) -> None:
    checked = passed = 0
    for buf, start, count in _cases():
        for keyed in (False, True):
            python = _outcome(buf, start, count, keyed, None)
            assert _outcome(buf, start, count, keyed, native) == python, (buf, start, count)
            assert (native.walk(buf, start, count, keyed) is None) == (python is None)
            checked += 1
            passed += python is None
    assert passed > 50 and checked - passed > 1000  # both sides of the corpus are there


def test_the_encoders_batches_pass(native: NativeWalker) -> None:
    for buf, start, count in _corpus():
        assert native.walk(buf, start, count, False) is None


@pytest.mark.parametrize("wrap", [bytearray, memoryview, lambda b: memoryview(b"xx" + b)[2:],
                                  lambda b: memoryview(bytearray(b))])
def test_every_buffer_kind_is_walked(native: NativeWalker, wrap: type[Buffer]) -> None:
    buf, start, count = _corpus()[3]
    assert native.walk(wrap(buf), start, count, False) is None
    spoilt = bytearray(buf)
    spoilt[-1] ^= 0xFF
    assert _outcome(wrap(bytes(spoilt)), start, count + 1, False, native) == \
        _outcome(bytes(spoilt), start, count + 1, False, None)


def test_a_strided_view_is_walked_in_python(native: NativeWalker) -> None:
    buf, start, count = _corpus()[0]
    strided = memoryview(bytes(b for byte in buf for b in (byte, 0)))[::2]
    assert native.walk(strided, start, count, False) is False
    assert _outcome(strided, start, count, False, native) is None


def _wide(value: int, width: int, top: int = 0) -> bytes:
    """``value`` as a zigzag varint, padded with 0x80 continuation bytes to ``width``, its
    last byte ORed with ``top`` when padded (bits past the value's)."""
    raw = value * 2 if value >= 0 else -value * 2 - 1
    groups = []
    while True:
        groups.append(raw & 0x7F)
        raw >>= 7
        if not raw:
            break
    groups += [0] * (width - len(groups))
    if width:
        groups[-1] |= top
    return bytes(g | 0x80 for g in groups[:-1]) + bytes([groups[-1]])


def _wide_record(length_width: int = 0, ts_width: int = 0, delta_width: int = 0,
                 key_width: int = 0, headers_width: int = 0, top: int = 0) -> bytes:
    """One record (key b"k", value b"v", no headers) with each varint as wide as asked
    (and ``top`` set in the last byte of the widened ones)."""
    body = (b"\x00" + _wide(0, ts_width) + _wide(0, delta_width, top)
            + _wide(1, key_width, top) + b"k" + _wide(1, 0) + b"v"
            + _wide(0, headers_width, top))
    return _wide(len(body), length_width, top) + body


FIELDS = ["length_width", "delta_width", "key_width", "headers_width"]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("walker", ["python", "native"])
def test_32_bit_record_varints_over_5_bytes_are_refused(
        native: NativeWalker, field: str, walker: str) -> None:
    """Kafka reads them with ``readVarint`` (5 bytes at most; the Java client fails:
    "Varint is too long"): 5 bytes pass, 6 and more do not, in both walkers; the timestamp
    delta, a 64-bit varint, may take 10."""
    walk = native if walker == "native" else None
    walk_records(_wide_record(**{field: 5}), 0, 1, native=walk)
    walk_records(_wide_record(ts_width=10), 0, 1, native=walk)
    for width in (6, 10):
        with pytest.raises(MalformedBatch, match="varint runs over 5 bytes"):
            walk_records(_wide_record(**{field: width}), 0, 1, native=walk)
    with pytest.raises(MalformedBatch, match="more than 32 bits"):  # 5th byte: bits 28-34
        walk_records(_wide_record(**{field: 5}, top=0x10), 0, 1, native=walk)


@pytest.mark.parametrize("library", ["as loaded", "missing"])
def test_the_broker_says_which_walker_runs_and_refuses_garbage_either_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, topic_name: str,
        library: str) -> None:
    if library == "missing":
        monkeypatch.setenv(LIBRARY_ENV, str(tmp_path / "absent.so"))
        expected = "validateRecords walks records in Python"
    elif NATIVE is None:
        pytest.skip(NOTE)
    else:
        expected = f"validateRecords walks records in C ({NATIVE.path})"
    broker = BrokerProcess(tmp_path / "data").start()  # validateRecords by default
    try:
        assert expected in broker.wait_for_log("validateRecords walks")
        conn = RawConnection(broker.port)
        assert create(conn, topic_name) == 0
        spoiled = bytearray(record_batch(3))
        spoiled[61:] = b"\xff" * (len(spoiled) - 61)
        assert produce(conn, topic_name, resealed(spoiled)).error_code == INVALID_RECORD
        assert produce(conn, topic_name, record_batch(3)).error_code == 0
        assert latest_offset(conn, topic_name) == 3
        conn.close()
    finally:
        broker.stop()
