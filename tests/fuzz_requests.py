"""Schema-driven request generator for fuzzing the broker: well-formed requests of every
served API and version, with field values drawn towards the edges (negative and extreme
numbers, empty, long, odd or reserved names, nulls, garbage record bytes).

Each request decodes cleanly, so the broker has to answer it with error codes. A closed
connection or a traceback in the log means a handler broke on input a client can send.
``python -m tests.fuzz_requests PORT [COUNT] [SEED]`` fuzzes a running broker.
"""

from __future__ import annotations

import random
import struct
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import crc32c
from kafka.protocol.api_message import ApiMessage

from broker_core.apis import engine_apis
from broker_core.context import RequestContext
from broker_core.dispatch import ApiSpec
from broker_core.quotas.apis import QuotaApis
from broker_core.quotas.entities import QuotaEntity
from broker_core.quotas.store import QuotaStore
from broker_core.storage.memory import MemoryKeyValues
from tests.raw import RawConnection, compressed_batch, record_batch

TOPIC = "fuzz-topic"
"""A topic the fuzzed broker has (3 partitions, a few records), so handlers go deep."""
GROUP = "fuzz-group"

QUOTA_KEYS = ["max_topics", "max_partitions", "max_stored_bytes", "no_such_rate"]
"""Quota keys AlterClientQuotas may be given: the caps only, whose excess is answered with
an error code (a rate or connection quota could mute or refuse the fuzzer itself)."""

_INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "uint16": 16}


@dataclass(frozen=True, slots=True)
class FuzzCase:
    """One request: its API's name and key, the version and the request object."""

    api: str
    key: int
    version: int
    request: Any

    def describe(self) -> str:
        """The case as a failure report shows it."""
        return f"{self.api} v{self.version}: {self.request}"


class Generator:
    """Random field values for a request schema, biased towards edge cases."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, type_str: str, name: str) -> int:
        bits = _INT_RANGES[type_str]
        low, high = (0, 2**bits - 1) if type_str.startswith("u") else (-(2**bits), 2**bits - 1)
        if "timeout" in name.lower() or "wait" in name.lower():
            # a long wait only slows the fuzzing down; its extremes are still tried
            return self.rng.choice([0, 0, 1, 100, -1, low])
        if "partition" in name.lower() and self.rng.random() < 0.5:
            return self.rng.choice([0, 1, 2, 3, -1])
        return self.rng.choice([0, 0, 1, -1, 2, low, high, self.rng.randint(low, high)])

    def string(self, name: str) -> str:
        lowered = name.lower()
        if "topic" in lowered or lowered in {"name", "resource_name"}:
            pool = [TOPIC, TOPIC, "", "public/default/" + TOPIC, "__consumer_offsets",
                    "a/b/c/d", "..", ".", "x" * 300, "t\u00ebst", "other/ns/" + TOPIC,
                    "no-such-topic"]
        elif "group" in lowered:
            pool = [GROUP, "", "g" * 300, "\u00fc"]
        elif "member" in lowered:
            pool = ["", "m-1", "x" * 200]
        elif "transactional" in lowered:
            pool = ["tid", "", "t" * 300]
        elif lowered == "entity_type":
            pool = ["user", "client-id", "tenant", "namespace", "ip", "group", ""]
        elif lowered in {"entity_name", "match"}:
            pool = ["fuzzco", "public", "fuzzco/default", "public/default", "127.0.0.1",
                    "::1", "x", "", "a/b/c", "\u0000"]
        elif "config" in lowered or "key" in lowered or "value" in lowered:
            pool = ["retention.ms", "cleanup.policy", "segment.bytes", "", "nope", "-1",
                    "compact,delete", "1" * 40, *QUOTA_KEYS]
        else:
            pool = ["", "x", "range", "consumer", "\u0000", "y" * 100]
        return self.rng.choice(pool)

    def raw_bytes(self) -> bytes:
        return self.rng.choice([b"", b"\x00" * 7, self.rng.randbytes(self.rng.randint(1, 80)),
                                record_batch(1), record_batch(3)[:-5], self.spoiled_batch()])

    def spoiled_batch(self) -> bytes:
        """A batch with one header field or some record bytes changed, its CRC made right
        again: it passes the CRC check, so what follows it must hold."""
        if self.rng.random() < 0.25:  # a compressed payload no codec takes
            return compressed_batch(self.rng.randint(1, 7),
                                    self.rng.randbytes(self.rng.randint(0, 200)))
        batch = bytearray(record_batch(self.rng.randint(1, 4), timestamp=self.rng.choice(
            [0, -1, 1_700_000_000_000, 2**62])))
        if self.rng.random() < 0.5:
            at, fmt = self.rng.choice([(8, ">i"), (21, ">h"), (23, ">i"), (27, ">q"), (35, ">q"),
                                       (43, ">q"), (51, ">h"), (53, ">i"), (57, ">i")])
            bits = struct.calcsize(fmt) * 8 - 1
            struct.pack_into(fmt, batch, at, self.rng.choice(
                [0, -1, 1, 2**bits - 1, -(2**bits), self.rng.randint(-(2**bits), 2**bits - 1)]))
        else:
            at = self.rng.randrange(61, len(batch))
            batch[at:at + 4] = self.rng.randbytes(len(batch[at:at + 4]))
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
        return bytes(batch)  # not resealed(): an edited length must stay as edited

    def scalar(self, type_str: str, name: str, nullable: bool) -> Any:
        if nullable and self.rng.random() < 0.2:
            return None
        if type_str in _INT_RANGES:
            return self.integer(type_str, name)
        if type_str == "string":
            return self.string(name)
        if type_str in ("bytes", "records"):
            return self.raw_bytes()
        if type_str == "bool":
            return self.rng.random() < 0.5
        if type_str == "uuid":
            return self.rng.choice([uuid.UUID(int=0), uuid.uuid4()])
        if type_str == "float64":
            return self.rng.choice([0.0, -1.0, 1e308, 0.5])
        raise ValueError(f"no generator for {type_str}")

    def value(self, field: Any, version: int) -> Any:
        nullable = bool(field.nullable_for_version_q(version))
        name = field.name
        if field.is_struct_array():
            if nullable and self.rng.random() < 0.15:
                return None
            return [self.struct(field.data_class, field.fields, version)
                    for _ in range(self.rng.choice([0, 1, 1, 2, 3]))]
        if field.is_struct():
            return self.struct(field.data_class, field.fields, version)
        if field.is_array():
            if nullable and self.rng.random() < 0.15:
                return None
            inner = field.type_str.removeprefix("[]")
            return [self.scalar(inner, name, False)
                    for _ in range(self.rng.choice([0, 1, 1, 2, 3]))]
        return self.scalar(field.type_str, name, nullable)

    def struct(self, cls: Any, fields: Any, version: int) -> Any:
        return cls(**self.kwargs(fields, version))

    def kwargs(self, fields: Any, version: int) -> dict[str, Any]:
        listed = fields.values() if isinstance(fields, dict) else fields
        return {field.name: self.value(field, version) for field in listed
                if field.for_version_q(version)}


class _Everyone:
    """A quota scope for building the quota APIs' table here (never asked: the fuzzed
    broker answers with its own)."""

    def may_see(self, ctx: RequestContext, entity: QuotaEntity) -> bool:
        return True

    def may_alter(self, ctx: RequestContext, entity: QuotaEntity) -> bool:
        return True


def served_apis() -> list[ApiSpec]:
    """The engine's APIs and the client-quota APIs the broker adds to them."""
    return engine_apis() + QuotaApis(QuotaStore(MemoryKeyValues()), _Everyone()).specs()


