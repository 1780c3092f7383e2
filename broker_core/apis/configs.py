"""DescribeConfigs for topics (their own values and the defaults) and for this broker;
ListConfigResources: the topics the caller sees and this broker."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kafka.protocol.admin import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
)

from broker_core import naming
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.tenancy import STORAGE_CONFIGS
from broker_core.topic_configs import (
    BROKER_SYNONYMS,
    DEFAULT_CONFIG,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG_KEYS,
    TYPE_LONG,
    TYPE_STRING,
    TopicConfigKey,
    config_source,
)

_Result = DescribeConfigsResponse.DescribeConfigsResult
_Entry = _Result.DescribeConfigsResourceResult
_Resource = DescribeConfigsRequest.DescribeConfigsResource
TOPIC = 2
BROKER = 4
CLIENT_METRICS = 16


def _entries(values: Mapping[str, str], source_of: Callable[[str], int],
             keys: Mapping[str, TopicConfigKey], wanted: list[str] | None, read_only: bool,
             documented: bool) -> list[_Entry]:
    entries = []
    for name in sorted(values):
        if wanted is not None and name not in wanted:
            continue
        key = keys.get(name)
        source = source_of(name)
        if key is not None:
            kind = key.kind
        else:
            kind = TYPE_LONG if values[name].lstrip("-").isdigit() else TYPE_STRING
        entries.append(_Entry(
            name=name, value=values[name], read_only=read_only, config_source=source,
            is_default=source == DEFAULT_CONFIG, is_sensitive=False, synonyms=[],
            config_type=kind,
            documentation=key.doc if documented and key is not None else None,
        ))
    return entries


def _describe_topic(engine: Engine, ctx: RequestContext, resource: _Resource,
                    documented: bool) -> list[_Entry]:
    _internal, topic = engine.tenancy.named_topic(ctx, resource.resource_name,
                                          Operation.DESCRIBE_CONFIGS, "describe configs of")
    configured = engine.config.configured_topic_defaults
    return _entries(engine.topic_configs(topic.configs),
                    lambda name: config_source(name, topic.configs, configured),
                    TOPIC_CONFIG_KEYS, resource.configuration_keys, False, documented)


def _describe_broker(engine: Engine, ctx: RequestContext, resource: _Resource,
                     documented: bool) -> list[_Entry]:
    if not engine.tenancy.cluster_allowed(ctx, Operation.DESCRIBE_CONFIGS):
        # Kafka: DESCRIBE_CONFIGS on the cluster, checked before the broker's name
        raise KafkaApiError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                            "Cluster authorization failed.")
    if resource.resource_name not in ("", str(engine.config.broker_id)):
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"this is broker {engine.config.broker_id}, not "
                            f"{resource.resource_name}")
    values = {TOPIC_CONFIG_KEYS[name].server: value
              for name, value in engine.topic_configs({}).items()}
    values.update(engine.config.broker_configs)
    if not engine.authorizer.is_operator(ctx):  # where the storage lives: not a tenant's
        for name in STORAGE_CONFIGS:
            values.pop(name, None)
    values["broker.id"] = str(engine.config.broker_id)
    values["auto.create.topics.enable"] = str(engine.config.allow_auto_topic_creation).lower()
    values["num.partitions"] = str(engine.config.default_num_partitions)
    return _entries(values, lambda _name: STATIC_BROKER_CONFIG, BROKER_SYNONYMS,
                    resource.configuration_keys, True, documented)


async def handle_describe_configs(engine: Engine, ctx: RequestContext,
                                  request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    """Answer DescribeConfigs, one result per resource."""
    documented = request.version >= 3 and bool(request.include_documentation)
    results = []
    for resource in request.resources:
        code, message, entries = ErrorCode.NONE, None, []
        try:
            if resource.resource_type == TOPIC:
                entries = _describe_topic(engine, ctx, resource, documented)
            elif resource.resource_type == BROKER:
                entries = _describe_broker(engine, ctx, resource, documented)
            else:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                                    f"resource type {resource.resource_type} has no configs here")
        except KafkaApiError as error:
            code, message = error.code, error.message
        results.append(_Result(error_code=code, error_message=message,
                               resource_type=resource.resource_type,
                               resource_name=resource.resource_name, configs=entries))
    return DescribeConfigsResponse(version=request.version, throttle_time_ms=0, results=results)


async def handle_list_config_resources(
        engine: Engine, ctx: RequestContext,
        request: ListConfigResourcesRequest) -> ListConfigResourcesResponse:
    """Answer ListConfigResources. Version 0 lists client-metrics subscriptions only, and
    this broker keeps none; version 1 also lists topics and this broker (all by default)."""
    wanted = set(request.resource_types or ()) if request.version >= 1 else {CLIENT_METRICS}
    unknown = wanted - {TOPIC, BROKER, CLIENT_METRICS}
    if unknown:
        return ListConfigResourcesResponse(
            version=request.version, throttle_time_ms=0, error_code=ErrorCode.INVALID_REQUEST,
            config_resources=[])
    every = not wanted
    resource = ListConfigResourcesResponse.ConfigResource
    found = []
    if every or TOPIC in wanted:
        found += [resource(resource_name=naming.to_client(topic.name, ctx.home),
                           resource_type=TOPIC) for topic in engine.tenancy.visible_topics(ctx)]
    if every or BROKER in wanted:
        found.append(resource(resource_name=str(engine.config.broker_id), resource_type=BROKER))
    return ListConfigResourcesResponse(version=request.version, throttle_time_ms=0,
                                       error_code=0, config_resources=found)
