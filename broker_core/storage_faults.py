"""Write faults of the data directory (a full disk, an I/O error): the Kafka error a client
gets, and one log line per cause.

Kafka answers a produce that meets a storage failure with KAFKA_STORAGE_ERROR, which
clients retry; a coordinator whose write to ``__consumer_offsets`` or
``__transaction_state`` fails turns that error into NOT_COORDINATOR, so the client looks
the coordinator up again and retries. The connection stays open either way, and reads
and deletes go on.

A fault is logged once, at ERROR, when its cause (the errno) first appears or changes;
the first write that succeeds afterwards logs once, at INFO, that writes work again.
Requests failing meanwhile log nothing more. Every failure counts in the
``kop_server_storage_write_errors`` metric.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.metrics import STORAGE_WRITE_ERRORS

log = logging.getLogger(__name__)


class WriteFaults:
    """The data directory's current write fault, if any (thread-safe: fsyncs run in
    executor threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cause: int | None = None
        self._failures = 0

    @property
    def failing(self) -> bool:
        """Whether the last write failed."""
        return self._cause is not None

    def failed(self, exc: OSError, what: str,
               code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR) -> KafkaApiError:
        """Note that writing ``what`` failed with ``exc``; return the error to answer."""
        STORAGE_WRITE_ERRORS.inc()
        cause = exc.errno if exc.errno is not None else -1
        reason = exc.strerror or str(exc)
        with self._lock:
            self._failures += 1
            new = cause != self._cause
            self._cause = cause
        if new:
            log.error("storage: cannot write %s: %s; writes are answered with retriable "
                      "errors until they succeed again (reads and deletes go on)", what, reason)
        return KafkaApiError(code, f"storage error: {reason}")

    def succeeded(self) -> None:
        """Note a successful write (cheap when nothing was failing)."""
        if self._cause is None:
            return
        with self._lock:
            if self._cause is None:
                return
            failures, self._failures, self._cause = self._failures, 0, None
        log.info("storage: writes succeed again (%d failed meanwhile)", failures)

    @contextmanager
    def guard(self, what: str,
              code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR) -> Iterator[None]:
        """Run a write: an OSError becomes the Kafka error ``code`` (see :meth:`failed`),
        success is noted (see :meth:`succeeded`)."""
        try:
            yield
        except OSError as exc:
            raise self.failed(exc, what, code) from None
        self.succeeded()
