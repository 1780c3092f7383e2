"""Real-client compatibility: every client end to end, the Java client, kafka-python's own suite."""
