"""kafka-python's generated request decoders refuse an unsigned varint longer than five
bytes once ``broker_core.dispatch`` is imported (``broker_core/codec/schema_varints.py``):
without the bound, a run of 0xFF bytes cost quadratic time on the event loop."""

from __future__ import annotations

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest

import broker_core.dispatch  # noqa: F401  (installs the bound)
from broker_core.codec.schema_varints import MAX_BYTES


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
