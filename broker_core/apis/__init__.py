"""The request handlers of the engine, one module per API family, and the table serving them."""

from __future__ import annotations

from kafka.protocol.admin import (
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from broker_core.apis.configs import handle_describe_configs
from broker_core.apis.fetch import handle_fetch
from broker_core.apis.list_offsets import handle_list_offsets
from broker_core.apis.metadata import handle_describe_cluster, handle_metadata
from broker_core.apis.produce import handle_produce
from broker_core.apis.records import handle_delete_records
from broker_core.apis.topics import (
    handle_create_partitions,
    handle_create_topics,
    handle_delete_topics,
)
from broker_core.dispatch import ApiSpec


def engine_apis() -> list[ApiSpec]:
    """Every API the engine serves, with the versions it implements."""
    return [
        ApiSpec(0, ProduceRequest, ProduceResponse, 3, 11, handle_produce),
        ApiSpec(1, FetchRequest, FetchResponse, 4, 12, handle_fetch),
        ApiSpec(2, ListOffsetsRequest, ListOffsetsResponse, 1, 8, handle_list_offsets),
        ApiSpec(3, MetadataRequest, MetadataResponse, 0, 12, handle_metadata),
        ApiSpec(19, CreateTopicsRequest, CreateTopicsResponse, 2, 7, handle_create_topics),
        ApiSpec(20, DeleteTopicsRequest, DeleteTopicsResponse, 1, 6, handle_delete_topics),
        ApiSpec(21, DeleteRecordsRequest, DeleteRecordsResponse, 0, 2, handle_delete_records),
        ApiSpec(32, DescribeConfigsRequest, DescribeConfigsResponse, 1, 4,
                handle_describe_configs),
        ApiSpec(37, CreatePartitionsRequest, CreatePartitionsResponse, 0, 3,
                handle_create_partitions),
        ApiSpec(60, DescribeClusterRequest, DescribeClusterResponse, 0, 1,
                handle_describe_cluster),
    ]
