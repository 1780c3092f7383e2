"""Transactions, idempotent producers and producer state."""
