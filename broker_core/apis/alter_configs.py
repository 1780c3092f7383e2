"""AlterConfigs and IncrementalAlterConfigs for topics.

Changes are checked key by key (INVALID_CONFIG names the key and what it expects), written
into the topic's metadata and take effect at once: rolling, retention and the index on
every partition, ``max.message.bytes``, ``min.insync.replicas`` and
``message.timestamp.type`` on the next produce. AlterConfigs replaces the topic's whole
set of configs (keys left out return to their defaults); IncrementalAlterConfigs sets,
deletes, appends to or subtracts from single keys. ``validate_only`` checks and changes
nothing. Each change is a compare-and-set of the topic's stored configs, computed again
from what another broker stored meanwhile, so no broker's change is dropped.

Broker configs are static here (the broker's config file): as Kafka answers a change of a
config it cannot update dynamically, a BROKER resource that names any config is refused
with INVALID_REQUEST naming them, after Kafka's checks of the caller's ALTER_CONFIGS right
on the cluster and of the broker's id. BROKER_LOGGER (Kafka's log4j levels) is not
supported (INVALID_REQUEST; ``logLevel`` sets the level here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from broker_core.config_resources import (
    BROKER,
    BROKER_LOGGER,
    TOPIC,
    check_broker_name,
    check_cluster_right,
    unsupported,
)
from broker_core.context import Operation, RequestContext
from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.storage import ConfigsChanged, log_config_for_topic
from broker_core.storage_faults import WriteKind
from broker_core.topic_configs import (
    TOPIC_CONFIG_KEYS,
    TYPE_LIST,
    check_value_length,
    list_items,
    validate_topic_configs,
)

Plan = Callable[[Mapping[str, str], Mapping[str, str]], dict[str, str]]
"""From a topic's own configs and the defaults, its new own configs."""

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_ATTEMPTS = 20
"""How often a change is computed again when other brokers' changes keep landing first."""
LIST_KEYS = frozenset(name for name, key in TOPIC_CONFIG_KEYS.items() if key.kind == TYPE_LIST)
"""Topic configs whose value is a comma-separated list (APPEND and SUBTRACT apply)."""
_Replaced = AlterConfigsRequest.AlterConfigsResource.AlterableConfig
_Operation = IncrementalAlterConfigsRequest.AlterConfigsResource.AlterableConfig


class _Resource(Protocol):
    """A resource whose configs are altered, as both APIs name it."""

    @property
    def resource_type(self) -> int: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def configs(self) -> Iterable[_Named]: ...


class _Named(Protocol):
    """A config a resource alters, as both APIs name it."""

    @property
    def name(self) -> str: ...


_R = TypeVar("_R", bound=_Resource)
_Result = TypeVar("_Result", AlterConfigsResponse.AlterConfigsResourceResponse,
                  IncrementalAlterConfigsResponse.AlterConfigsResourceResponse)


def _replace_all(configs: Iterable[_Replaced]) -> Plan:
    """AlterConfigs: the new set is exactly the given keys."""
    given: dict[str, str | None] = {}
    for entry in configs:
        if entry.name in given:
            raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"config {entry.name!r} given twice")
        given[entry.name] = entry.value
    _no_nulls(name for name, value in given.items() if value is None)
    return lambda _current, _defaults: validate_topic_configs(given)


def _no_nulls(names: Iterable[str]) -> None:
    """INVALID_REQUEST naming the configs given a null value, as Kafka words it."""
    nulls = list(names)
    if nulls:
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"Null value not supported for : {', '.join(nulls)}")


def _incremental(configs: Iterable[_Operation]) -> Plan:
    """IncrementalAlterConfigs: each operation applied to the current set."""
    operations = list(configs)
    names = [entry.name for entry in operations]
    if len(set(names)) != len(names):
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, "a config is named twice")
    _no_nulls(entry.name for entry in operations
              if entry.value is None and entry.config_operation != DELETE)

    def apply(current: Mapping[str, str], defaults: Mapping[str, str]) -> dict[str, str]:
        configs = dict(current)
        for entry in operations:
            _operate(configs, defaults, entry)
        return validate_topic_configs(configs)
    return apply


def _operate(configs: dict[str, str], defaults: Mapping[str, str], entry: _Operation) -> None:
    name, value, operation = entry.name, entry.value, entry.config_operation
    validate_topic_configs({name: None})  # an unknown key is INVALID_CONFIG whatever the op
    if operation == DELETE:
        configs.pop(name, None)
        return
    if operation not in (SET, APPEND, SUBTRACT):
        raise KafkaApiError(ErrorCode.INVALID_REQUEST, f"unknown config operation {operation}")
    assert value is not None  # refused by _no_nulls
    check_value_length(name, value)  # before an APPEND or SUBTRACT splits it
    if operation == SET:
        configs[name] = value
        return
    if name not in LIST_KEYS:
        raise KafkaApiError(ErrorCode.INVALID_CONFIG,
                            f"{name!r} is not a list: it can be set or deleted, not "
                            f"{'appended to' if operation == APPEND else 'subtracted from'}")
    items = list_items(configs.get(name, defaults[name]))
    if operation == APPEND:
        items += [item for item in list_items(value) if item not in items]
    else:
        items = [item for item in items if item not in list_items(value)]
    configs[name] = ",".join(items)


