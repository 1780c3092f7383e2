"""What walking records costs (``validateRecords``): ``python -m bench.record_walk``.

Batches as kafka-python's encoder writes them (uncompressed; a key and a value of the
given size per record, no headers), walked by the Python walker and by the C walker
(:mod:`broker_core.codec.record_walk`, as loaded: ``make`` builds it,
``$EDGE_RECORD_WALK_LIB`` names another) through
:func:`broker_core.codec.records.walk_records`, the broker's entry, with the batch as a
read-only memoryview as the broker hands it over. Each figure is the
best of ``--repeat`` timings of ``--rounds`` walks, in µs per record (the per-batch call
cost included: see the 1-record rows).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from kafka.record.default_records import DefaultRecordBatchBuilder

from broker_core.codec.batch_header import BATCH_HEADER_SIZE
from broker_core.codec.record_walk import NATIVE, NOTE, NativeWalker
from broker_core.codec.records import walk_records


def _batch(records: int, size: int) -> memoryview:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 26)
    value = bytes(range(256)) * (size // 256 + 1)
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"key-%06d" % i,
                       value=value[:size], headers=[])
    return memoryview(bytes(builder.build()))


def _per_record(batch: memoryview, records: int, native: NativeWalker | None,
                rounds: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(rounds):
            walk_records(batch, BATCH_HEADER_SIZE, records, False, native)
        best = min(best, time.perf_counter() - started)
    return best / rounds / records * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[1, 1000],
                        help="records per batch")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1024],
                        help="value bytes per record")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    print(NOTE)
    print(f"{'value':>6} {'records':>8} {'python us/rec':>14} {'C us/rec':>10} {'ratio':>7}")
    for size in args.sizes:
        for records in args.records:
            batch = _batch(records, size)
            rounds = max(1, 20_000 // records)
            python = _per_record(batch, records, None, max(1, rounds // 10), args.repeat)
            if NATIVE is None:
                print(f"{size:>6} {records:>8} {python:>14.3f} {'-':>10} {'-':>7}")
                continue
            native = _per_record(batch, records, NATIVE, rounds, args.repeat)
            print(f"{size:>6} {records:>8} {python:>14.3f} {native:>10.4f} "
                  f"{python / native:>6.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
