"""The engine's Prometheus metrics, named after KoP's (``kop_server_`` prefix).

Requests are counted and timed per API; the produce path is timed by stage (the whole
request, batch validation, the append to storage, and the wait for durability); records
and bytes are counted per topic in and out; fsyncs are timed; failed writes to the data
directory are counted. The edge serves them on
``/metrics``. What every request touches is counted without a lock, on the event loop's
thread (:mod:`broker_core.loop_metrics`); the rest by ``prometheus_client``.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from broker_core.loop_metrics import CounterFamily, HistogramFamily, LoopCounter, LoopHistogram

REQUESTS = CounterFamily("kop_server_requests", "Requests handled, by API.", ["api"])
REQUEST_LATENCY = HistogramFamily(
    "kop_server_request_latency_seconds", "Time from decoding a request to its response.",
    ["api"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
PRODUCE_STAGE = HistogramFamily(
    "kop_server_produce_stage_seconds",
    "Produce path stages: handle (whole request), validate (batch checks), "
    "append (write to the ledger), queued (wait for fsync before the ack).",
    ["stage"], buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
                        0.25, 1))
MESSAGES_IN = CounterFamily("kop_server_messages_in", "Records appended, by topic.",
                            ["topic"])
BYTES_IN = CounterFamily("kop_server_bytes_in", "Record batch bytes appended, by topic.",
                         ["topic"])
MESSAGES_OUT = CounterFamily("kop_server_messages_out", "Records sent to fetchers, by topic.",
                             ["topic"])
BYTES_OUT = CounterFamily("kop_server_bytes_out",
                          "Record batch bytes sent to fetchers, by topic.", ["topic"])
FSYNC = Histogram(
    "kop_server_fsync_seconds", "Time of one partition's fsync (periodic or forced).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
STORAGE_WRITE_ERRORS = Counter(
    "kop_server_storage_write_errors",
    "Writes to the data directory that failed (a full disk, an I/O error).")
TXN_VERIFICATIONS = Counter(
    "kop_server_txn_verifications",
    "Reads of another broker's transaction coordinator state that a transactional "
    "produce waited for (the first batch of a transaction on a partition), by outcome: "
    "verified, refused, unavailable.", ["outcome"])
STATE_LOOKUP_STATEMENTS = Counter(
    "kop_server_state_lookup_statements",
    "Statements reading another broker's coordinator state from the shared storage (the "
    "transaction coordinator's, to verify a transactional produce).")
STATE_LOOKUP_BATCHES = Counter(
    "kop_server_state_lookup_batches",
    "Batches of coordinator state records those statements read.")
_PER_API: dict[str, tuple[LoopCounter, LoopHistogram]] = {}


def per_api(api: str) -> tuple[LoopCounter, LoopHistogram]:
    """``REQUESTS`` and ``REQUEST_LATENCY`` of one API, labelled once; an API's series
    appear once it is served."""
    found = _PER_API.get(api)
    if found is None:
        found = _PER_API[api] = (REQUESTS.labels(api), REQUEST_LATENCY.labels(api))
    return found


STAGE_HANDLE = PRODUCE_STAGE.labels("handle")
STAGE_VALIDATE = PRODUCE_STAGE.labels("validate")
STAGE_APPEND = PRODUCE_STAGE.labels("append")
STAGE_QUEUED = PRODUCE_STAGE.labels("queued")
CLEANER_RUNS = Counter(
    "kop_log_cleaner_runs", "Partitions the log cleaner cleaned (one per cleaning).")
CLEANER_BYTES_RECLAIMED = Counter(
    "kop_log_cleaner_bytes_reclaimed", "Bytes the log cleaner removed from compacted topics.")
CLEANER_DIRTY_RATIO = Gauge(
    "kop_log_cleaner_dirty_ratio",
    "Share of a compacted partition's cleanable bytes not cleaned yet, by partition.",
    ["topic", "partition"])
CLEANER_MAX_DELAY = Gauge(
    "kop_log_cleaner_max_compaction_delay_seconds",
    "How far the oldest not yet cleaned data of any compacted partition is past its "
    "max.compaction.lag.ms (Kafka's max-compaction-delay-secs; 0: none is).")


def forget_topic(internal: str, partitions: int) -> None:
    """Drop the series of a deleted topic (Kafka removes a topic's BrokerTopicMetrics on
    deletion): topics created and deleted without end would grow ``/metrics`` without
    bound. A topic created again under the name counts from 0."""
    for family in (MESSAGES_IN, BYTES_IN, MESSAGES_OUT, BYTES_OUT):
        family.remove(internal)
    for index in range(partitions):
        CLEANER_DIRTY_RATIO.remove(internal, str(index))
