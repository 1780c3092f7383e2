"""The broker engine: protocol codec, record batches, topic naming, the managed-ledger log and
the request handlers. It knows nothing about sockets, TLS or SASL: it receives an
authenticated :class:`~broker_core.context.RequestContext` for every request."""
