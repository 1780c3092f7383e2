"""A minimal blocking Kafka connection for tests that need exact requests and raw bytes."""

from __future__ import annotations

import socket
import struct
from typing import Any

import crc32c
from kafka.protocol.consumer import FetchRequest

from tests.batches import build_batch


class RawConnection:
    """Sends requests built with ``kafka.protocol`` classes and decodes their responses."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 10.0,
                 source: str | None = None) -> None:
        """``source``: the local address to connect from (any 127.x.y.z on loopback)."""
        self.sock = socket.create_connection(
            (host, port), timeout=timeout,
            source_address=None if source is None else (source, 0))
        self.correlation_id = 0

    def close(self) -> None:
        """Close the socket."""
        self.sock.close()

    def send_frame(self, payload: bytes) -> None:
        """Send ``payload`` behind a correct size prefix."""
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def request_bytes(self, request: Any, version: int) -> bytes:
        """Encode a request with its header (v1, or v2 when the version is flexible)."""
        self.correlation_id += 1
        flexible = request.flexible_version_q(version)
        client = b"raw-test"
        header = struct.pack(">hhih", request.API_KEY, version, self.correlation_id,
                             len(client)) + client
        if flexible:
            header += b"\x00"
        return header + bytes(request.encode(version=version))

    def read_frame(self) -> bytes:
        """Read one response frame; raise ConnectionError when the broker closed."""
        size = struct.unpack(">i", self._read_exactly(4))[0]
        return self._read_exactly(size)

    def _read_exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("closed by broker")
            data += chunk
        return data

    def call(self, request: Any, version: int, response_class: Any) -> Any:
        """Send a request and decode its response (header v1 when flexible, except ApiVersions)."""
        self.send_frame(self.request_bytes(request, version))
        frame = self.read_frame()
        (correlation,) = struct.unpack_from(">i", frame, 0)
        assert correlation == self.correlation_id
        flexible = response_class.flexible_version_q(version) and response_class.API_KEY != 18
        return decode_whole(response_class, frame[5 if flexible else 4:], version)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes the connection within ``timeout`` (what it sends
        meanwhile is read and dropped; on TLS a failed or cut session counts as closed)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
        except TimeoutError:
            return False
        except OSError:  # a reset, or TLS's ssl.SSLError
            return True


def decode_whole(response_class: Any, body: bytes, version: int) -> Any:
    """``body`` decoded as ``response_class`` at ``version``, which must take every byte of it.

    kafka-python's ``decode`` stops where its schema ends and ignores what follows, so an
    answer carrying a field its version must not have would pass; this decodes with the same
    compiled decoder and checks where it stopped. An ApiVersions answer with an error is a
    v0 body whatever the version asked (KIP-511), as kafka-python's own decode assumes."""
    if response_class.API_KEY == 18 and struct.unpack_from(">h", body, 0)[0] != 0:
        version = 0
    flexible = response_class.flexible_version_q(version)
    decode = response_class._struct.compiled_decode_from(
        version, compact=flexible, tagged=flexible, data_class=response_class[None])
    answer, end = decode(memoryview(body), 0)
    assert end == len(body), (
        f"{response_class[None].__name__} v{version}: {len(body) - end} bytes beyond its schema")
    return answer


def fetch_request(topic: str, offset: int, max_wait_ms: int = 0, min_bytes: int = 1,
                  partition: int = 0) -> Any:
    """A Fetch v11 of ``partition`` of ``topic`` from ``offset`` (1 MiB limits)."""
    part = FetchRequest.FetchTopic.FetchPartition(
        partition=partition, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
        log_start_offset=-1, partition_max_bytes=1 << 20)
    return FetchRequest[11](replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes,
                            max_bytes=1 << 20, isolation_level=0, session_id=0,
                            session_epoch=-1, topics=[FetchRequest.FetchTopic(
                                topic=topic, partitions=[part])],
                            forgotten_topics_data=[], rack_id="")


def record_batch(count: int, timestamp: int = 1_700_000_000_000, value: bytes = b"v") -> bytes:
    """An uncompressed v2 batch of ``count`` records."""
    return bytes(build_batch([(f"k{i}".encode(), value) for i in range(count)],
                             timestamp=timestamp))


def resealed(batch: bytearray) -> bytes:
    """The batch with its length and CRC made right again after an edit, as a careless or
    hostile client would send it (the CRC covers the attributes onwards)."""
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def compressed_batch(codec: int, payload: bytes, count: int = 1) -> bytes:
    """A batch flagged with compression ``codec`` (1 gzip .. 4 zstd) whose payload is
    ``payload`` as given: garbage, or a bomb, behind a right CRC."""
    batch = bytearray(record_batch(count))
    struct.pack_into(">h", batch, 21, codec)
    return resealed(batch[:61] + bytearray(payload))
