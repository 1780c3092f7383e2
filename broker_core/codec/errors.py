"""The two ways bytes fail to decode: a request that is not a Kafka request
(:class:`ProtocolError`: the connection is closed), and a record batch whose records or
payload do not parse (:class:`MalformedBatch`: the batch is refused, INVALID_RECORD)."""

from __future__ import annotations


class ProtocolError(Exception):
    """The bytes on the wire are not a valid Kafka request: the connection must be closed."""


class MalformedBatch(Exception):
    """Records that do not parse, or a payload that does not inflate; says how."""
