"""``edge-broker admin``: the operator's command line, a Kafka client of the broker.

It talks to a running broker over the Kafka protocol only (kafka-python's admin client,
producer and consumer), with the same security settings as any client, so authorization
stays the broker's job. ``commands`` builds the command line and runs a verb;
``connection`` turns flags and a client properties file into client settings (``bearer``
its OIDC logins, ``jaas`` its ``sasl.jaas.config``);
``output`` prints tables or JSON; one module per group of verbs: ``topics``, ``groups``,
``acls``, ``quotas``, ``cluster``, ``tokens`` and ``records`` (produce and consume).
"""
