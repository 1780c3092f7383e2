"""A ``__consumer_offsets`` write whose commit fails, or that is under way when the
partition moves to another broker, changes nothing in the group coordinator's memory but
what the log holds (a commit whose answer was lost has the partition replayed; here the
commit did not happen, its backend terminated while it waited for a lock): OffsetDelete
and DeleteGroups are written again by their retry (after a move the offsets stay
deleted), and an OffsetCommit whose partition moved meanwhile is answered NOT_COORDINATOR
(engine driven directly, on a real PostgreSQL)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker_core.engine import Engine
from broker_core.errors import ErrorCode, KafkaApiError
from broker_core.groups.model import GroupState
from broker_core.groups.offsets import OffsetToCommit
from tests.coordinator_failures import (
    OFFSETS_TOPIC,
    TOPIC,
    answer_lost,
    commit_waits,
    fails,
    moved,
    row_locked,
    run_engine,
    run_proxied,
    served,
    terminate_waiting,
    until,
)
from tests.pg_proxy import PgProxy

GROUP = "dg"


async def _commit(engine: Engine, offsets: dict[int, int], group: str = GROUP
                  ) -> dict[int, ErrorCode]:
    """OffsetCommit of a group that only stores offsets: each partition's error."""
    code, results = await engine.groups.commit(
        OFFSETS_TOPIC, group, "", None, -1,
        [OffsetToCommit(TOPIC, p, offset, -1, None) for p, offset in offsets.items()])
    assert code == ErrorCode.NONE
    return {p: results[(TOPIC, p)] for p in offsets}


def _committed(engine: Engine, group: str = GROUP) -> dict[int, int | None]:
    found = engine.groups.committed(OFFSETS_TOPIC, group, [(TOPIC, 0), (TOPIC, 1)])
    return {p: None if c is None else c.offset for (_, p), c in found.items()}


def test_a_failed_offset_delete_is_written_again_by_its_retry() -> None:
    async def scenario(url: str, engine: Engine) -> None:
        partition = await served(engine.groups, OFFSETS_TOPIC, GROUP)
        assert await _commit(engine, {0: 42, 1: 43}) == {0: ErrorCode.NONE, 1: ErrorCode.NONE}
        group = engine.groups.find(OFFSETS_TOPIC, GROUP)
        assert group is not None
        error = await fails(url, partition, engine.groups.delete_offsets(group, [(TOPIC, 0)]))
        assert error.code == ErrorCode.NOT_COORDINATOR
        await served(engine.groups, OFFSETS_TOPIC, GROUP)  # replayed: the outcome was unknown
        assert _committed(engine) == {0: 42, 1: 43}  # nothing deleted by the failed write
        group = engine.groups.find(OFFSETS_TOPIC, GROUP)
        assert group is not None
        await engine.groups.delete_offsets(group, [(TOPIC, 0)])  # the retry writes
        assert _committed(engine) == {0: None, 1: 43}
        await moved(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: None, 1: 43}

    run_engine(scenario)


def test_a_failed_group_deletion_is_written_again_by_its_retry() -> None:
    """While DeleteGroups' tombstones are written the group is Dead (a commit is answered
    COORDINATOR_NOT_AVAILABLE, retried by the client); their write fails: the group is
    Empty again with its offsets, and the retry deletes it for good."""

    async def scenario(url: str, engine: Engine) -> None:
        partition = await served(engine.groups, OFFSETS_TOPIC, GROUP)
        await _commit(engine, {0: 42, 1: 43})

        async def delete() -> None:
            code = await engine.groups.delete_group(OFFSETS_TOPIC, GROUP)
            if code != ErrorCode.NONE:
                raise KafkaApiError(code, "DeleteGroups")

        async def meanwhile() -> None:
            code, _ = await engine.groups.commit(OFFSETS_TOPIC, GROUP, "", None, -1, [
                OffsetToCommit(TOPIC, 0, 50, -1, None)])
            assert code == ErrorCode.COORDINATOR_NOT_AVAILABLE

        error = await fails(url, partition, delete(), meanwhile)
        assert error.code == ErrorCode.NOT_COORDINATOR
        await served(engine.groups, OFFSETS_TOPIC, GROUP)  # replayed: the outcome was unknown
        group = engine.groups.find(OFFSETS_TOPIC, GROUP)
        assert group is not None and group.state == GroupState.EMPTY
        assert _committed(engine) == {0: 42, 1: 43}
        await delete()  # the retry
        assert engine.groups.find(OFFSETS_TOPIC, GROUP) is None
        await moved(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: None, 1: None}

    run_engine(scenario)


def test_a_commit_under_way_when_its_partition_moves_is_answered_not_coordinator() -> None:
    """An OffsetCommit waits for its commit when another broker takes the partition; the
    commit then succeeds: the answer is NOT_COORDINATOR (the client commits again at the
    new coordinator), not a dropped connection; the next coordinator has the offset."""

    async def scenario(url: str, engine: Engine) -> None:
        partition = await served(engine.groups, OFFSETS_TOPIC, GROUP)
        with row_locked(url, partition) as locker:
            task = asyncio.ensure_future(_commit(engine, {0: 7}))
            await commit_waits(url, task)
            engine.groups.unload_partition(OFFSETS_TOPIC, engine.groups.place(OFFSETS_TOPIC, GROUP))
            locker.rollback()
        assert await asyncio.wait_for(task, 30) == {0: ErrorCode.NOT_COORDINATOR}
        await served(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: 7, 1: None}

    run_engine(scenario)


