"""SASL mechanisms and the per-connection SASL state."""
