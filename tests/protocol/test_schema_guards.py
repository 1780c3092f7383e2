"""kafka-python's generated request decoders refuse an unsigned varint longer than five
bytes once ``broker_core.dispatch`` is imported (``broker_core/codec/schema_guards.py``):
without the bound, a run of 0xFF bytes cost quadratic time on the event loop."""

from __future__ import annotations

import tracemalloc

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

import broker_core.dispatch  # noqa: F401  (installs the bound)
from broker_core.codec.schema_guards import MAX_BYTES
from broker_core.codec.varints import uvarint


def _api_versions_v3(name_length: bytes) -> bytes:
    """An ApiVersions v3 body whose client_software_name length is ``name_length`` (the
    compact encoding: length + 1) followed by an empty version and no tagged fields."""
    return name_length + b"\x01" + b"\x00"


def test_a_five_byte_varint_is_still_read() -> None:
    # 1 (an empty name) padded to five bytes: long, but within Kafka's limit
    body = ApiVersionsRequest.decode(_api_versions_v3(b"\x81\x80\x80\x80\x00"), version=3)
    assert body.client_software_name == ""


@pytest.mark.parametrize("extra", [1, 10, 70_000])
def test_a_longer_varint_is_refused(extra: int) -> None:
    # the same value padded past five bytes: kafka-python's own loop read it (the longer,
    # the slower: 70,000 bytes took a tenth of a second of quadratic work)
    padded = b"\x81" + b"\x80" * (MAX_BYTES - 2 + extra) + b"\x00"
    with pytest.raises(ValueError, match="longer than 5 bytes"):
        ApiVersionsRequest.decode(_api_versions_v3(padded), version=3)


def test_compact_array_counts_and_tags_are_bounded_too() -> None:
    # Metadata v12: a compact array of topics whose count is six bytes long
    with pytest.raises(ValueError, match="longer than 5 bytes"):
        MetadataRequest.decode(b"\x81\x80\x80\x80\x80\x00" + b"\x00\x00\x00", version=12)


def _metadata_v12(topics: list[bytes]) -> bytes:
    """A Metadata v12 body of these topic entries, auto-creation off, no tags of its own."""
    return uvarint(len(topics) + 1) + b"".join(topics) + b"\x00\x00\x00"


def _topic(name: bytes, tags: bytes = b"\x00") -> bytes:
    return b"\x00" * 16 + uvarint(len(name) + 1) + name + tags


def test_tagged_fields_are_still_read() -> None:
    body = MetadataRequest.decode(_metadata_v12([_topic(b"a", b"\x01\x05\x02xy"),
                                                 _topic(b"b")]), version=12)
    assert body.topics is not None
    assert [t.name for t in body.topics] == ["a", "b"]
    assert body.topics[0].unknown_tags == {"_5": b"xy"}


def test_a_tagged_field_longer_than_the_request_is_refused() -> None:
    # an unknown tag claiming 2**31-1 bytes, with none after it: Kafka's reader throws
    with pytest.raises(ValueError, match="runs past the request's end"):
        MetadataRequest.decode(_metadata_v12([_topic(b"a", b"\x01\x05" + uvarint(2**31 - 1))]),
                               version=12)


def test_a_tagged_field_section_is_read_without_copying_the_rest_of_the_request() -> None:
    # kafka-python copied the rest of the request for each struct with tags: a request of
    # many tagged topics cost the square of its size; here the one copy shows in the peak
    rest = 1 << 20
    request = _metadata_v12([_topic(b"a", b"\x01\x05\x00"), _topic(b"b" * rest)])
    tracemalloc.start()
    try:
        MetadataRequest.decode(request, version=12)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * rest  # the decoded 1 MiB name, not a second copy beside it
