"""Two brokers sharing PostgreSQL share their client quotas: a quota altered through one
broker is described by the other and throttles its clients, without a restart. Waits poll
with a deadline; nothing asserts how long the change took to arrive."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cluster_helpers import running_cluster
from tests.quota_helpers import alter, describe, parts, produce_throttle
from tests.raw import RawConnection


def test_a_quota_altered_through_one_broker_applies_on_the_other(tmp_path: Path,
                                                                   topic_name: str) -> None:
    with running_cluster(tmp_path, size=2, settings={"quotaWindowNum": "5"}) as cluster:
        first, second = cluster.brokers
        # before: the second broker does not throttle this client
        assert produce_throttle(RawConnection(second.port), topic_name, 50_000)[1] == 0
        entity = {"client-id": "raw-test"}
        assert alter(RawConnection(first.port), [(entity, {"producer_byte_rate": 1000})]) \
            == [(0, None)]
        conn = RawConnection(second.port)
        deadline = time.monotonic() + 30
        while describe(conn, [])[1].get(parts(entity)) != {"producer_byte_rate": 1000}:
            assert time.monotonic() < deadline, "the second broker never saw the quota"
            time.sleep(0.1)
        # charged whoever leads the partition (an answer NOT_LEADER_OR_FOLLOWER counts too)
        _error, throttle = produce_throttle(RawConnection(second.port), topic_name, 50_000)
        assert throttle > 0
