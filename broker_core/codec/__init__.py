"""The codec: every fact of the Kafka wire format the broker reads or writes by hand.

Schemas of requests and responses come from ``kafka.protocol``; this package owns the rest,
and nothing else in the broker decodes or encodes these bytes. It imports nothing of the
broker but :mod:`broker_core.errors` (the error codes), so storage may use it
(``tests/codebase/test_layers.py`` holds it to that).

- ``framing``: request headers, response framing, responses written by hand as chunks
- ``varints``: unsigned and zigzag varints
- ``errors``: ``ProtocolError`` (a bad request) and ``MalformedBatch`` (a bad batch)
- ``batch_header``: the v2 batch header, read once (``BatchHeader``), produce checks,
  the fields the broker writes (base offset, LogAppendTime, the CRC)
- ``records``: walking and checking records, record timestamps, plain batches of keys and
  values; ``record_walk`` loads the walker in C (``native/record_walk.c``)
- ``compression``: the payload codecs; ``rework``: recompressing and key checks on produce
- ``markers``: control records (transaction markers)
- ``fetch_writer``: the Fetch response written by hand
"""