def cases(count: int, seed: int) -> Iterator[FuzzCase]:
    """``count`` requests spread evenly over every served API and version."""
    rng = random.Random(seed)
    generator = Generator(rng)
    targets = [(spec, version) for spec in served_apis()
               for version in range(spec.min_version, spec.max_version + 1)]
    for n in range(count):
        spec, version = targets[n % len(targets)]
        cls = spec.request[version]
        request = cls(**generator.kwargs(cls.fields, version))
        yield FuzzCase(spec.name, spec.key, version, request)


class AsWritten:
    """A request encoded exactly as its fields hold, past the fix-ups of kafka-python's
    request classes (MetadataRequest v0 turns a null topic array into an empty one)."""

    def __init__(self, request: Any) -> None:
        self.request = request
        self.API_KEY = request.API_KEY
        self.flexible_version_q = request.flexible_version_q

    def encode(self, version: int) -> bytes:
        return bytes(ApiMessage.encode(self.request, version=version))

    def __str__(self) -> str:
        return str(self.request)


def null_array_cases(seed: int = 0) -> Iterator[tuple[FuzzCase, str, bool]]:
    """For every served API and version, one request per top-level array field with that
    field null (whatever its schema allows) and the rest drawn as :func:`cases` draws them;
    each with the field's name and whether the schema lets it be null."""
    generator = Generator(random.Random(seed))
    for spec in served_apis():
        for version in range(spec.min_version, spec.max_version + 1):
            cls = spec.request[version]
            fields = cls.fields.values() if isinstance(cls.fields, dict) else cls.fields
            for field in fields:
                if field.for_version_q(version) and field.is_array():
                    kwargs = generator.kwargs(cls.fields, version) | {field.name: None}
                    if spec.key == 0:
                        kwargs["acks"] = -1  # answered, so a broken answer shows
                    yield (FuzzCase(spec.name, spec.key, version, AsWritten(cls(**kwargs))),
                           field.name, bool(field.nullable_for_version_q(version)))


@dataclass(slots=True)
class Outcome:
    """What the fuzzed broker did: requests answered, left parked (a long poll, a
    rebalance) and those after which it closed the connection (the faults)."""

    answered: int = 0
    parked: int = 0
    broken: list[str] | None = None


def run(port: int, count: int, seed: int, timeout: float = 3.0,
        connect: Callable[[], RawConnection] | None = None) -> Outcome:
    """Send the cases one by one over one connection (a new one after a park or a close),
    made by ``connect`` (which may log in) or else a plain one to ``port``."""
    outcome = Outcome(broken=[])
    broken = outcome.broken
    assert broken is not None
    if connect is None:
        def connect() -> RawConnection:
            return RawConnection(port, timeout=timeout)

    conn = connect()
    for case in cases(count, seed):
        frame = conn.request_bytes(case.request, case.version)
        acks_zero = case.key == 0 and getattr(case.request, "acks", 1) == 0
        try:
            conn.send_frame(frame)
            if acks_zero:  # no answer; a refused partition closes the connection, as
                conn.close()  # Kafka's: the next case goes on a new one
                conn = connect()
                continue
            answer = conn.read_frame()
            (correlation,) = struct.unpack_from(">i", answer, 0)
            if correlation != conn.correlation_id:
                broken.append(f"wrong correlation id after {case.describe()}")
            outcome.answered += 1
        except TimeoutError:
            outcome.parked += 1
            conn.close()  # a parked request (a long poll, a rebalance): not a fault
            conn = connect()
        except OSError:  # closed, reset or refused
            broken.append(case.describe())
            conn.close()
            conn = connect()
    conn.close()
    return outcome


if __name__ == "__main__":
    port = int(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    result = run(port, count, seed)
    print(f"answered {result.answered}, parked {result.parked}")
    for line in result.broken or []:
        print("CLOSED:", line[:400])
