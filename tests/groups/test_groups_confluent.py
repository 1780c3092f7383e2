"""Acceptance 1 (groups): confluent-kafka consumer groups. Three members share a 6-partition
topic of 30,000 records, each partition owned by exactly one member at a time; a member
leaving midway is taken over from its committed offsets; with a synchronous commit after
each batch every record is processed at least once and again only after a failed commit.
A cooperative-sticky group rebalances incrementally when a member joins."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from tests.broker_process import BrokerProcess
from tests.clients import create_topic
from tests.conftest import check_engine_left, engine_settings
from tests.group_helpers import (
    ConfluentMember,
    GroupLedger,
    balanced,
    group_id_for,
    produce_values,
    pump,
    start_broker,
)

pytestmark = pytest.mark.storage_engines  # each test on file://, memory:// and postgres://

PARTITIONS = 6
PHASES = [(0, 1700), (1700, 3400), (3400, 5000)]  # offsets per partition, 30,000 records


@pytest.fixture(scope="module")
def cbroker(tmp_path_factory: pytest.TempPathFactory,
            storage_engine: str) -> Iterator[BrokerProcess]:
    data = Path(tmp_path_factory.mktemp("groups-confluent")) / "data"
    process = start_broker(data, groupInitialRebalanceDelayMs="500",
                           **engine_settings(storage_engine))
    yield process
    process.stop()
    check_engine_left(data, storage_engine)


def records(start: int, stop: int, partitions: int = PARTITIONS) -> set[tuple[int, int]]:
    return {(p, o) for p in range(partitions) for o in range(start, stop)}


def committed_offsets(member: ConfluentMember, partitions: int) -> dict[int, int]:
    tps = [confluent_kafka.TopicPartition(member.topic, p) for p in range(partitions)]
    return {tp.partition: tp.offset for tp in member.consumer.committed(tps, timeout=10)}


def test_three_members_share_partitions_and_take_over_a_leaver(cbroker: BrokerProcess,
                                                               topic_name: str) -> None:
    create_topic(cbroker.bootstrap, topic_name, PARTITIONS)
    group = group_id_for(topic_name)
    ledger = GroupLedger()
    names = ["c0", "c1", "c2"]
    members = [ConfluentMember(n, cbroker.bootstrap, group, topic_name, ledger) for n in names]
    try:
        pump(members, balanced(ledger, names, PARTITIONS), 30, "2 partitions for each of 3")

        # Phase 1: a stable group; each member processes exactly its own two partitions.
        produce_values(cbroker.bootstrap, topic_name, range(PARTITIONS), *PHASES[0])
        phase1 = records(*PHASES[0])
        pump(members, lambda: ledger.seen() >= phase1, 60, "phase 1 processed")
        owned = ledger.ownership()
        for name in names:
            assert len(owned[name]) == 2
            assert ledger.count_by(name) == 2 * PHASES[0][1], (name, owned)

        # Phase 2: c1 leaves midway; c0 and c2 take its partitions over where it committed.
        produce_values(cbroker.bootstrap, topic_name, range(PARTITIONS), *PHASES[1])
        leaver = members[1]
        leaver_parts = owned["c1"]
        pump(members, lambda: ledger.count_by("c1") >= 2 * PHASES[0][1] + 1000, 60,
             "c1 halfway through phase 2")
        close_mark = ledger.mark()
        leaver.close()
        members.remove(leaver)
        left_over = {p: ledger.committed_end(p, close_mark) for p in leaver_parts}
        assert any(end < PHASES[1][1] for end in left_over.values()), left_over
        assert ledger.ownership().get("c1", set()) == set()
        phase2 = records(0, PHASES[1][1])
        pump(members, lambda: balanced(ledger, ["c0", "c2"], PARTITIONS)()
             and ledger.seen() >= phase2, 60, "c0 and c2 own everything, phase 2 processed")
        for p, end in left_over.items():
            first = ledger.first_after(p, close_mark)
            assert first is not None, p
            assert first[0] in ("c0", "c2")
            assert first[1] == end, (p, first, end)

        # Phase 3: the rest; then everything is committed exactly up to the end.
        produce_values(cbroker.bootstrap, topic_name, range(PARTITIONS), *PHASES[2])
        everything = records(0, PHASES[2][1])
        pump(members, ledger.all_committed(PARTITIONS, PHASES[2][1]), 60,
             "all 30,000 records processed and committed")
        ledger.check_delivery(everything)
        assert committed_offsets(members[0], PARTITIONS) == dict.fromkeys(
            range(PARTITIONS), PHASES[2][1])
        assert all(not m.lost for m in members), [m.lost for m in members]
    finally:
        for member in members:
            member.close()


def test_cooperative_sticky_group_rebalances_incrementally(cbroker: BrokerProcess,
                                                           topic_name: str) -> None:
    create_topic(cbroker.bootstrap, topic_name, PARTITIONS)
    group = group_id_for(topic_name)
    ledger = GroupLedger()
    conf = {"partition.assignment.strategy": "cooperative-sticky"}
    members = [ConfluentMember(n, cbroker.bootstrap, group, topic_name, ledger, **conf)
               for n in ("c0", "c1")]
    try:
        produce_values(cbroker.bootstrap, topic_name, range(PARTITIONS), 0, 500)
        pump(members, lambda: balanced(ledger, ["c0", "c1"], PARTITIONS)()
             and ledger.all_committed(PARTITIONS, 500)(), 60, "two members, 500 each")
        before = ledger.ownership()
        mark = ledger.mark()

        members.append(ConfluentMember("c2", cbroker.bootstrap, group, topic_name, ledger,
                                       **conf))
        produce_values(cbroker.bootstrap, topic_name, range(PARTITIONS), 500, 1000)
        everything = records(0, 1000)
        pump(members, lambda: balanced(ledger, ["c0", "c1", "c2"], PARTITIONS)()
             and ledger.all_committed(PARTITIONS, 1000)(), 60,
             "three members, everything committed")
        after = ledger.ownership()
        later = [e for e in ledger.events if e[0] > mark]
        moved: set[int] = set()
        for name in ("c0", "c1"):
            revoked = [set(parts) for _seq, who, kind, parts in later
                       if who == name and kind == "revoke" and parts]
            gained = [parts for _seq, who, kind, parts in later
                      if who == name and kind == "assign" and parts]
            assert gained == [], (name, later)
            assert revoked, (name, later)
            for parts in revoked:  # incremental: never everything it owned
                assert parts < before[name], (name, parts, before[name])
            assert after[name] == before[name] - set().union(*revoked)
            assert len(after[name]) == 2
            moved |= set().union(*revoked)
        assert after["c2"] == moved
        kept = (after["c0"] & before["c0"]) | (after["c1"] & before["c1"])
        counts = Counter(r for b in ledger.batches for r in b.records)
        twice = sorted(r for r, n in counts.items() if r[0] in kept and n > 1)
        assert twice == [], f"kept partitions were re-read: {twice[:5]}"
        ledger.check_delivery(everything)

        admin = AdminClient({"bootstrap.servers": cbroker.bootstrap})
        description = admin.describe_consumer_groups([group])[group].result(10)
        assert description.partition_assignor == "cooperative-sticky"
        assert str(description.state.name) == "STABLE"
        assert len(description.members) == 3
    finally:
        for member in members:
            member.close()