def test_a_commit_under_way_keeps_its_group_from_expiring() -> None:
    """Offset expiry comes to an empty group with no offsets while a commit of it is being
    written: the group is kept (as Kafka's hasOffsets counts pending commits), so the
    acknowledged offset is not left in a group that expiry dropped."""

    async def scenario(url: str, engine: Engine) -> None:
        partition = await served(engine.groups, OFFSETS_TOPIC, GROUP)
        with row_locked(url, partition) as locker:
            task = asyncio.ensure_future(_commit(engine, {0: 7}))
            await commit_waits(url, task)
            group = engine.groups.find(OFFSETS_TOPIC, GROUP)
            assert group is not None and group.state == GroupState.EMPTY
            assert group.offsets == {}  # the commit is not settled yet
            # expiry finishes while the commit's write still waits: it wrote nothing (a
            # deletion's tombstones would wait for the same row lock)
            await asyncio.wait_for(engine.groups.expire_offsets(int(time.time() * 1000)), 30)
            assert not task.done()
            locker.rollback()
        assert await asyncio.wait_for(task, 30) == {0: ErrorCode.NONE}
        assert engine.groups.find(OFFSETS_TOPIC, GROUP) is group
        assert _committed(engine) == {0: 7, 1: None}
        await moved(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: 7, 1: None}

    run_engine(scenario)


def test_an_offset_commit_whose_answer_is_lost_is_served_as_stored(
        caplog: pytest.LogCaptureFixture) -> None:
    """An OffsetCommit's write is committed but its answer lost (the connection dropped):
    the commit is answered NOT_COORDINATOR, yet the offset is stored. The coordinator must
    not go on serving the offset from before (a restart would show the other one):
    meanwhile the group's requests get COORDINATOR_LOAD_IN_PROGRESS (also while the replay
    cannot read the database, and tries again), and once its partition is replayed it
    serves the stored offset, as after a move."""

    async def scenario(url: str, proxy: PgProxy, engine: Engine) -> None:
        await served(engine.groups, OFFSETS_TOPIC, GROUP)
        assert await _commit(engine, {0: 5}) == {0: ErrorCode.NONE}

        def replay_failed() -> bool:
            proxy.cut()  # the replay's reads lose their answers too
            return any("could not replay" in r.getMessage() for r in caplog.records)

        async def meanwhile() -> None:
            assert engine.groups.check(OFFSETS_TOPIC, GROUP) == \
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            await until("a replay that failed", replay_failed)
            assert engine.groups.check(OFFSETS_TOPIC, GROUP) == \
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

        answered = await answer_lost(url, proxy, OFFSETS_TOPIC, _commit(engine, {0: 10}),
                                     meanwhile)
        assert answered == {0: ErrorCode.NOT_COORDINATOR}
        await served(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: 10, 1: None}  # as stored
        await _commit(engine, {1: 11})  # and it writes again
        await moved(engine.groups, OFFSETS_TOPIC, GROUP)
        assert _committed(engine) == {0: 10, 1: 11}

    run_proxied(scenario)


def test_a_group_whose_expiry_fails_does_not_keep_the_others_from_expiring(
        caplog: pytest.LogCaptureFixture) -> None:
    """Offset expiry (KIP-496) meets a group whose tombstones cannot be written (its
    ``__consumer_offsets`` partition's commit fails): that group keeps its offsets until
    the next round, with one log line; the groups after it expire in the same round."""
    failing, other = "a", "b"  # on partitions 1 and 0 of two; "a" is expired first

    async def scenario(url: str, engine: Engine) -> None:
        locked = await served(engine.groups, OFFSETS_TOPIC, failing)
        await served(engine.groups, OFFSETS_TOPIC, other)
        assert engine.groups.place(OFFSETS_TOPIC, failing) != \
            engine.groups.place(OFFSETS_TOPIC, other)
        await _commit(engine, {0: 42}, failing)
        await _commit(engine, {0: 43}, other)
        later = int(time.time() * 1000) + engine.groups.config.offsets_retention_ms + 60_000
        with row_locked(url, locked) as locker:
            expiry = asyncio.ensure_future(engine.groups.expire_offsets(later))
            await commit_waits(url, expiry)  # the failing group's tombstones wait
            terminate_waiting(url)
            await asyncio.wait_for(expiry, 30)  # no error out of the round
            locker.rollback()
        # (a session killed mid-commit is a lost answer to the broker: the partition is
        # read again)
        await served(engine.groups, OFFSETS_TOPIC, failing)
        assert _committed(engine, failing) == {0: 42, 1: None}
        assert engine.groups.find(OFFSETS_TOPIC, other) is None  # expired, then dropped
        failed = [r for r in caplog.records if r.levelno == logging.WARNING
                  and r.getMessage().startswith("could not expire")]
        assert len(failed) == 1 and getattr(failed[0], "group", None) == failing
        await engine.groups.expire_offsets(later)  # the next round
        assert engine.groups.find(OFFSETS_TOPIC, failing) is None
        for group in (failing, other):
            await moved(engine.groups, OFFSETS_TOPIC, group)
            assert _committed(engine, group) == {0: None, 1: None}

    run_engine(scenario, offsets_partitions=2)
