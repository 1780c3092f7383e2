"""WriteTxnMarkers: a COMMIT or ABORT marker written into partitions this broker leads.

Kafka's transaction coordinators send it to partition leaders; administrators send it to
abort a hanging transaction (``Admin.abortTransaction``, ``kafka-transactions.sh abort``,
KIP-664). Our own coordinator writes its markers without it (``broker_core.txn_markers``),
so here it is the administrators' request, answered per partition as Kafka does:

- CLUSTER_AUTHORIZATION_FAILED everywhere without CLUSTER_ACTION on the cluster;
- TOPIC_AUTHORIZATION_FAILED for a topic the caller may not write: the tenant boundary,
  so that no tenant writes markers into another's partitions (nor learns they exist);
- INVALID_TOPIC_EXCEPTION for a broker's system topic;
- UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER (another broker of the cluster leads
  it), KAFKA_STORAGE_ERROR (offline, or its producer state unreadable now);
- INVALID_PRODUCER_EPOCH when the partition knows the producer at a newer epoch;
- TRANSACTION_COORDINATOR_FENCED when a marker of a later coordinator epoch was written
  for the producer (DescribeProducers tells the one last written; a negative one is not
  judged);
- INVALID_REQUEST for a negative producer id (a marker of no producer ends no transaction,
  and a replay of the log would not apply it).

A marker is written through the coordinator's marker writer and applied to the
partition's producer state: the transaction it ends no longer holds back the last stable
offset, and an aborted one is listed to read_committed fetches, and the coordinator epoch
it carries is the producer's there from now on. The dispatch stage writes every marker;
the wait for their commits or fsyncs is the waiting stage.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from kafka.protocol.producer import WriteTxnMarkersRequest, WriteTxnMarkersResponse

from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine, settled_anyhow
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.stages import Later
from broker_core.storage import commit_generation
from broker_core.storage.cluster import MarkerRequest
from broker_core.storage.errors import AppendFenced
from broker_core.storage_faults import WriteKind
from common.log_fields import topic_fields

log = logging.getLogger(__name__)

_Marker = WriteTxnMarkersRequest.WritableTxnMarker
_Result = WriteTxnMarkersResponse.WritableTxnMarkerResult
_Topic = _Result.WritableTxnMarkerTopicResult
_Partition = _Topic.WritableTxnMarkerPartitionResult


@dataclass(slots=True)
class _Written:
    """A marker written, whose commit or fsync is still to be awaited."""

    result: _Partition
    durable: asyncio.Future[None]


async def _write(engine: Engine, ctx: RequestContext, marker: _Marker, name: str,
                 index: int) -> asyncio.Future[None] | None:
    """Write ``marker`` into partition ``index`` of the caller's topic ``name``; return
    what to await before it counts as written (KafkaApiError: refused, nothing written)."""
    internal = engine.tenancy.internal_name(ctx, name)
    if not engine.tenancy.allowed(ctx, Operation.WRITE, internal):
        raise KafkaApiError(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            f"not allowed to write {name}")
    engine.tenancy.check_writable(internal)
    if marker.producer_id < 0:  # no producer: the marker would end nothing
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"a marker needs a producer id, not {marker.producer_id}")
    partition = engine.partition(internal, index)
    commits = engine.commits_before_state(internal, index, partition)
    if commits is not None:  # the producer state is rebuilt from what they stored
        await settled_anyhow(commits)
        partition = engine.partition(internal, index)
    generation = commit_generation(partition)
    state = engine.producer_state(internal, index, partition)
    request = MarkerRequest(internal, index, marker.producer_id, marker.producer_epoch,
                            bool(marker.transaction_result),
                            coordinator_epoch=marker.coordinator_epoch)
    durable = engine.txn_markers.write_here(request, partition, state,
                                            ErrorCode.KAFKA_STORAGE_ERROR, generation)
    log.info("%s marker of producer %d epoch %d written to %s-%d at the request of %s",
             "commit" if request.commit else "abort", request.producer_id,
             request.producer_epoch, internal, index, ctx.principal or "an anonymous client",
             extra=topic_fields(internal, **ctx.who()))
    return durable


async def handle_write_txn_markers(
        engine: Engine, ctx: RequestContext, request: WriteTxnMarkersRequest
) -> WriteTxnMarkersResponse | Later[WriteTxnMarkersResponse]:
    """Write each marker into each partition it names; answer per partition."""
    response = WriteTxnMarkersResponse(version=request.version, markers=[])
    if not engine.tenancy.cluster_allowed(ctx, Operation.CLUSTER_ACTION):
        response.markers = [_Result(producer_id=marker.producer_id, topics=[
            _Topic(name=topic.name, partitions=[
                _Partition(partition_index=index,
                           error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
                for index in topic.partition_indexes]) for topic in marker.topics])
            for marker in request.markers]
        return response
    await engine.leadership.ready_named(
        ctx, ((topic.name, topic.partition_indexes)
              for marker in request.markers for topic in marker.topics))
    waits: list[_Written] = []
    for marker in request.markers:
        topics = []
        for topic in marker.topics:
            partitions = []
            for index in topic.partition_indexes:
                result = _Partition(partition_index=index, error_code=ErrorCode.NONE)
                try:
                    durable = await _write(engine, ctx, marker, topic.name, index)
                except KafkaApiError as error:
                    result.error_code = error.code
                    durable = None
                if durable is not None:
                    waits.append(_Written(result, durable))
                partitions.append(result)
            topics.append(_Topic(name=topic.name, partitions=partitions))
        response.markers.append(_Result(producer_id=marker.producer_id, topics=topics))
    if waits:
        return Later(_when_durable(engine, waits, response))
    return response


async def _when_durable(engine: Engine, waits: list[_Written],
                        response: WriteTxnMarkersResponse) -> WriteTxnMarkersResponse:
    """The waiting stage: each partition answered once its marker is durable, or with the
    error of its failed commit or fsync (retriable: the administrator asks again)."""
    for written in waits:
        try:
            await written.durable
        except AppendFenced:  # another broker took the partition
            written.result.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        except OSError as failed:
            written.result.error_code = engine.faults.failed(
                failed, "a transaction marker's fsync", WriteKind.CHECKPOINTS).code
    return response
