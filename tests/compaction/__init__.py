"""Log compaction: cleaning, topic configs, clients on compacted topics."""
