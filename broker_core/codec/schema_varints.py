"""A length bound for the unsigned varints of kafka-python's generated request decoders.

The broker decodes most requests with kafka-python's schema classes, which compile a
decoder per message and version on first use. Their unsigned varint loop (compact string,
bytes and array lengths, tagged-field counts, tags and sizes) has no length limit: a run of
N bytes of 0xFF builds a 7N-bit integer one OR at a time, O(N^2) on the event loop (80 KB
took 0.2 s; a 512 KiB ApiVersions before login several seconds). Kafka's
``ByteUtils.readUnsignedVarint`` refuses a sixth byte; :func:`install` makes the generated
code do the same, so such a request is garbage (``ValueError``, the frame refused as
malformed) after five bytes.

It replaces ``UnsignedVarInt32.emit_decode_from`` (kafka-python 3.0's code generator) and
must run before the first request is decoded (``broker_core.dispatch`` installs it at
import); ``tests/protocol/test_schema_varints.py`` checks that the generated decoders
refuse a long varint, so a kafka-python that changes its generator fails that test instead
of silently dropping the bound.
"""

from __future__ import annotations

from typing import Protocol

from kafka.protocol.schemas.fields.codecs import types as schema_types

MAX_BYTES = 5
"""The longest unsigned 32-bit varint (Kafka's limit)."""


class _Codegen(Protocol):
    """The part of kafka-python's ``CodegenContext`` the emitter uses."""

    def next_var(self, prefix: str) -> str: ...

    def emit(self, indent: str, line: str) -> None: ...


def _emit_bounded_decode(_cls: type, ctx: _Codegen, var_name: str, indent: str) -> None:
    """Inline decode of an unsigned varint into ``var_name``, advancing ``pos``: the same
    loop as kafka-python's, refusing a sixth byte."""
    byte, shift = ctx.next_var("b"), ctx.next_var("sh")
    for line in (f"{var_name} = 0", f"{shift} = 0", "while True:",
                 f"    {byte} = data[pos]", "    pos += 1",
                 f"    {var_name} |= ({byte} & 0x7f) << {shift}",
                 f"    if not ({byte} & 0x80): break",
                 f"    {shift} += 7",
                 f"    if {shift} >= {7 * MAX_BYTES}:",
                 f"        raise ValueError('unsigned varint longer than {MAX_BYTES} bytes')"):
        ctx.emit(indent, line)


def install() -> None:
    """Make every decoder kafka-python generates from now on refuse long varints."""
    schema_types.UnsignedVarInt32.emit_decode_from = classmethod(
        _emit_bounded_decode)
