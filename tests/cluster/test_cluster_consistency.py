"""Two brokers on one PostgreSQL decide topic changes by the database, not by their caches:
a config change made through one broker is never dropped by an IncrementalAlterConfigs
through the other a moment later, and a topic deleted (or created) through one broker is
answered UNKNOWN_TOPIC_OR_PARTITION (TOPIC_ALREADY_EXISTS) by the other, as Kafka does.

Each change through the second broker follows the first one at once, well inside the
250 ms in which the second broker's cache still holds the old state. Raw requests name the
broker each goes to.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.test_cluster_propagation import describe_configs, eventually
from tests.cluster_helpers import Cluster, running_cluster
from tests.security_helpers import NONE, UNKNOWN_TOPIC_OR_PARTITION, OpsConnection

ROUNDS = 6
TOPIC_ALREADY_EXISTS = 36


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(Path(tmp_path_factory.mktemp("pair")), size=2) as started:
        yield started


@pytest.fixture
def conns(pair: Cluster) -> Iterator[tuple[OpsConnection, OpsConnection]]:
    """A connection to each broker: every request goes to the broker named (a client such
    as librdkafka sends topic changes to the controller, the same broker each time)."""
    a, b = (OpsConnection(broker.port) for broker in pair.brokers)
    yield a, b
    a.close()
    b.close()


def test_config_changes_through_both_brokers_are_all_kept(
        conns: tuple[OpsConnection, OpsConnection], topic_name: str) -> None:
    a, b = conns
    assert a.create_topic(topic_name) == NONE
    assert describe_configs(b, topic_name)[0] == NONE  # the second broker caches its configs
    for i in range(ROUNDS):
        assert a.alter_config(topic_name, "retention.ms", str(100_000 + i)) == NONE
        assert b.alter_config(topic_name, "segment.ms", str(200_000 + i)) == NONE
        _wait_for_both(a, topic_name, (str(100_000 + i), str(200_000 + i)), i)


def _wait_for_both(conn: OpsConnection, topic: str, both: tuple[str, str], round_: int) -> None:
    """Until the broker shows (retention.ms, segment.ms) == ``both``; fail if it never does
    (a change was dropped)."""
    def stored() -> bool:
        configs = describe_configs(conn, topic)[1]
        return (configs["retention.ms"], configs["segment.ms"]) == both
    eventually(stored, f"round {round_}: both changes stored (one was dropped)")


def test_deleting_a_topic_the_other_broker_deleted_is_unknown(
        conns: tuple[OpsConnection, OpsConnection], topic_name: str) -> None:
    a, b = conns
    for i in range(ROUNDS):
        topic = f"{topic_name}-{i}"
        assert a.create_topic(topic) == NONE
        assert describe_configs(b, topic)[0] == NONE  # cached on the second broker
        assert a.delete_topic(topic) == NONE
        assert b.delete_topic(topic) == UNKNOWN_TOPIC_OR_PARTITION, f"round {i}"


def test_creating_a_topic_the_other_broker_created_already_exists(
        conns: tuple[OpsConnection, OpsConnection], topic_name: str) -> None:
    a, b = conns
    for i in range(ROUNDS):
        topic = f"{topic_name}-{i}"
        assert describe_configs(b, topic)[0] == UNKNOWN_TOPIC_OR_PARTITION
        assert a.create_topic(topic) == NONE
        assert b.create_topic(topic) == TOPIC_ALREADY_EXISTS, f"round {i}"
