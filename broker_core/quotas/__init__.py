"""Client quotas as Kafka defines them, plus tenants and namespaces: the entities and which
ones apply to a caller, the tenant's own quota as a ceiling (``entities``), their storage
in the key-value area (``store``), the sliding-window rates and throttle times (``rates``,
``manager``), KIP-599's partition mutations of topic changes against
``controller_mutation_rate`` (``mutations``), new connections against their quotas
(``admission``), the tenant caps on topics, partitions and stored bytes (``limits``),
rate-limited refusal lines (``notices``) and the DescribeClientQuotas /
AlterClientQuotas APIs (``apis``)."""
