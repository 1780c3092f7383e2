"""Consumer groups: membership state machine, coordinator, offsets, restarts."""
