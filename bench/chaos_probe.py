"""What the brokers of a chaos run say about the transform's transaction, for a call that
takes too long (``bench/chaos_load.py``): which broker each one names as the coordinator of
the transactional id and of the transform's group, and the transaction's state as its
coordinator describes it. Raw requests (the test helpers' connections), each bounded by a
short timeout: a broker down or paused is reported as such."""

from __future__ import annotations

from collections.abc import Sequence

from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse

from tests.raw import RawConnection

GROUP_KEY, TXN_KEY = 0, 1
_TIMEOUT_S = 3.0


def _coordinator(port: int, key_type: int, key: str) -> str:
    conn = RawConnection(port, timeout=_TIMEOUT_S)
    try:
        answer = conn.call(FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=[key]),
                           4, FindCoordinatorResponse)
    finally:
        conn.close()
    (found,) = answer.coordinators
    return f"{found.node_id}" if found.error_code == 0 else f"error {found.error_code}"


def _describe(port: int, transactional_id: str) -> str:
    conn = RawConnection(port, timeout=_TIMEOUT_S)
    try:
        answer = conn.call(DescribeTransactionsRequest[0](transactional_ids=[transactional_id]),
                           0, DescribeTransactionsResponse)
    finally:
        conn.close()
    (state,) = answer.transaction_states
    if state.error_code:
        return f"error {state.error_code}"
    parts = sorted(p for t in state.topics for p in t.partitions)
    return (f"{state.transaction_state} pid {state.producer_id} epoch {state.producer_epoch} "
            f"started {state.transaction_start_time_ms} partitions {parts}")


def transaction_state(ports: Sequence[int], transactional_id: str, group: str) -> str:
    """One line: per broker, the coordinators it names and the transaction as it sees it."""
    seen = []
    for broker, port in enumerate(ports):
        try:
            seen.append(f"broker {broker}: txn coordinator "
                        f"{_coordinator(port, TXN_KEY, transactional_id)}, group coordinator "
                        f"{_coordinator(port, GROUP_KEY, group)}, transaction "
                        f"{_describe(port, transactional_id)}")
        except (OSError, AssertionError, ValueError) as exc:
            seen.append(f"broker {broker}: unreachable ({type(exc).__name__})")
    return "; ".join(seen)
