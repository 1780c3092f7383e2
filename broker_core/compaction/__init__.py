"""The log cleaner of compacted topics: ``records`` (a batch's records and the batches it
writes back), ``cleaning`` (cleaning one partition), ``cleaner`` (the thread that picks
partitions, paces its I/O and counts)."""
