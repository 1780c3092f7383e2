"""Envoy network filters and access logs for one broker listener, as ``xds-protos`` messages.

The chain on every broker filter chain, in order: RBAC deny (source CIDRs), RBAC allow,
connection rate limit (``local_ratelimit``), connection limit (``connection_limit``),
the contrib ``kafka_broker`` filter when asked for, and ``tcp_proxy`` to the broker.
Stats (``GET /stats`` on the admin port), for broker id N:

* ``kafka_broker_N.rbac.denied`` / ``kafka_broker_N.allow.rbac.denied``
* ``local_rate_limit.kafka_broker_N.rate_limited``
* ``connection_limit.kafka_broker_N.limited_connections`` and ``.active_connections``
* ``tcp.kafka_broker_N.*`` (the proxy)
"""

from __future__ import annotations

import ipaddress

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, substitution_format_string_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_rules_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2
from envoy.extensions.access_loggers.stream.v3 import stream_pb2
from envoy.extensions.filters.network.connection_limit.v3 import connection_limit_pb2
from envoy.extensions.filters.network.local_ratelimit.v3 import local_rate_limit_pb2
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as rbac_filter_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.type.v3 import token_bucket_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from edge.envoy.contrib import kafka_broker_filter
from edge.envoy.model import AccessLog, BrokerRoute, EdgeOptions

__all__ = ["ACCESS_LOG_FORMAT", "EARLY_DATA_BYTES", "access_logs", "network_filters", "typed"]

EARLY_DATA_BYTES = 65536
"""Bytes ``tcp_proxy`` buffers from a client before the broker connection is up.

Kafka clients speak first, so ``tcp_proxy`` connects to the broker on the client's first
bytes (``ON_DOWNSTREAM_DATA``), after the RBAC filters have checked them: a refused
client never opens a broker connection."""

ACCESS_LOG_FORMAT = (
    "[%START_TIME%] %DOWNSTREAM_REMOTE_ADDRESS% -> %DOWNSTREAM_LOCAL_ADDRESS%"
    " sni=%REQUESTED_SERVER_NAME% upstream=%UPSTREAM_CLUSTER%/%UPSTREAM_HOST%"
    " flags=%RESPONSE_FLAGS% details=%CONNECTION_TERMINATION_DETAILS%"
    " bytes_in=%BYTES_RECEIVED% bytes_out=%BYTES_SENT% duration_ms=%DURATION%\n"
)
"""One line per closed connection, including connections the filters refused."""


def typed(message: Message) -> any_pb2.Any:
    """``message`` packed into a ``google.protobuf.Any``."""
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _filter(name: str, config: Message) -> listener_components_pb2.Filter:
    return listener_components_pb2.Filter(name=name, typed_config=typed(config))


def _cidr(text: str) -> address_pb2.CidrRange:
    network = ipaddress.ip_network(text, strict=False)
    return address_pb2.CidrRange(
        address_prefix=str(network.network_address),
        prefix_len=wrappers_pb2.UInt32Value(value=network.prefixlen),
    )


def _rbac(stat_prefix: str, action: int, policy: str, cidrs: tuple[str, ...]
          ) -> listener_components_pb2.Filter:
    rules = rbac_rules_pb2.RBAC(action=action)
    rules.policies[policy].CopyFrom(rbac_rules_pb2.Policy(
        permissions=[rbac_rules_pb2.Permission(any=True)],
        principals=[rbac_rules_pb2.Principal(direct_remote_ip=_cidr(c)) for c in cidrs],
    ))
    return _filter("envoy.filters.network.rbac",
                   rbac_filter_pb2.RBAC(stat_prefix=stat_prefix, rules=rules))


def network_filters(broker: BrokerRoute, options: EdgeOptions,
                    brokers: tuple[BrokerRoute, ...]) -> list[listener_components_pb2.Filter]:
    """The filter chain's filters for ``broker`` (``brokers``: every broker, for rewrites)."""
    prefix = broker.stat_prefix
    filters: list[listener_components_pb2.Filter] = []
    if options.deny_cidrs:
        filters.append(_rbac(f"{prefix}.", rbac_rules_pb2.RBAC.DENY, "denied-sources",
                             options.deny_cidrs))
    if options.allow_cidrs:
        filters.append(_rbac(f"{prefix}.allow.", rbac_rules_pb2.RBAC.ALLOW, "allowed-sources",
                             options.allow_cidrs))
    if options.connection_rate is not None:
        rate = options.connection_rate
        filters.append(_filter(
            "envoy.filters.network.local_ratelimit",
            local_rate_limit_pb2.LocalRateLimit(
                stat_prefix=prefix,
                token_bucket=token_bucket_pb2.TokenBucket(
                    max_tokens=rate.connections,
                    tokens_per_fill=wrappers_pb2.UInt32Value(value=rate.connections),
                    fill_interval=duration_pb2.Duration(seconds=rate.seconds),
                ),
            ),
        ))
    if options.max_connections is not None:
        filters.append(_filter(
            "envoy.filters.network.connection_limit",
            connection_limit_pb2.ConnectionLimit(
                stat_prefix=prefix,
                max_connections=wrappers_pb2.UInt64Value(value=options.max_connections),
            ),
        ))
    if options.kafka_broker_filter:
        filters.append(_filter("envoy.filters.network.kafka_broker",
                               kafka_broker_filter(prefix, brokers)))
    filters.append(_filter(
        "envoy.filters.network.tcp_proxy",
        tcp_proxy_pb2.TcpProxy(
            stat_prefix=prefix, cluster=broker.name,
            upstream_connect_mode=tcp_proxy_pb2.ON_DOWNSTREAM_DATA,
            max_early_data_bytes=wrappers_pb2.UInt32Value(value=EARLY_DATA_BYTES),
        ),
    ))
    return filters


def access_logs(log: AccessLog | None) -> list[accesslog_pb2.AccessLog]:
    """The listener access logs: none, stdout, or a file."""
    if log is None:
        return []
    log_format = substitution_format_string_pb2.SubstitutionFormatString(
        text_format_source=base_pb2.DataSource(inline_string=ACCESS_LOG_FORMAT),
    )
    if log.to_stdout:
        name = "envoy.access_loggers.stdout"
        config: Message = stream_pb2.StdoutAccessLog(log_format=log_format)
    else:
        name = "envoy.access_loggers.file"
        config = file_pb2.FileAccessLog(path=log.target, log_format=log_format)
    return [accesslog_pb2.AccessLog(name=name, typed_config=typed(config))]
