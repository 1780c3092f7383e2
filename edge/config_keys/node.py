"""Configuration keys of the broker as a node: its id, rack and cluster lease, its
listeners, the namespace of short topic names, and what one connection may hold.

These groups of keys are bases of :class:`edge.config.BrokerConfig` (see
:mod:`edge.config` for how a key is declared).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from common.settings import key
from edge.config_types import INT_MAX, Name


class NodeKeys(BaseModel):
    """Who this broker is (its id, rack and cluster lease), where it listens and what it
    advertises, and the namespace short topic names resolve in."""

    broker_id: Annotated[int, key("brokerId", "stable node id", ge=0, le=INT_MAX)] = 0
    broker_rack: Annotated[str, key(
        "brokerRack",
        "rack of this broker, shown in Metadata (empty = none)")] = ""
    broker_session_timeout_ms: Annotated[int, key(
        "brokerSessionTimeoutMs",
        "a broker whose lease is not renewed for this long is dead and its partitions move "
        "(shorter: faster failover; longer: fewer false failovers when a broker or the "
        "database stalls)", ge=500, le=INT_MAX)] = 6000
    broker_heartbeat_interval_ms: Annotated[int, key(
        "brokerHeartbeatIntervalMs",
        "how often a broker renews its lease and rebalances partition ownership; at most "
        "half of `brokerSessionTimeoutMs` (a larger value stops the start)", ge=50,
        le=INT_MAX)] = 1000
    kafka_listeners: Annotated[str, key(
        "kafkaListeners",
        "listeners, `NAME://host:port,...`; NAME is a security protocol unless "
        "`kafkaProtocolMap` is set", min_length=1)] = "PLAINTEXT://127.0.0.1:9092"
    kafka_advertised_listeners: Annotated[str, key(
        "kafkaAdvertisedListeners",
        "addresses given to clients, same format and names as `kafkaListeners`, never a "
        "wildcard (`0.0.0.0`, `[::]`: refused); a listener without an entry advertises its "
        "bind address, or this host's name when it binds every interface")] = ""
    kafka_protocol_map: Annotated[str, key(
        "kafkaProtocolMap",
        "listener name to protocol, `NAME:PROTOCOL,...`")] = ""
    kafka_tenant: Annotated[Name, key("kafkaTenant", "tenant of short topic names")] = "public"
    kafka_namespace: Annotated[Name, key(
        "kafkaNamespace",
        "namespace of short topic names")] = "default"
    event_loop_slice_us: Annotated[int, key(
        "eventLoopSliceUs",
        "CPU time slice (microseconds) the event loop thread asks Linux's scheduler for "
        "(`sched_setattr`, kernel 6.12 on; older ones ignore it): a short slice lets it "
        "preempt CPU-bound processes sharing its CPU when a request arrives, without a "
        "larger share of the CPU (measured: fewer 100 ms stalls under contention, but more "
        "requests over 1 ms; off by default); 0 = the kernel's default",
        ge=0, le=100_000)] = 0


class ConnectionKeys(BaseModel):
    """What one connection may hold: requests read ahead, the bytes of a Fetch and of
    the responses not yet sent, and how long it may stay idle."""

    max_queued_requests: Annotated[int, key(
        "maxQueuedRequests",
        "requests read ahead per connection", ge=1)] = 500
    fetch_max_bytes: Annotated[int, key(
        "fetchMaxBytes",
        "most record bytes one Fetch response carries, whatever the client asks (Kafka's "
        "`fetch.max.bytes`; a first batch larger than it is still sent whole)",
        ge=1, le=INT_MAX)] = 57671680
    max_pending_response_bytes: Annotated[int, key(
        "maxPendingResponseBytes",
        "response bytes one connection may hold: finished and not yet sent, or still to come "
        "from its running requests (a Fetch counts its limits); a request that does not fit "
        "waits, unless nothing else is held", ge=1, le=INT_MAX)] = 8388608
    connection_max_idle_ms: Annotated[int, key(
        "connectionMaxIdleMs",
        "close connections idle this long (ms); 0 = no idle timeout", ge=0)] = 600000
