"""Several brokers on one PostgreSQL: registry, failover, propagation, the change feed."""
