"""The engine's own settings classes (``EngineConfig``, ``GroupConfig``, ``TxnConfig``,
``ClusterConfig``, ``LogConfig`` in ``broker_core``, which may not import ``edge``) are
filled in from the broker config by ``edge.app``; their defaults, used by tests and
embedders, must say what the documented keys say."""

from __future__ import annotations

import dataclasses

from broker_core.engine_config import EngineConfig
from broker_core.storage.config import LogConfig
from edge.app import engine_config, log_config
from edge.config import BrokerConfig

# filled in from elsewhere than a key's default: the storage, the listeners
NOT_FROM_KEYS = {"cluster_id", "topic_defaults", "configured_topic_defaults",
                 "broker_configs"}


def test_engine_defaults_are_the_documented_defaults() -> None:
    built = engine_config(BrokerConfig(), "cluster", "/data")
    default = EngineConfig()
    differing = [item.name for item in dataclasses.fields(EngineConfig)
                 if item.name not in NOT_FROM_KEYS
                 and getattr(built, item.name) != getattr(default, item.name)]
    assert differing == []


def test_log_defaults_are_the_documented_defaults() -> None:
    assert log_config(BrokerConfig()) == LogConfig()


def test_a_key_reaches_the_engine() -> None:
    config = BrokerConfig(group_max_session_timeout_ms=1234,
                          kop_allowed_namespaces=("t/a", "t/b"))
    built = engine_config(config, "cluster", "/data")
    assert built.groups.max_session_timeout_ms == 1234
    assert built.listed_namespaces == ("t/a", "t/b")
