"""The group coordinator's settings (filled from the broker's configuration by ``edge``)."""

from __future__ import annotations

from dataclasses import dataclass

TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
"""The default of ``transactionalIdExpirationMs``: how long the transaction coordinator
keeps an idle transactional id, and a group the fence of a producer idle there."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Settings of the group coordinator."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 300_000
    initial_rebalance_delay_ms: int = 3000
    group_id_max_length: int = 255
    offset_metadata_max_size: int = 4096
    offsets_retention_ms: int = 4320 * 60_000
    retention_check_interval_ms: int = 600_000
    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS
    """A producer's transaction fence is forgotten once its last end here is this old
    (:meth:`~broker_core.groups.model.Group.forget_txn_fences`); the transaction
    coordinator's own setting (``TxnConfig.id_expiration_ms``)."""

    def accepts_session_timeout(self, session_timeout_ms: int) -> bool:
        """Whether a JoinGroup's session timeout is within the configured bounds (else
        INVALID_SESSION_TIMEOUT, before the group is even looked up)."""
        return self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms
