"""Kafka error codes the engine answers with, named as the protocol guide names them."""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Numeric error codes of the Kafka protocol (the subset this broker produces)."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    OFFSET_METADATA_TOO_LARGE = 12
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    TRANSACTION_COORDINATOR_FENCED = 52
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    INVALID_REQUEST = 42
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    UNSUPPORTED_COMPRESSION_TYPE = 76
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    GROUP_SUBSCRIBED_TO_TOPIC = 86
    SECURITY_DISABLED = 54
    KAFKA_STORAGE_ERROR = 56
    OPERATION_NOT_ATTEMPTED = 55
    SASL_AUTHENTICATION_FAILED = 58
    LOG_DIR_NOT_FOUND = 57
    UNKNOWN_PRODUCER_ID = 59
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    THROTTLING_QUOTA_EXCEEDED = 89
    PRODUCER_FENCED = 90
    TRANSACTIONAL_ID_NOT_FOUND = 105
    MISMATCHED_ENDPOINT_TYPE = 114
    UNSUPPORTED_ENDPOINT_TYPE = 115
    UNKNOWN_TOPIC_ID = 100
    INVALID_REGULAR_EXPRESSION = 128


class KafkaApiError(Exception):
    """An error that maps to one Kafka error code, with a message for the client and the log."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CloseConnection(Exception):
    """The request is handled, and its connection must now be closed; the message says
    why. Kafka closes a connection whose acks=0 produce had a partition refused: the
    producer gets no answer, so only the closed connection tells it to refresh its
    metadata (a producer still sending to a former leader would otherwise lose every
    record silently)."""


MARKER_FENCED = frozenset((ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                           ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED))
"""The refusals of a transaction marker (or a group's transaction end) that a later
coordinator or producer epoch fenced: its coordinator lost the transactional id, and the
next one ended the transaction; never tried again."""
