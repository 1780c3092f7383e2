"""Where DescribeConfigs says a value comes from, as Kafka says it, for the BROKER and TOPIC
resources: STATIC_BROKER_CONFIG for what the broker's config sets, DEFAULT_CONFIG for what
nobody set, DYNAMIC_TOPIC_CONFIG for a topic's own value, with their synonyms when asked
(confluent-kafka always asks; kafka-python's DescribeConfigsRequest v1 to v4 with and
without), the type and documentation from v3 on; the cluster-wide default resource (no
dynamic defaults here), another broker's id, BROKER_LOGGER; and AlterConfigs and
IncrementalAlterConfigs of broker configs, none of which is dynamic here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)

from tests.broker_process import BrokerProcess
from tests.raw import RawConnection

TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
INVALID_REQUEST = 42
SETTINGS = {"logRetentionMs": "3600000", "defaultNumPartitions": "2"}
"""What the broker's command line sets (besides the listener and the data directory)."""


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker whose command line sets :data:`SETTINGS`."""
    data = Path(tmp_path_factory.mktemp("config-sources")) / "data"
    broker = BrokerProcess(data, SETTINGS).start()
    try:
        yield broker
    finally:
        broker.stop()


def _synonyms(entry: Any) -> dict[str, tuple[str, int]]:
    return {name: (synonym.value, synonym.source)
            for name, synonym in entry.synonyms.items()}


def test_a_broker_value_is_static_only_where_the_broker_config_sets_it(
        configured: BrokerProcess) -> None:
    client = AdminClient({"bootstrap.servers": configured.bootstrap})
    resource = ConfigResource(ConfigResource.Type.BROKER, "0")
    configs = client.describe_configs([resource])[resource].result(10)
    static = {name for name, entry in configs.items()
              if entry.source == ConfigSource.STATIC_BROKER_CONFIG.value}
    # logRetentionMs, defaultNumPartitions, and kafkaListeners and dataDir of the harness
    # advertised.listeners: the listeners' addresses, set in the broker's config
    assert static == {"log.retention.ms", "num.partitions", "listeners",
                      "advertised.listeners", "log.dirs"}
    retention = configs["log.retention.ms"]
    assert (retention.value, retention.is_default) == ("3600000", False)
    assert _synonyms(retention) == {"log.retention.ms": ("3600000", STATIC_BROKER_CONFIG)}
    assert configs["num.partitions"].value == "2"
    for name in ("log.segment.bytes", "broker.id", "auto.create.topics.enable"):
        entry = configs[name]
        assert entry.source == ConfigSource.DEFAULT_CONFIG.value and entry.is_default, name
        assert _synonyms(entry) == {name: (entry.value, DEFAULT_CONFIG)}, name
    assert all(entry.is_read_only and not entry.is_sensitive
               and entry.value is not None for entry in configs.values())


def _describe(broker: BrokerProcess, version: int, resource_type: int, name: str,
              synonyms: bool, keys: list[str] | None = None) -> Any:
    """A raw DescribeConfigs of one resource, with documentation from v3 on."""
    extra = {"include_documentation": True} if version >= 3 else {}
    conn = RawConnection(broker.port)
    try:
        answer = conn.call(DescribeConfigsRequest[version](
            resources=[DescribeConfigsRequest.DescribeConfigsResource(
                resource_type=resource_type, resource_name=name, configuration_keys=keys)],
            include_synonyms=synonyms, **extra), version, DescribeConfigsResponse)
    finally:
        conn.close()
    (result,) = answer.results
    return result


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_synonyms_type_and_documentation_by_version(configured: BrokerProcess,
                                                    topic_name: str, version: int) -> None:
    client = AdminClient({"bootstrap.servers": configured.bootstrap})
    client.create_topics([NewTopic(topic_name, 1, 1, config={"segment.ms": "100000"})])[
        topic_name].result(10)
    keys = ["retention.ms", "segment.bytes", "segment.ms"]
    for synonyms in (True, False):
        result = _describe(configured, version, TOPIC, topic_name, synonyms, keys)
        assert result.error_code == 0, result
        found = {c.name: c for c in result.configs}
        assert sorted(found) == keys
        sources = {name: entry.config_source for name, entry in found.items()}
        # a value from the broker is never the topic's own
        assert sources == {"retention.ms": STATIC_BROKER_CONFIG,
                           "segment.ms": DYNAMIC_TOPIC_CONFIG, "segment.bytes": DEFAULT_CONFIG}
        lists = {name: [(s.name, s.value, s.source) for s in entry.synonyms]
                 for name, entry in found.items()}
        assert lists == ({
            "retention.ms": [("log.retention.ms", "3600000", STATIC_BROKER_CONFIG)],
            "segment.ms": [("segment.ms", "100000", DYNAMIC_TOPIC_CONFIG),
                           ("log.roll.ms", "604800000", DEFAULT_CONFIG)],
            "segment.bytes": [("log.segment.bytes", "1073741824", DEFAULT_CONFIG)],
        } if synonyms else {key: [] for key in keys})
        assert all(not entry.read_only and not entry.is_sensitive
                   for entry in found.values())

        broker = _describe(configured, version, BROKER, "0", synonyms,
                           ["log.retention.ms", "log.segment.bytes", "broker.id"])
        assert broker.error_code == 0, broker
        shown = {c.name: (c.config_source, [(s.name, s.source) for s in c.synonyms])
                 for c in broker.configs}
        assert shown == {
            "log.retention.ms": (STATIC_BROKER_CONFIG,
                                 [("log.retention.ms", STATIC_BROKER_CONFIG)] * synonyms),
            "log.segment.bytes": (DEFAULT_CONFIG,
                                  [("log.segment.bytes", DEFAULT_CONFIG)] * synonyms),
            "broker.id": (DEFAULT_CONFIG, [("broker.id", DEFAULT_CONFIG)] * synonyms),
        }
        if version >= 3:  # INT 3, LONG 5: Kafka's types
            assert {c.name: c.config_type for c in broker.configs} == {
                "log.retention.ms": 5, "log.segment.bytes": 3, "broker.id": 3}
            assert all(c.documentation for c in [*result.configs, *broker.configs])


def test_the_cluster_default_other_brokers_and_broker_loggers(
        configured: BrokerProcess) -> None:
    # no dynamic cluster-wide defaults here: Kafka answers them alone for the empty name
    default = _describe(configured, 4, BROKER, "", True)
    assert (default.error_code, default.configs) == (0, [])
    other = _describe(configured, 4, BROKER, "1", True)
    assert (other.error_code, other.error_message, other.configs) == (
        INVALID_REQUEST, "Unexpected broker id, expected 0 or empty string, but received 1", [])
    assert _describe(configured, 4, BROKER, "zero", True).error_code == INVALID_REQUEST
    logger = _describe(configured, 4, BROKER_LOGGER, "0", True)
    assert (logger.error_code, logger.error_message) == (
        INVALID_REQUEST, "Unsupported resource type: BROKER_LOGGER")


def _alter_broker(broker: BrokerProcess, incremental: bool, name: str,
                  configs: list[str], resource_type: int = BROKER) -> tuple[int, str | None]:
    """A raw (Incremental)AlterConfigs of one broker resource, each config set to 1000."""
    conn = RawConnection(broker.port)
    try:
        if incremental:
            resource = IncrementalAlterConfigsRequest.AlterConfigsResource
            request: Any = IncrementalAlterConfigsRequest[1](resources=[resource(
                resource_type=resource_type, resource_name=name, configs=[
                    resource.AlterableConfig(name=config, config_operation=0, value="1000")
                    for config in configs])], validate_only=False)
            response: Any = IncrementalAlterConfigsResponse
        else:
            replaced = AlterConfigsRequest.AlterConfigsResource
            request = AlterConfigsRequest[2](resources=[replaced(
                resource_type=resource_type, resource_name=name, configs=[
                    replaced.AlterableConfig(name=config, value="1000")
                    for config in configs])], validate_only=False)
            response = AlterConfigsResponse
        (result,) = conn.call(request, 1 if incremental else 2, response).responses
    finally:
        conn.close()
    return result.error_code, result.error_message


@pytest.mark.parametrize("incremental", [True, False])
def test_broker_configs_are_not_dynamic(configured: BrokerProcess, incremental: bool) -> None:
    for name in ("0", ""):
        code, message = _alter_broker(configured, incremental, name,
                                      ["log.retention.ms", "log.dirs"])
        assert code == INVALID_REQUEST
        assert message is not None and message.startswith(
            "Cannot update these configs dynamically: log.dirs, log.retention.ms")
        assert _alter_broker(configured, incremental, name, []) == (0, None)
    assert _alter_broker(configured, incremental, "1", ["log.retention.ms"]) == (
        INVALID_REQUEST, "Unexpected broker id, expected 0 or empty string, but received 1")
    assert _alter_broker(configured, incremental, "0", ["kafka.server"], BROKER_LOGGER) == (
        INVALID_REQUEST, "Unsupported resource type: BROKER_LOGGER")
    assert _describe(configured, 4, BROKER, "0", False,
                     ["log.retention.ms"]).configs[0].value == "3600000"
