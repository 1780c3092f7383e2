"""Envoy in front of the broker: bootstraps and an ADS server built from ``xds-protos``.

Operators run one Envoy listener per broker, advertised to clients through
``kafkaAdvertisedListeners``; Envoy proxies (``tcp_proxy``) to the broker's internal
listener and adds TLS termination, SNI routing, source-CIDR rules, connection limits,
connection rate limits and access logs.  The modules:

``model``       the plan: brokers to front (:class:`BrokerRoute`) and edge options
``brokers``     where brokers come from: a broker config, ``ID=ADV@INTERNAL`` specs, a file,
                the records of a cluster's registry
``registry``    the live brokers of a cluster's database, read only, with a fingerprint
``source``      those inputs, re-readable, with a fingerprint of the watched files
``filters``     network filters and access logs
``contrib``     the contrib ``kafka_broker`` filter message (absent from ``xds-protos``)
``resources``   Envoy listeners and clusters for a plan
``bootstrap``   static and dynamic (ADS) bootstraps, and YAML output
``snapshot``    versioned listener/cluster sets for the ADS server
``ads``         the Aggregated Discovery Service (state of the world, ACK/NACK)
``xds_server``  the ``edge-broker xds-server`` process: gRPC, reload on change, status
``commands``    the ``envoy-config`` and ``xds-server`` subcommands
"""
