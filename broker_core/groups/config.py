"""The group coordinator's settings (filled from the broker's configuration by ``edge``)."""

from __future__ import annotations

from dataclasses import dataclass

TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
"""The default of ``transactionalIdExpirationMs``: how long the transaction coordinator
keeps an idle transactional id, and a group the fence of a producer idle there."""

GROUP_MAX_SIZE = 1000
"""The default of ``groupMaxSize``: members and pending member ids a group holds at most
(Kafka's ``group.max.size``, whose default is unbounded)."""

GROUP_METADATA_MAX_BYTES = 2 * 1024 * 1024
"""The default of ``groupMetadataMaxBytes``: what a group's record may hold of its
members. Kafka bounds the record by its offsets topic's ``message.max.bytes``, 1 MiB, but
keeps only the chosen protocol's metadata of each member; this record keeps every
protocol a member lists, and clients list two (librdkafka ``range,roundrobin``, the Java
client ``range`` and ``cooperative-sticky``): twice that, so the same groups fit."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """Settings of the group coordinator."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 300_000
    initial_rebalance_delay_ms: int = 3000
    group_id_max_length: int = 255
    offset_metadata_max_size: int = 4096
    max_size: int = GROUP_MAX_SIZE
    """Members plus pending member ids of one group (GROUP_MAX_SIZE_REACHED beyond)."""
    metadata_max_bytes: int = GROUP_METADATA_MAX_BYTES
    """Bytes of a group's members in its record (:meth:`Member.record_bytes`): a JoinGroup
    or a leader's assignment beyond is refused UNKNOWN_SERVER_ERROR."""
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
