"""The codec: every fact of the Kafka wire format the broker reads or writes by hand.

Schemas of requests and responses come from ``kafka.protocol``; this package owns the rest,
and nothing else in the broker decodes or encodes these bytes. It imports nothing of the
broker above it (only :mod:`broker_core.errors`, the error codes), so storage may use it.
"""
