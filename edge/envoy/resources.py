"""Envoy listeners and clusters for a plan, as ``xds-protos`` messages.

Without SNI each broker gets a listener ``kafka-broker-<id>`` on its advertised port;
with SNI one listener ``kafka-brokers-sni`` holds one filter chain per broker, matched by
TLS server name (the advertised host).  Each broker gets a cluster ``kafka-broker-<id>``
with its internal address (``STATIC`` for an IP, ``STRICT_DNS`` for a host name).  The
same messages go into a static bootstrap and into the ADS server's snapshots.  With
``proxy_protocol`` each cluster's connections start with a PROXY protocol v2 header naming
the client (Envoy's ``upstream_proxy_protocol`` transport socket over the raw one), for
brokers whose listener takes it (``proxyProtocolTrustedAddresses``).
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, proxy_protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.transport_sockets.proxy_protocol.v3 import upstream_proxy_protocol_pb2
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from google.protobuf import duration_pb2

from edge.envoy.filters import access_logs, network_filters, typed
from edge.envoy.model import BrokerRoute, EnvoyPlan, TlsTermination, is_ip

__all__ = ["SNI_LISTENER", "clusters", "listeners", "socket_address"]

SNI_LISTENER = "kafka-brokers-sni"


def socket_address(host: str, port: int) -> address_pb2.Address:
    """A core ``Address`` for ``host:port`` over TCP."""
    return address_pb2.Address(socket_address=address_pb2.SocketAddress(
        address=host, port_value=port, protocol=address_pb2.SocketAddress.TCP))


def _tls_socket(tls: TlsTermination) -> base_pb2.TransportSocket:
    common = tls_pb2.CommonTlsContext(tls_certificates=[common_pb2.TlsCertificate(
        certificate_chain=base_pb2.DataSource(filename=tls.cert_chain),
        private_key=base_pb2.DataSource(filename=tls.private_key),
    )])
    context = tls_pb2.DownstreamTlsContext(common_tls_context=common)
    if tls.client_ca is not None:
        context.common_tls_context.validation_context.trusted_ca.filename = tls.client_ca
        context.require_client_certificate.value = True
    return base_pb2.TransportSocket(name="envoy.transport_sockets.tls",
                                    typed_config=typed(context))


def _filter_chain(plan: EnvoyPlan, broker: BrokerRoute) -> listener_components_pb2.FilterChain:
    chain = listener_components_pb2.FilterChain(
        name=broker.name, filters=network_filters(broker, plan.options, plan.brokers))
    if plan.options.sni:
        chain.filter_chain_match.server_names.append(broker.advertised_host)
    if plan.options.tls is not None:
        chain.transport_socket.CopyFrom(_tls_socket(plan.options.tls))
    return chain


def listeners(plan: EnvoyPlan) -> list[listener_pb2.Listener]:
    """The Envoy listeners of ``plan``."""
    logs = access_logs(plan.options.access_log)
    if plan.options.sni:
        first = plan.brokers[0]
        listener = listener_pb2.Listener(
            name=SNI_LISTENER,
            address=socket_address(plan.listen_host(first), first.advertised_port),
            listener_filters=[listener_components_pb2.ListenerFilter(
                name="envoy.filters.listener.tls_inspector",
                typed_config=typed(tls_inspector_pb2.TlsInspector()))],
            filter_chains=[_filter_chain(plan, b) for b in plan.brokers],
            access_log=logs,
        )
        return [listener]
    return [
        listener_pb2.Listener(
            name=broker.name,
            address=socket_address(plan.listen_host(broker), broker.advertised_port),
            filter_chains=[_filter_chain(plan, broker)],
            access_log=logs,
        )
        for broker in plan.brokers
    ]


def clusters(plan: EnvoyPlan) -> list[cluster_pb2.Cluster]:
    """One cluster per broker, pointing at its internal listener."""
    result: list[cluster_pb2.Cluster] = []
    for broker in plan.brokers:
        cluster = cluster_pb2.Cluster(
            name=broker.name,
            connect_timeout=_seconds(plan.options.connect_timeout_s),
            load_assignment=endpoint_pb2.ClusterLoadAssignment(
                cluster_name=broker.name,
                endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
                    endpoint_components_pb2.LbEndpoint(
                        endpoint=endpoint_components_pb2.Endpoint(
                            address=socket_address(broker.internal_host,
                                                   broker.internal_port)))])],
            ),
        )
        if plan.options.proxy_protocol:
            cluster.transport_socket.CopyFrom(_proxy_protocol_socket())
        if is_ip(broker.internal_host):
            cluster.type = cluster_pb2.Cluster.STATIC
        else:
            cluster.type = cluster_pb2.Cluster.STRICT_DNS
            cluster.dns_lookup_family = cluster_pb2.Cluster.V4_PREFERRED
        result.append(cluster)
    return result


def _proxy_protocol_socket() -> base_pb2.TransportSocket:
    """The upstream transport that sends a PROXY protocol v2 header, then the raw stream
    (the brokers' TLS, if any, passes through it untouched)."""
    upstream = upstream_proxy_protocol_pb2.ProxyProtocolUpstreamTransport(
        config=proxy_protocol_pb2.ProxyProtocolConfig(
            version=proxy_protocol_pb2.ProxyProtocolConfig.V2),
        transport_socket=base_pb2.TransportSocket(
            name="envoy.transport_sockets.raw_buffer",
            typed_config=typed(raw_buffer_pb2.RawBuffer())))
    return base_pb2.TransportSocket(name="envoy.transport_sockets.upstream_proxy_protocol",
                                    typed_config=typed(upstream))


def _seconds(value: float) -> duration_pb2.Duration:
    whole = int(value)
    return duration_pb2.Duration(seconds=whole, nanos=round((value - whole) * 1e9))

