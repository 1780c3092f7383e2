"""The composition root: configuration, CLI, per-connection sessions and policy."""
