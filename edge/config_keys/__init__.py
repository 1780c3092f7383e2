"""The broker configuration's keys, one module per area, each a few groups of keys
(pydantic models holding fields only) that :class:`edge.config.BrokerConfig` inherits."""
