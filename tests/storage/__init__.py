"""Storage engines (file, memory, postgres): logs, recovery, fsync, faults, durability."""
