"""Developer tools run by hand or by tests, never imported by the broker."""
