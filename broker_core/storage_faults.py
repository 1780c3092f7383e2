"""Write faults of the data directory (a full disk, an I/O error): the Kafka error a client
gets, and one log line per cause.

Kafka answers a produce that meets a storage failure with KAFKA_STORAGE_ERROR, which
clients retry; a coordinator whose write to ``__consumer_offsets`` or
``__transaction_state`` fails turns that error into NOT_COORDINATOR, so the client looks
the coordinator up again and retries. The connection stays open either way, and reads
and deletes go on.

A cause is a kind of write (:class:`WriteKind`) and the errno it failed with. A cause is
logged once, at ERROR, when it first appears; the first write of that kind that succeeds
afterwards logs once, at INFO, that those writes work again. Requests failing meanwhile
log nothing more, and one kind failing does not make another kind's successes log. A
partition taken offline (``LogOffline``: a failed fsync or an I/O error, logged by the
storage when it happened) logs nothing here. Every failure counts in the
``kop_server_storage_write_errors`` metric.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.metrics import STORAGE_WRITE_ERRORS
from broker_core.storage import LogOffline

log = logging.getLogger(__name__)


class WriteKind(StrEnum):
    """The kinds of write whose faults are logged apart (the value names them in the log)."""

    RECORDS = "record appends"
    CHECKPOINTS = "partition checkpoints"
    """A partition's metadata rewritten after an fsync (a failed fsync itself takes the
    partition offline)."""
    LOG_START = "log start moves"
    TOPICS = "topic creations and configs"
    COORDINATOR = "coordinator state writes"
    SNAPSHOTS = "producer snapshots"
    AUDIT = "audit events"


class ReportedFault(OSError):
    """A write fault already noted and logged (by the append path, when a commit that
    producers waited for failed): :meth:`WriteFaults.failed` answers it without noting it
    again."""


class UnknownOutcome(ReportedFault):
    """A reported write fault after which whether the write is stored is unknown (a commit
    whose answer was lost: ``CommitUnknown``): a writer that keeps state on the strength of
    its writes must read back what is stored."""


class WriteFaults:
    """The data directory's current write faults, by cause (thread-safe: fsyncs and
    snapshots run in executor threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._causes: dict[WriteKind, int] = {}  # kind -> errno of its current fault
        self._failures: dict[WriteKind, int] = {}

    def failed(self, exc: OSError, what: str, kind: WriteKind,
               code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR) -> KafkaApiError:
        """Note that writing ``what`` (a write of ``kind``) failed with ``exc``; return the
        error to answer."""
        reason = exc.strerror or str(exc)
        if isinstance(exc, ReportedFault):
            return KafkaApiError(code, f"storage error: {reason}")
        STORAGE_WRITE_ERRORS.inc()
        if isinstance(exc, LogOffline):  # logged when the partition went offline
            return KafkaApiError(code, f"storage error: {reason}")
        cause = exc.errno if exc.errno is not None else -1
        with self._lock:
            self._failures[kind] = self._failures.get(kind, 0) + 1
            new = self._causes.get(kind) != cause
            self._causes[kind] = cause
        if new:
            log.error("storage: cannot write %s: %s; %s are answered with retriable errors "
                      "until they succeed again (reads and deletes go on)", what, reason, kind)
        return KafkaApiError(code, f"storage error: {reason}")

    def succeeded(self, kind: WriteKind) -> None:
        """Note a successful write of ``kind`` (cheap when that kind was not failing)."""
        if kind not in self._causes:
            return
        with self._lock:
            if self._causes.pop(kind, None) is None:
                return
            failures = self._failures.pop(kind, 0)
        log.info("storage: %s succeed again (%d failed meanwhile)", kind, failures)

    @contextmanager
    def guard(self, what: str, kind: WriteKind,
              code: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR) -> Iterator[None]:
        """Run a write of ``kind``: an OSError becomes the Kafka error ``code`` (see
        :meth:`failed`), success is noted (see :meth:`succeeded`)."""
        try:
            yield
        except OSError as exc:
            raise self.failed(exc, what, kind, code) from None
        self.succeeded(kind)
