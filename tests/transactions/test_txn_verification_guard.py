"""A partition's record of its producers' verified transactions (KIP-890's
VerificationGuard, ``PartitionProducers.verifying``/``verified``): kept for the epoch and
transactional id verified, dropped by the producer's next marker, never stored, and a
verification that a marker overtook while the coordinator's state was read admits
nothing."""

from __future__ import annotations

from broker_core.partition_producers import PartitionProducers

PID, EPOCH = 7, 3
KEY = ("public/__kafka/__transaction_state", "public/tid")


def test_a_verification_counts_once_done_for_its_epoch_and_id() -> None:
    state = PartitionProducers()
    guard = state.verifying(PID, EPOCH, KEY)
    assert not state.verified(PID, EPOCH, KEY)  # under way
    guard.done = True
    assert state.verified(PID, EPOCH, KEY)
    assert not state.verified(PID, EPOCH + 1, KEY)
    assert not state.verified(PID, EPOCH, (KEY[0], "public/other"))
    assert not state.verified(PID + 1, EPOCH, KEY)
    assert state.verifying(PID, EPOCH, KEY) is guard  # a second batch meanwhile shares it


def test_the_next_marker_ends_it() -> None:
    state = PartitionProducers()
    state.verifying(PID, EPOCH, KEY).done = True
    state.end_transaction(PID, EPOCH, True, 10, 0)
    assert not state.verified(PID, EPOCH, KEY)
    assert state.verifications == {}


def test_a_marker_written_while_the_state_was_read_admits_nothing() -> None:
    state = PartitionProducers()
    guard = state.verifying(PID, EPOCH, KEY)
    state.end_transaction(PID, EPOCH, False, 10, 0)  # the transaction ended meanwhile
    guard.done = True  # the read saw it open
    assert not state.verified(PID, EPOCH, KEY)


def test_a_snapshot_keeps_no_verification() -> None:
    state = PartitionProducers()
    state.verifying(PID, EPOCH, KEY).done = True
    assert PartitionProducers.from_json(state.to_json(0)).verifications == {}


def test_a_batch_naming_another_id_leaves_the_verified_one_alone() -> None:
    state = PartitionProducers()
    state.verifying(PID, EPOCH, KEY).done = True
    other = state.verifying(PID, EPOCH, (KEY[0], "public/other"))
    other.done = True  # (it never is: the coordinator's state refuses it)
    assert state.verified(PID, EPOCH, KEY)
    assert not state.verified(PID, EPOCH, (KEY[0], "public/other"))


def test_a_new_epoch_verifies_again() -> None:
    state = PartitionProducers()
    state.verifying(PID, EPOCH, KEY)  # a verification that failed (never done)
    guard = state.verifying(PID, EPOCH + 1, KEY)
    guard.done = True
    assert state.verified(PID, EPOCH + 1, KEY)


def test_a_refusal_leaves_nothing_behind() -> None:
    """Refused batches (made-up producer ids, say) leave no verification in the partition's
    state: it would grow with every refusal otherwise, since only a marker of the producer
    removes one."""
    state = PartitionProducers()
    for pid in range(1_000):
        guard = state.verifying(pid, EPOCH, KEY)
        state.refused(pid, guard)
    assert state.verifications == {}


def test_another_ids_batch_cannot_displace_a_verification_under_way() -> None:
    """A batch naming another transactional id at the producer's epoch (only a client that
    knows the victim's producer id and epoch sends one) is verified on a guard kept
    nowhere: the producer's own verification under way stays, and the refusal of the other
    one removes nothing of it."""
    state = PartitionProducers()
    guard = state.verifying(PID, EPOCH, KEY)
    other = state.verifying(PID, EPOCH, (KEY[0], "public/other"))
    assert other is not guard
    state.refused(PID, other)
    guard.done = True
    assert state.verified(PID, EPOCH, KEY)
