"""DescribeConfigs for topics (their own values and the defaults) and for this broker;
ListConfigResources: the topics the caller sees and this broker.

Each value says where it comes from as Kafka says it: DYNAMIC_TOPIC_CONFIG (the topic's
own), STATIC_BROKER_CONFIG (the broker's config file or command line set it),
DEFAULT_CONFIG (nobody did); with ``include_synonyms``, where else it could come from,
most important first. Broker configs are static here (read-only, no dynamic ones): the
cluster-wide default resource (an empty name) has none, as a Kafka cluster without dynamic
defaults. No value described is a secret (``log.dirs`` of PostgreSQL is its URL without
password or query), so none is sensitive."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka.protocol.admin import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    ListConfigResourcesRequest,
    ListConfigResourcesResponse,
)

from broker_core import naming
from broker_core.config_resources import (
    BROKER,
    BROKER_LOGGER,
    CLIENT_METRICS,
    CLUSTER_DEFAULT,
    TOPIC,
    check_broker_name,
    check_cluster_right,
    unsupported,
)
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.tenancy import STORAGE_CONFIGS
from broker_core.topic_configs import (
    DEFAULT_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG_KEYS,
    config_source,
)

_Result = DescribeConfigsResponse.DescribeConfigsResult
_Entry = _Result.DescribeConfigsResourceResult
_Resource = DescribeConfigsRequest.DescribeConfigsResource
_Synonym = _Entry.DescribeConfigsSynonym


@dataclass(frozen=True, slots=True)
class _Described:
    """One config as DescribeConfigs tells it."""

    value: str
    source: int
    kind: int
    doc: str | None
    synonyms: tuple[_Synonym, ...]
    """Where the value could come from, most important first (the first one's source is
    :attr:`source`)."""


def _entries(described: Mapping[str, _Described], wanted: list[str] | None,
             read_only: bool, documented: bool, with_synonyms: bool) -> list[_Entry]:
    return [_Entry(name=name, value=item.value, read_only=read_only,
                   config_source=item.source, is_default=item.source == DEFAULT_CONFIG,
                   is_sensitive=False,
                   synonyms=list(item.synonyms) if with_synonyms else [],
                   config_type=item.kind, documentation=item.doc if documented else None)
            for name, item in sorted(described.items())
            if wanted is None or name in wanted]


def _topic_configs(engine: Engine, own: Mapping[str, str]) -> dict[str, _Described]:
    """A topic's configs. The synonyms of a value, as Kafka lists them: the topic's own
    value, then the broker's default under Kafka's broker name (STATIC_BROKER_CONFIG when
    the broker's config sets it, else DEFAULT_CONFIG). One broker entry: both under one
    name would be one to clients that key synonyms by name (confluent-kafka), and the
    default would hide the broker's value."""
    configured = engine.config.configured_topic_defaults
    broker_values = engine.topic_configs({})
    described = {}
    for name, value in engine.topic_configs(own).items():
        key = TOPIC_CONFIG_KEYS[name]
        synonyms = []
        if name in own:
            synonyms.append(_Synonym(name=name, value=own[name], source=DYNAMIC_TOPIC_CONFIG))
        if key.server is not None:  # else Kafka has no broker config for it
            synonyms.append(_Synonym(name=key.server, value=broker_values[name],
                                     source=config_source(name, (), configured)))
        described[name] = _Described(value, config_source(name, own, configured), key.kind,
                                     key.doc, tuple(synonyms))
    return described


def _broker_configs(engine: Engine, ctx: RequestContext) -> dict[str, _Described]:
    """This broker's configs: the topic defaults under Kafka's broker names, then the
    broker's own settings (where the storage lives only for the operator). Each value's
    one synonym is itself, from the broker's config or the default."""
    configured = engine.config.configured_topic_defaults
    found = [(key.server, value, config_source(name, (), configured), key.kind, key.doc)
             for name, value in engine.topic_configs({}).items()
             if (key := TOPIC_CONFIG_KEYS[name]).server is not None]
    found += [(name, setting.value,
               STATIC_BROKER_CONFIG if setting.configured else DEFAULT_CONFIG,
               setting.kind, setting.doc)
              for name, setting in engine.config.broker_configs.items()
              if name not in STORAGE_CONFIGS or engine.authorizer.is_operator(ctx)]
    return {name: _Described(value, source, kind, doc,
                             (_Synonym(name=name, value=value, source=source),))
            for name, value, source, kind, doc in found}


def _describe(engine: Engine, ctx: RequestContext, resource: _Resource, documented: bool,
              with_synonyms: bool) -> list[_Entry]:
    kind, name, wanted = (resource.resource_type, resource.resource_name,
                          resource.configuration_keys)
    if kind == TOPIC:
        _internal, topic = engine.tenancy.named_topic(ctx, name, Operation.DESCRIBE_CONFIGS,
                                                      "describe configs of")
        return _entries(_topic_configs(engine, topic.configs), wanted, False, documented,
                        with_synonyms)
    if kind not in (BROKER, BROKER_LOGGER):
        raise unsupported(kind)
    check_cluster_right(engine.tenancy, ctx, Operation.DESCRIBE_CONFIGS)
    if kind == BROKER_LOGGER:  # Kafka's log4j loggers: none here (logLevel sets ours)
        raise unsupported(kind)
    check_broker_name(engine.config.broker_id, name)
    if name == CLUSTER_DEFAULT:  # Kafka: the dynamic cluster-wide defaults, none here
        return []
    return _entries(_broker_configs(engine, ctx), wanted, True, documented, with_synonyms)


async def handle_describe_configs(engine: Engine, ctx: RequestContext,
                                  request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    """Answer DescribeConfigs, one result per resource."""
    documented = request.version >= 3 and bool(request.include_documentation)
    with_synonyms = request.version >= 1 and bool(request.include_synonyms)
    results = []
    for resource in request.resources:
        code, message, entries = ErrorCode.NONE, None, []
        try:
            entries = _describe(engine, ctx, resource, documented, with_synonyms)
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