def _alter_topic(engine: Engine, ctx: RequestContext, resource: _Resource,
                 plan: Plan, validate_only: bool) -> None:
    # the broker keeps its own topics' settings
    engine.tenancy.check_writable(engine.tenancy.internal_name(ctx, resource.resource_name))
    for _ in range(_ATTEMPTS):
        internal, topic = engine.tenancy.named_topic(ctx, resource.resource_name,
                                             Operation.ALTER_CONFIGS, "alter configs of")
        configs = plan(topic.configs, engine.topic_configs({}))
        try:
            log_config_for_topic(engine.logs.default_config, configs)
        except ValueError as exc:
            raise KafkaApiError(ErrorCode.INVALID_CONFIG, str(exc)) from None
        if validate_only:
            return
        try:
            with engine.faults.guard(f"the configs of {internal}", WriteKind.TOPICS):
                engine.logs.alter_topic_configs(internal, configs, expected=topic.configs)
            return
        except ConfigsChanged:  # changed through another broker: apply to what it stored
            continue
    raise KafkaApiError(ErrorCode.REQUEST_TIMED_OUT,
                        f"the configs of {resource.resource_name} kept changing meanwhile")


def _alter_broker(engine: Engine, ctx: RequestContext, resource: _Resource) -> None:
    """A BROKER (or BROKER_LOGGER) resource: checked as Kafka checks it, then refused
    for every config it names, none being dynamic here (none named: nothing to do)."""
    kind = resource.resource_type
    if kind not in (BROKER, BROKER_LOGGER):
        raise unsupported(kind)
    check_cluster_right(engine.tenancy, ctx, Operation.ALTER_CONFIGS)
    if kind == BROKER_LOGGER:
        raise unsupported(kind)
    check_broker_name(engine.config.broker_id, resource.resource_name)
    names = sorted({entry.name for entry in resource.configs})
    if names:
        shown = ", ".join(name[:100] for name in names[:20])
        raise KafkaApiError(ErrorCode.INVALID_REQUEST,
                            f"Cannot update these configs dynamically: {shown}"
                            f"{', ...' if len(names) > 20 else ''} (broker configs are "
                            "static here: set them in the broker's config file)")


def _results(engine: Engine, ctx: RequestContext, resources: Iterable[_R],
             validate_only: bool, plan: Callable[[_R], Plan],
             result: type[_Result]) -> list[_Result]:
    """Each resource's result: its configs altered by its ``plan``, or why not. As Kafka, a
    resource named twice is altered by neither entry (INVALID_REQUEST for both)."""
    resources = list(resources)
    named = Counter((r.resource_type, r.resource_name) for r in resources)
    results = []
    for resource in resources:
        code, message = ErrorCode.NONE, None
        try:
            if named[resource.resource_type, resource.resource_name] > 1:
                raise KafkaApiError(ErrorCode.INVALID_REQUEST, "Duplicate resource.")
            if resource.resource_type == TOPIC:
                _alter_topic(engine, ctx, resource, plan(resource), validate_only)
            else:
                _alter_broker(engine, ctx, resource)
        except KafkaApiError as error:
            engine.refusals.refused(ctx, "resource", resource.resource_name, error)
            code, message = error.code, error.message
        results.append(result(error_code=code, error_message=message,
                              resource_type=resource.resource_type,
                              resource_name=resource.resource_name))
    return results


async def handle_alter_configs(engine: Engine, ctx: RequestContext,
                               request: AlterConfigsRequest) -> AlterConfigsResponse:
    """Answer AlterConfigs: each topic's configs replaced by the given set."""
    results = _results(engine, ctx, request.resources, bool(request.validate_only),
                       lambda resource: _replace_all(resource.configs),
                       AlterConfigsResponse.AlterConfigsResourceResponse)
    return AlterConfigsResponse(version=request.version, throttle_time_ms=0, responses=results)


async def handle_incremental_alter_configs(
        engine: Engine, ctx: RequestContext,
        request: IncrementalAlterConfigsRequest) -> IncrementalAlterConfigsResponse:
    """Answer IncrementalAlterConfigs: per-key operations on each topic's configs."""
    results = _results(engine, ctx, request.resources, bool(request.validate_only),
                       lambda resource: _incremental(resource.configs),
                       IncrementalAlterConfigsResponse.AlterConfigsResourceResponse)
    return IncrementalAlterConfigsResponse(version=request.version, throttle_time_ms=0,
                                           responses=results)
