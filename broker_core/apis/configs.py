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
    DYNAMIC_TOPIC_CONFIG,
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
_Synonym = _Entry.DescribeConfigsSynonym
TOPIC = 2
BROKER = 4
CLIENT_METRICS = 16


def _no_synonyms(_name: str) -> list[_Synonym]:
    return []


def _entries(values: Mapping[str, str], source_of: Callable[[str], int],
             keys: Mapping[str, TopicConfigKey], wanted: list[str] | None, read_only: bool,
             documented: bool,
             synonyms_of: Callable[[str], list[_Synonym]] = _no_synonyms) -> list[_Entry]:
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
            is_default=source == DEFAULT_CONFIG, is_sensitive=False, synonyms=synonyms_of(name),
            config_type=kind,
            documentation=key.doc if documented and key is not None else None,
        ))
    return entries


def _topic_synonyms(engine: Engine, own: Mapping[str, str]) -> Callable[[str], list[_Synonym]]:
    """A topic value's synonyms, most important first, as Kafka lists them: the topic's own
    value, then the broker's default under Kafka's broker name (STATIC_BROKER_CONFIG when
    the broker's config sets it, else DEFAULT_CONFIG)."""
    configured = engine.config.configured_topic_defaults
    broker_values = engine.topic_configs({})

    def synonyms(name: str) -> list[_Synonym]:
        key = TOPIC_CONFIG_KEYS[name]
        found = []
        if name in own:
            found.append(_Synonym(name=name, value=own[name], source=DYNAMIC_TOPIC_CONFIG))
        if key.server is None:  # Kafka has no broker config for it
            return found
        # one broker entry: both under one name would be one to clients that key synonyms
        # by name (confluent-kafka), and the default would hide the broker's value
        found.append(_Synonym(name=key.server, value=broker_values[name],
                              source=STATIC_BROKER_CONFIG if name in configured
                              else DEFAULT_CONFIG))
        return found
    return synonyms


def _describe_topic(engine: Engine, ctx: RequestContext, resource: _Resource,
                    documented: bool, with_synonyms: bool) -> list[_Entry]:
    _internal, topic = engine.tenancy.named_topic(ctx, resource.resource_name,
                                          Operation.DESCRIBE_CONFIGS, "describe configs of")
    configured = engine.config.configured_topic_defaults
    return _entries(engine.topic_configs(topic.configs),
                    lambda name: config_source(name, topic.configs, configured),
                    TOPIC_CONFIG_KEYS, resource.configuration_keys, False, documented,
                    _topic_synonyms(engine, topic.configs) if with_synonyms
                    else _no_synonyms)


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
    values = {server: value for name, value in engine.topic_configs({}).items()
              if (server := TOPIC_CONFIG_KEYS[name].server) is not None}
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
    with_synonyms = request.version >= 1 and bool(request.include_synonyms)
    results = []
    for resource in request.resources:
        code, message, entries = ErrorCode.NONE, None, []
        try:
            if resource.resource_type == TOPIC:
                entries = _describe_topic(engine, ctx, resource, documented, with_synonyms)
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
