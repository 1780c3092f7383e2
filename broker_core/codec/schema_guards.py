"""Two guards on kafka-python's generated request decoders, which the broker uses for most
requests (they compile a decoder per message and version on first use).

- **Long varints.** Their unsigned varint loop (compact string, bytes and array lengths,
  tagged-field counts, tags and sizes) had no length limit: a run of N bytes of 0xFF
  built a 7N-bit integer one OR at a time, O(N^2) on the event loop (80 KB took 0.2 s; a
  512 KiB ApiVersions before login several seconds). Kafka's
  ``ByteUtils.readUnsignedVarint`` refuses a sixth byte; so does the generated code now.
- **Tagged fields.** A struct whose tagged-field section is not empty was decoded from a
  copy of *the rest of the request* (``bytes(data[pos:])``): a request of many such
  structs cost the square of its size (a Metadata request of 16,000 tagged topics, 336 KB,
  took 0.16 s, and it grows fourfold per doubling). And an unknown tag claiming more bytes
  than the request holds was taken, short. The section is now read in place, through
  :class:`TagReader`, which refuses to read past the end (Kafka's reader throws there).

Either way the request is garbage: the decoder raises ``ValueError`` and the dispatcher
refuses the frame as malformed. :func:`install` replaces two code emitters of kafka-python
3.0 (``UnsignedVarInt32.emit_decode_from``, ``StructField._emit_tagged_decode``) and must
run before the first request is decoded (``broker_core.dispatch`` calls it at import);
``tests/protocol/test_schema_guards.py`` checks the generated decoders, so a kafka-python
that changes its generator fails there instead of silently dropping a guard.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from kafka.protocol.schemas.fields.codecs import types as schema_types

MAX_BYTES = 5
"""The longest unsigned 32-bit varint (Kafka's limit)."""


class _Codegen(Protocol):
    """The part of kafka-python's ``CodegenContext`` the emitters use."""

    globs: dict[str, object]

    def next_var(self, prefix: str) -> str: ...

    def emit(self, indent: str, line: str) -> None: ...


class _Tagged(Protocol):
    """The part of kafka-python's ``StructField`` the tagged-field emitter uses."""

    def tagged_fields(self, version: int) -> object: ...


class TagReader:
    """A read-only file over a request's bytes from ``position`` on, without copying them:
    what kafka-python's tagged-field decoder reads from. Reading past the end raises."""

    __slots__ = ("data", "position")

    def __init__(self, data: bytes | memoryview, position: int) -> None:
        self.data = data
        self.position = position

    def read(self, size: int) -> bytes:
        """The next ``size`` bytes; ValueError when fewer are left (or size is negative)."""
        end = self.position + size
        if size < 0 or end > len(self.data):
            raise ValueError(f"a tagged field of {size} bytes runs past the request's end")
        chunk = bytes(self.data[self.position:end])
        self.position = end
        return chunk

    def tell(self) -> int:
        """Where the next read starts, in the request's bytes."""
        return self.position


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


def _emit_tagged_decode(self: _Tagged, ctx: _Codegen, var_name: str, indent: str,
                        version: int) -> None:
    """Decode a non-empty tagged-field section in place into ``var_name`` (known tags as
    attributes named in its ``tags``, unknown ones as ``unknown_tags``), advancing ``pos``."""
    fields, reader = ctx.next_var("tf"), ctx.next_var("tr")
    ctx.globs[fields] = self.tagged_fields(version)
    ctx.globs["_TagReader"] = TagReader
    for line in (f"{reader} = _TagReader(data, pos)",
                 f"_tfd = {fields}.decode({reader}, version={version})",
                 f"pos = {reader}.tell()",
                 "for _tk, _tv in _tfd.items():",
                 "    if not _tk.startswith('_'):",
                 f"        {var_name}.tags = ({var_name}.tags or set()) | {{_tk}}",
                 f"        setattr({var_name}, _tk, _tv)",
                 "    else:",
                 f"        {var_name}.unknown_tags = {{**({var_name}.unknown_tags or {{}}), "
                 "_tk: _tv}"):
        ctx.emit(indent, line)


def install() -> None:
    """Make every decoder kafka-python generates from now on take both guards."""
    schema_types.UnsignedVarInt32.emit_decode_from = classmethod(_emit_bounded_decode)
    struct_field = importlib.import_module("kafka.protocol.schemas.fields.struct").StructField
    struct_field._emit_tagged_decode = _emit_tagged_decode
