"""The group coordinator: consumer group membership, rebalances and committed offsets,
persisted as records of the internal topic ``__consumer_offsets``."""
