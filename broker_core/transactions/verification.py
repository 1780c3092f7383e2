"""Whether a transactional batch may be written: its producer id is the transactional id's
the request names, and its open transaction added the partition (KIP-890 part 1, so that
no batch opens a "hanging" transaction that no marker will ever end).

When this broker coordinates the transactional id and has replayed its state (always, on
one broker, once the state topic's partition is replayed), the coordinator's state in
memory says so at once; while it replays that partition (a restart), a batch is answered
NOT_ENOUGH_REPLICAS, as Kafka answers when its coordinator is loading, never judged by a
state half replayed. When another broker coordinates the id, the leader reads the id's
state as that coordinator last made it durable in the shared storage (the id's newest
record in its ``__transaction_state`` partition, in a worker thread, found through
:class:`~broker_core.system_topic_index.KeyIndex`: one statement, whatever the id, once the
partition was read; so a refusal, which is not kept, costs no more than that): the
coordinator changes its state in memory only once the record is durable, and answers
AddPartitionsToTxn only then, so what the durable state lacks no producer was told it
has; and the durable state is what the coordinator's next owner starts from, so a
coordinator that dies mid-transaction changes nothing (the read needs the database, not
the coordinator). A request's partitions are verified by one read (a produce request names
one transactional id; Kafka verifies a request's partitions in one round trip too), each
partition's guard made before it (:class:`~broker_core.partition_producers.Verification`,
dropped by the producer's next marker, so a transaction that ended meanwhile lets nothing
in after its marker); the outcome is kept in the partition's producer state, and the next
batches of the transaction there cost a dictionary lookup. A refusal removes its guard
(nothing is left behind by batches that are refused).

Errors are Kafka's (3.6 to 3.9): INVALID_PRODUCER_ID_MAPPING, INVALID_PRODUCER_EPOCH
and INVALID_TXN_STATE as they are (clients abort the transaction, or are fenced); a
coordinator that cannot tell now (its state being completed, the database away) answers
NOT_ENOUGH_REPLICAS, which every producer retries without a metadata refresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
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
from broker_core.transactions.model import Txn

_NOT_YET = frozenset({ErrorCode.CONCURRENT_TRANSACTIONS, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                      ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})
"""The coordinator's answers that mean "not now": a produce is answered NOT_ENOUGH_REPLICAS
instead (Kafka's choice: older clients do not retry these on a produce)."""
Batch = tuple[PartitionProducers, BatchHeader, str, int]
"""A transactional batch to verify: its partition's producer state, its header, its topic
(internal name) and partition index."""
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

    @property
    def shared(self) -> bool:
        """Whether other brokers may coordinate transactional ids (a cluster)."""
        return self._shared

    def remote(self, key: TxnKey | None) -> bool:
        """Whether the coordinator's durable state decides, not this broker's memory (a
        cluster, and this broker does not hold the id's state now: another broker
        coordinates it, or this one is replaying it); never for the broker's own writes."""
        return self._shared and key is not None and not self._coordinator.holds(*key)

    def verified(self, producers: PartitionProducers, header: BatchHeader,
                 key: TxnKey | None) -> bool:
        """Whether the batch's transaction was verified in the partition (``producers``)."""
        return key is not None and \
            producers.verified(header.producer_id, header.producer_epoch, key)

    def pending(self, producers: Callable[[], PartitionProducers], header: BatchHeader,
                key: TxnKey | None) -> bool:
        """Whether the transactional batch waits for :meth:`verify` before its append:
        another broker coordinates its id, and its transaction has not been verified in
        the partition's producer state (``producers()``) yet."""
        return self.remote(key) and not self.verified(producers(), header, key)

    async def verify(self, batches: Sequence[Batch], key: TxnKey
                     ) -> dict[tuple[str, int], KafkaApiError]:
        """Read the coordinator's durable state of ``key`` once for ``batches`` (of one
        request, each guard made before the read) and keep, in each partition's producer
        state, that the batch's transaction took the partition; the refusals, as a produce
        answers them, by (topic, index)."""
        guards = [producers.verifying(header.producer_id, header.producer_epoch, key)
                  for producers, header, _, _ in batches]
        if self._threads is None:
            self._threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="txn-verify")
        txn: Txn | None = None
        failure: KafkaApiError | None = None
        try:
            partition = self._coordinator.place(*key)
            txn = await asyncio.get_running_loop().run_in_executor(
                self._threads, self._coordinator.stored, key, partition)
        except KafkaApiError as error:
            failure = error
        except (StorageError, OSError, KeyError) as exc:  # the database is away
            failure = KafkaApiError(ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                    f"cannot read its state: {exc}")
        refusals: dict[tuple[str, int], KafkaApiError] = {}
        for (producers, header, topic, index), guard in zip(batches, guards, strict=True):
            try:
                if failure is not None:
                    raise failure
                if txn is None or txn.producer_id != header.producer_id:
                    raise KafkaApiError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                        f"producer id {header.producer_id} is not that of "
                                        "the transactional id the request names")
                check_batch(txn, header.producer_epoch, topic, index)
            except KafkaApiError as error:
                producers.refused(header.producer_id, guard)
                metrics.TXN_VERIFICATIONS.labels(
                    "unavailable" if error.code in _NOT_YET else "refused").inc()
                refusals[(topic, index)] = for_produce(error)
                continue
            metrics.TXN_VERIFICATIONS.labels("verified").inc()
            guard.done = True
        return refusals

    def check(self, producers: PartitionProducers, header: BatchHeader, key: TxnKey | None,
              topic: str, index: int) -> None:
        """Just before the append: in a cluster, the verification kept in ``producers`` when
        another broker coordinates the id (NOT_ENOUGH_REPLICAS without one: the
        transaction ended, or the partition's producer state was rebuilt, while it was
        read; the retry verifies again); the coordinator's memory otherwise (which answers
        NOT_ENOUGH_REPLICAS while it replays the id's partition)."""
        if self.remote(key):
            if not self.verified(producers, header, key):
                raise KafkaApiError(ErrorCode.NOT_ENOUGH_REPLICAS,
                                    "the transaction's state changed while it was verified")
            return
        try:
            self._coordinator.verify_produce(header.producer_id, header.producer_epoch,
                                             key, topic, index)
        except KafkaApiError as error:
            raise for_produce(error) from None

    def close(self) -> None:
        """Stop the reading threads (a read under way ends on its own)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
