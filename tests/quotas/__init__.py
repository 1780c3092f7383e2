"""Quotas and per-connection limits."""
