"""Envoy in front of the broker: generated configs, xDS, policies, clients through it."""
