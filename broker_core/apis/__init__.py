"""The request handlers of the engine, one module per API family, and the table serving them."""

from __future__ import annotations

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    DescribeTopicPartitionsRequest,
    DescribeTopicPartitionsResponse,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from broker_core.apis.alter_configs import handle_alter_configs, handle_incremental_alter_configs
from broker_core.apis.configs import handle_describe_configs, handle_list_config_resources
from broker_core.apis.delete_records import handle_delete_records
from broker_core.apis.describe_partitions import handle_describe_topic_partitions
from broker_core.apis.fetch import fetch_response_bound, handle_fetch
from broker_core.apis.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_find_coordinator,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_sync_group,
)
from broker_core.apis.leader_epochs import handle_offset_for_leader_epoch
from broker_core.apis.list_offsets import handle_list_offsets
from broker_core.apis.metadata import handle_describe_cluster, handle_metadata
from broker_core.apis.offsets import (
    handle_offset_commit,
    handle_offset_delete,
    handle_offset_fetch,
)
from broker_core.apis.produce import handle_produce
from broker_core.apis.replicas import (
    handle_alter_partition_reassignments,
    handle_alter_replica_log_dirs,
    handle_describe_log_dirs,
    handle_elect_leaders,
    handle_list_partition_reassignments,
)
from broker_core.apis.topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_topics,
)
from broker_core.apis.transactions import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_describe_producers,
    handle_describe_transactions,
    handle_end_txn,
    handle_init_producer_id,
    handle_list_transactions,
    handle_txn_offset_commit,
)
from broker_core.apis.write_txn_markers import handle_write_txn_markers
from broker_core.codec import fetch_writer
from broker_core.codec.produce_reader import ProduceBody, decode_produce
from broker_core.dispatch import ApiSpec, BodyReader


def engine_apis() -> list[ApiSpec]:
    """Every API the engine serves, with the versions it implements."""
    return [
        ApiSpec(0, ProduceRequest, ProduceResponse, 3, 11, handle_produce,
                reader=BodyReader(ProduceBody, decode_produce)),
        ApiSpec(1, FetchRequest, FetchResponse, fetch_writer.MIN_VERSION, fetch_writer.MAX_VERSION,
                handle_fetch, fetch_response_bound),
        ApiSpec(2, ListOffsetsRequest, ListOffsetsResponse, 1, 10, handle_list_offsets),
        ApiSpec(3, MetadataRequest, MetadataResponse, 0, 12, handle_metadata),
        ApiSpec(8, OffsetCommitRequest, OffsetCommitResponse, 2, 9, handle_offset_commit),
        ApiSpec(9, OffsetFetchRequest, OffsetFetchResponse, 1, 9, handle_offset_fetch),
        ApiSpec(10, FindCoordinatorRequest, FindCoordinatorResponse, 0, 4,
                handle_find_coordinator),
        ApiSpec(11, JoinGroupRequest, JoinGroupResponse, 0, 9, handle_join_group),
        ApiSpec(12, HeartbeatRequest, HeartbeatResponse, 0, 4, handle_heartbeat),
        ApiSpec(13, LeaveGroupRequest, LeaveGroupResponse, 0, 5, handle_leave_group),
        ApiSpec(14, SyncGroupRequest, SyncGroupResponse, 0, 5, handle_sync_group),
        ApiSpec(15, DescribeGroupsRequest, DescribeGroupsResponse, 0, 5,
                handle_describe_groups),
        ApiSpec(16, ListGroupsRequest, ListGroupsResponse, 0, 5, handle_list_groups),
        ApiSpec(19, CreateTopicsRequest, CreateTopicsResponse, 2, 7, handle_create_topics),
        ApiSpec(20, DeleteTopicsRequest, DeleteTopicsResponse, 1, 6, handle_delete_topics),
        ApiSpec(21, DeleteRecordsRequest, DeleteRecordsResponse, 0, 2, handle_delete_records),
        ApiSpec(32, DescribeConfigsRequest, DescribeConfigsResponse, 1, 4,
                handle_describe_configs),
        ApiSpec(33, AlterConfigsRequest, AlterConfigsResponse, 0, 2, handle_alter_configs),
        ApiSpec(44, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1,
                handle_incremental_alter_configs),
        ApiSpec(23, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, 2, 4,
                handle_offset_for_leader_epoch),
        ApiSpec(22, InitProducerIdRequest, InitProducerIdResponse, 0, 5,
                handle_init_producer_id),
        ApiSpec(24, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 5,
                handle_add_partitions_to_txn),
        ApiSpec(25, AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 4,
                handle_add_offsets_to_txn),
        ApiSpec(26, EndTxnRequest, EndTxnResponse, 0, 4, handle_end_txn),
        ApiSpec(27, WriteTxnMarkersRequest, WriteTxnMarkersResponse, 1, 1,
                handle_write_txn_markers),
        ApiSpec(28, TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 4,
                handle_txn_offset_commit),
        ApiSpec(61, DescribeProducersRequest, DescribeProducersResponse, 0, 0,
                handle_describe_producers),
        ApiSpec(65, DescribeTransactionsRequest, DescribeTransactionsResponse, 0, 0,
                handle_describe_transactions),
        ApiSpec(66, ListTransactionsRequest, ListTransactionsResponse, 0, 2,
                handle_list_transactions),
        ApiSpec(42, DeleteGroupsRequest, DeleteGroupsResponse, 0, 2, handle_delete_groups),
        ApiSpec(47, OffsetDeleteRequest, OffsetDeleteResponse, 0, 0, handle_offset_delete),
        ApiSpec(37, CreatePartitionsRequest, CreatePartitionsResponse, 0, 3,
                handle_create_partitions),
        ApiSpec(60, DescribeClusterRequest, DescribeClusterResponse, 0, 1,
                handle_describe_cluster),
        ApiSpec(43, ElectLeadersRequest, ElectLeadersResponse, 0, 2, handle_elect_leaders),
        ApiSpec(35, DescribeLogDirsRequest, DescribeLogDirsResponse, 0, 4,
                handle_describe_log_dirs),
        ApiSpec(34, AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, 0, 2,
                handle_alter_replica_log_dirs),
        ApiSpec(45, AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
                0, 1, handle_alter_partition_reassignments),
        ApiSpec(46, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
                0, 0, handle_list_partition_reassignments),
        ApiSpec(75, DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, 0, 0,
                handle_describe_topic_partitions),
        ApiSpec(74, ListConfigResourcesRequest, ListConfigResourcesResponse, 0, 1,
                handle_list_config_resources),
    ]
