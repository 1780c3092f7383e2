"""Client quotas as Kafka defines them, plus tenants and namespaces: the entities and which
one applies to a caller (``entities``), their storage in the key-value area (``store``),
the sliding-window rates and throttle times (``rates``, ``manager``) and the
DescribeClientQuotas / AlterClientQuotas APIs (``apis``)."""
