"""The cluster: membership and partition ownership (``service``), and where partitions
belong among the live brokers (``placement``)."""
