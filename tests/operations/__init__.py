"""Running the broker: CLI, config, process, logs, metrics, deploy files, README."""
