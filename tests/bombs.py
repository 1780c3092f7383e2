"""Compression bombs for each Kafka codec, as a hostile client would put them in a batch's
payload: 80 MiB of zeros packed into a few kilobytes (snappy packs at most about 21 to 1,
so its bomb is a block that claims 80 MiB ahead of a small body)."""

from __future__ import annotations

import functools
import gzip
import struct
from collections.abc import Callable

import lz4.frame
import snappy
import zstandard

from broker_core.codec.varints import uvarint

INFLATED = 80 * 1024 * 1024


def _xerial_snappy() -> bytes:
    body = snappy.compress(bytes(1000))
    block = uvarint(INFLATED) + body[len(uvarint(1000)):]
    return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block


BOMBS: dict[int, Callable[[], bytes]] = {
    1: functools.cache(lambda: gzip.compress(bytes(INFLATED), compresslevel=1)),
    2: _xerial_snappy,
    # independent blocks, as Kafka's reader takes them (linked ones are refused unread)
    3: functools.cache(lambda: lz4.frame.compress(bytes(INFLATED), block_linked=False)),
    4: functools.cache(lambda: zstandard.ZstdCompressor().compress(bytes(INFLATED))),
}
