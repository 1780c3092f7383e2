"""Whether a transactional batch may be written: its producer id is the transactional id's
the request names, and its open transaction added the partition (KIP-890 part 1, so that
no batch opens a "hanging" transaction that no marker will ever end).

When this broker coordinates the transactional id (always, on one broker), the
coordinator's state in memory says so at once. When another broker does, the leader reads
the id's state as that coordinator last made it durable in the shared storage (the id's
newest record in its ``__transaction_state`` partition, in a worker thread, found through
:class:`~broker_core.system_topic_index.KeyIndex`: one statement, whatever the id, once the
partition was read; so a refusal, which is not kept, costs no more than that): the
coordinator changes its state in memory only once the record is durable, and answers
AddPartitionsToTxn only then, so what the durable state lacks no producer was told it
has; and the durable state is what the coordinator's next owner starts from, so a
coordinator that dies mid-transaction changes nothing (the read needs the database, not
the coordinator). That read is made once per producer, partition and transaction: its
outcome is kept in the partition's producer state
(:class:`~broker_core.partition_producers.Verification`, made before the read and dropped
by the producer's next marker, so a transaction that ended meanwhile lets nothing in after
its marker), and the next batches of the transaction there cost a dictionary lookup.
Each partition of a request reads for itself (one statement each): a read shared by the
partitions of a request would have to follow every partition's verification guard, and
the request's partitions are taken one after another.

Errors are Kafka's (3.6 to 3.9): INVALID_PRODUCER_ID_MAPPING, INVALID_PRODUCER_EPOCH
and INVALID_TXN_STATE as they are (clients abort the transaction, or are fenced); a
coordinator that cannot tell now (its state being completed, the database away) answers
NOT_ENOUGH_REPLICAS, which every producer retries without a metadata refresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from broker_core import metrics
from broker_core.codec.batch_header import BatchHeader
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.partition_producers import PartitionProducers
from broker_core.storage import StorageError
from broker_core.transactions.coordinator import (
    TransactionCoordinator,
    TxnKey,
    check_batch,
)

_NOT_YET = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                      ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})
"""The coordinator's answers that mean "not now": a produce is answered NOT_ENOUGH_REPLICAS
instead (Kafka's choice: older clients do not retry these on a produce)."""
_THREADS = 2
"""Threads reading coordinators' states (each holds a pooled database connection)."""


def for_produce(error: KafkaApiError) -> KafkaApiError:
    """The coordinator's refusal as a produce answers it."""
    if error.code in _NOT_YET:
        return KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS,
                             "unable to verify that the partition was added to the "
                             f"transaction ({error.code.name}): {error.message}")
    return error


class ProduceVerifier:
    """Checks transactional batches against their coordinator, here or in the storage."""

    def __init__(self, coordinator: TransactionCoordinator, shared: bool) -> None:
        self._coordinator = coordinator
        self._shared = shared
        self._threads: ThreadPoolExecutor | None = None

    def _here(self, key: TxnKey | None) -> bool:
        """Whether this broker's memory decides (one broker; the coordinator is here and
        loaded; or no transactional id: the broker's own writes)."""
        return not self._shared or key is None or self._coordinator.holds(*key)

    def _verified(self, producers: PartitionProducers, header: BatchHeader,
                  key: TxnKey | None) -> bool:
        return key is not None and \
            producers.verified(header.producer_id, header.producer_epoch, key)

    def pending(self, producers: Callable[[], PartitionProducers], header: BatchHeader,
                key: TxnKey | None) -> bool:
        """Whether the transactional batch waits for :meth:`verify` before its append:
        another broker coordinates its id, and its transaction has not been verified in
        the partition's producer state (``producers()``) yet."""
        return not self._here(key) and not self._verified(producers(), header, key)

    async def verify(self, producers: PartitionProducers, header: BatchHeader, key: TxnKey,
                     topic: str, index: int) -> None:
        """Read the coordinator's durable state of ``key`` and keep, in ``producers``, that
        the batch's transaction took partition ``index`` of ``topic``; KafkaApiError as a
        produce answers it otherwise."""
        guard = producers.verifying(header.producer_id, header.producer_epoch, key)
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="txn-verify")
        try:
            partition = self._coordinator.place(*key)
            txn = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._coordinator.stored, key, partition)
            if txn is None or txn.producer_id != header.producer_id:
                raise KafkaApiError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                    f"producer id {header.producer_id} is not that of the "
                                    "transactional id the request names")
            check_batch(txn, header.producer_epoch, topic, index)
        except KafkaApiError as error:
            metrics.TXN_VERIFICATIONS.labels(
                "unavailable" if error.code in _NOT_YET else "refused").inc()
            raise for_produce(error) from None
        except (StorageError, OSError, KeyError) as exc:  # the database is away
            metrics.TXN_VERIFICATIONS.labels("unavailable").inc()
            raise for_produce(KafkaApiError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                            f"cannot read its state: {exc}")) from None
        metrics.TXN_VERIFICATIONS.labels("verified").inc()
        guard.done = True

    def check(self, producers: PartitionProducers, header: BatchHeader, key: TxnKey | None,
              topic: str, index: int) -> None:
        """Just before the append: the coordinator's memory decides when it is here, the
        verification kept in ``producers`` otherwise (NOT_ENOUGH_REPLICAS without one: the
        transaction ended, or the partition's producer state was rebuilt, while it was
        read; the retry verifies again)."""
        if self._here(key):
            try:
                self._coordinator.verify_produce(header.producer_id, header.producer_epoch,
                                                 key, topic, index)
            except KafkaApiError as error:
                raise for_produce(error) from None
        elif not self._verified(producers, header, key):
            raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                "the transaction's state changed while it was verified")

    def close(self) -> None:
        """Stop the reading threads (a read under way ends on its own)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
