"""Envoy bootstraps as ``xds-protos`` messages, and their YAML text.

A *static* bootstrap carries the plan's listeners and clusters.  A *dynamic* bootstrap
carries none: Envoy asks an ADS server (``edge-broker xds-server``) for listeners and
clusters over gRPC, through a static cluster ``edge-xds``.  Both bind Envoy's admin
interface to loopback only.  YAML comes from ``json_format`` (proto field names), so
every key is a real field of the message it belongs to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2, protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message

from edge.envoy.filters import typed
from edge.envoy.model import EnvoyPlan, MutualTls, is_ip
from edge.envoy.resources import clusters, listeners, socket_address

__all__ = [
    "ADMIN_HOST",
    "NODE_CLUSTER",
    "XDS_CLUSTER",
    "dynamic_bootstrap",
    "message_yaml",
    "static_bootstrap",
]

ADMIN_HOST = "127.0.0.1"
NODE_CLUSTER = "edge-broker"
XDS_CLUSTER = "edge-xds"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def _base(node_id: str, admin_port: int) -> bootstrap_pb2.Bootstrap:
    return bootstrap_pb2.Bootstrap(
        node=base_pb2.Node(id=node_id, cluster=NODE_CLUSTER),
        admin=bootstrap_pb2.Admin(address=socket_address(ADMIN_HOST, admin_port)),
    )


def static_bootstrap(plan: EnvoyPlan, admin_port: int, node_id: str
                     ) -> bootstrap_pb2.Bootstrap:
    """A bootstrap with the plan's listeners and clusters."""
    bootstrap = _base(node_id, admin_port)
    bootstrap.static_resources.listeners.extend(listeners(plan))
    bootstrap.static_resources.clusters.extend(clusters(plan))
    return bootstrap


def _xds_tls_socket(host: str, tls: MutualTls) -> base_pb2.TransportSocket:
    """Envoy's side of mutual TLS to the xds-server at ``host``: its client certificate,
    and the server's certificate checked against ``tls.peer_ca`` and ``host``."""
    san = common_pb2.SubjectAltNameMatcher(
        san_type=common_pb2.SubjectAltNameMatcher.IP_ADDRESS if is_ip(host)
        else common_pb2.SubjectAltNameMatcher.DNS,
        matcher=string_pb2.StringMatcher(exact=host))
    context = tls_pb2.UpstreamTlsContext(
        common_tls_context=tls_pb2.CommonTlsContext(
            tls_certificates=[common_pb2.TlsCertificate(
                certificate_chain=base_pb2.DataSource(filename=tls.cert_chain),
                private_key=base_pb2.DataSource(filename=tls.private_key))],
            validation_context=common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(filename=tls.peer_ca),
                match_typed_subject_alt_names=[san]),
            alpn_protocols=["h2"]),
        sni="" if is_ip(host) else host)
    return base_pb2.TransportSocket(name="envoy.transport_sockets.tls",
                                    typed_config=typed(context))


def _xds_cluster(host: str, port: int, tls: MutualTls | None) -> cluster_pb2.Cluster:
    options = http_protocol_options_pb2.HttpProtocolOptions(
        explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()))
    cluster = cluster_pb2.Cluster(
        name=XDS_CLUSTER,
        type=cluster_pb2.Cluster.STATIC if is_ip(host) else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=duration_pb2.Duration(seconds=5),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=XDS_CLUSTER,
            endpoints=[endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=[
                endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(
                    address=socket_address(host, port)))])],
        ),
    )
    cluster.typed_extension_protocol_options[_HTTP_OPTIONS].CopyFrom(typed(options))
    if tls is not None:
        cluster.transport_socket.CopyFrom(_xds_tls_socket(host, tls))
    return cluster


def dynamic_bootstrap(xds_host: str, xds_port: int, admin_port: int, node_id: str,
                      tls: MutualTls | None = None) -> bootstrap_pb2.Bootstrap:
    """A bootstrap taking listeners and clusters from the ADS server at ``xds_host:port``
    (over mutual TLS with ``tls``)."""
    bootstrap = _base(node_id, admin_port)
    v3 = config_source_pb2.ApiVersion.V3
    dynamic = bootstrap.dynamic_resources
    dynamic.ads_config.CopyFrom(config_source_pb2.ApiConfigSource(
        api_type=config_source_pb2.ApiConfigSource.GRPC,
        transport_api_version=v3,
        grpc_services=[grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=XDS_CLUSTER))],
        set_node_on_first_message_only=True,
    ))
    for source in (dynamic.lds_config, dynamic.cds_config):
        source.ads.SetInParent()
        source.resource_api_version = v3
    bootstrap.static_resources.clusters.append(_xds_cluster(xds_host, xds_port, tls))
    return bootstrap


_YAML_11_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"})


class _Dumper(yaml.SafeDumper):
    """Quotes words that YAML 1.1 readers (Envoy's) take for booleans or null, and writes
    multi-line strings as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if value.lower() in _YAML_11_WORDS:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_str(value)


_Dumper.add_representer(str, _represent_str)


def message_yaml(message: Message, header: Sequence[str] = ()) -> str:
    """``message`` as YAML (proto field names), after ``# `` comment lines ``header``."""
    data = json.loads(json_format.MessageToJson(message, preserving_proto_field_name=True))
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     width=100)
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header)
    return comments + body
