"""The PostgreSQL rows: this broker on ``postgres://`` against the raw PostgreSQL limit of
the same server with the same client library (psycopg 3), no broker, side by side.

One throwaway server (``edge/local_postgres.py``, as the tests and ``edge-broker cluster``
start it: Debian's binaries, ``fsync=on``) serves every trial. A trial:

1. **broker**: this broker on a new database of that server; the Python producer sends
   ``--postgres-records`` records of ``--postgres-size`` bytes round-robin over
   ``--postgres-partitions`` partitions (``acks=all``, ``linger.ms`` as elsewhere), then
   the consumer reads them back: the same workers and settings as the other rows. Then
   librdkafka's C client (``rdkafka_performance``, bench/cclient.py) reads the same
   records again, all partitions by one client (``-p`` once per partition: one process,
   one queue, no group, so no join time), first record to last over all of them. The
   Python consumer is the ceiling of its own row (with no database, on memory://, it
   reaches about 0.6x of the raw read limit while the broker idles); the C client's row
   is the one that measures the broker;
2. **raw**: the very batches the broker stored (``edge_entries`` of that database, in the
   order they were appended) are inserted into a table created ``LIKE edge_entries`` on
   the same server, with psycopg 3 from one connection, then selected back by primary key.
   Two ways of inserting: ``raw, grouped`` commits ``--postgres-raw-group`` batches at a
   time (``executemany`` in a transaction: the most the server takes); ``raw, a commit
   per batch`` commits each one (what a broker that commits every batch alone could reach
   at best). Two ways of reading: in pages of what a consumer's fetch asks of a partition
   (``FETCH_BYTES``, as the broker's read takes them: the raw limit of consume), and in
   pages of ``_PAGE_ROWS`` rows (the server's bulk rate).

3. **memory://**: this broker with no database under the same load, for scale: what the
   load generators and the broker reach without PostgreSQL.

Records/s of the broker are the workers' (first produce() to last delivery report); of the
raw runs, records inserted (or read) over the time the statements took. The target is the
broker at 70% or more of the raw limit: the Python producer against ``raw, grouped`` for
produce, the C client's consume against fetch-sized pages for consume (median of the
per-trial ratios, as the Tansu rows do). Without a C client (no compiler, or
``--no-c-client``) the Python consumer's row decides consume, and the output says so.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

import psycopg

from bench.admin import create_topic
from bench.brokers import EdgeBroker
from bench.pinning import inherited_affinity
from bench.report import median
from bench.runner import MB, Bench, LoadError, run_worker
from edge.local_postgres import LocalPostgres

TARGET_SHARE = 0.7
"""The broker's throughput against the raw limit's, for produce and consume."""
_PAGE_ROWS = 64
"""Rows per SELECT of the bulk read back (as the broker pages through a partition when
its producer state is rebuilt)."""
FETCH_BYTES = 1 << 20
"""librdkafka's ``max.partition.fetch.bytes``: what a consumer's fetch asks of a partition
(the broker's read takes the first batch whole, then those that fit)."""
_TOPIC = "bench-postgres"
_INSERT = ("INSERT INTO raw_entries (partition_id, base_offset, last_offset, segment_base,"
           " broker_ts, max_ts, size, batch) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)")
_COLUMNS = "partition_id, base_offset, last_offset, segment_base, broker_ts, max_ts, size, batch"

Row = tuple[int, int, int, int, int, int, int, bytes]


def _say(what: str) -> None:
    print(f"[bench] postgres: {what}", file=sys.stderr, flush=True)


def _rate(records: int, seconds: float, size: int) -> dict[str, float]:
    seconds = max(seconds, 1e-9)
    return {"records": records, "seconds": seconds, "records_per_s": records / seconds,
            "mb_per_s": records * size / seconds / MB}


def _stored_batches(url: str) -> list[Row]:
    """The broker's entry rows, in the order they were appended."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT {_COLUMNS} FROM edge_entries ORDER BY broker_ts,"
                            " partition_id, base_offset", binary=True).fetchall()
    return [(int(a), int(b), int(c), int(d), int(e), int(f), int(g), bytes(h))
            for a, b, c, d, e, f, g, h in rows]


def _beside_me(conn: psycopg.Connection[Any]) -> None:
    """Pin the server process of ``conn`` to this harness's CPUs, for the raw reads: the
    client and the server then hand each small page to each other on one CPU, the
    fastest way here (1 MiB pages: about 800,000 records/s against 400,000-700,000 with
    the server process anywhere, on two CPUs). The raw inserts leave it anywhere: the
    server's work is the larger part there, and a CPU of its own makes them faster
    (about 130,000-145,000 records/s against 100,000-130,000 beside the client)."""
    with contextlib.suppress(OSError):  # not ours to pin (another user's server): as it is
        os.sched_setaffinity(conn.info.backend_pid, os.sched_getaffinity(0))


def _fresh_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP TABLE IF EXISTS raw_entries")
    conn.execute("CREATE TABLE raw_entries (LIKE edge_entries INCLUDING ALL)")
    conn.execute("CHECKPOINT")  # both inserts start from the same quiet server


def _insert(url: str, rows: list[Row], group: int) -> float:
    """Insert ``rows`` committing ``group`` at a time; the seconds it took."""
    with psycopg.connect(url, autocommit=True) as conn:
        _fresh_table(conn)
        began = time.perf_counter()
        if group <= 1:
            for row in rows:
                conn.execute(_INSERT, row)
        else:
            with conn.cursor() as cursor:
                for start in range(0, len(rows), group):
                    with conn.transaction():
                        cursor.executemany(_INSERT, rows[start:start + group])
        return time.perf_counter() - began


def _pages(rows: list[Row], page_bytes: int | None) -> dict[int, list[int]]:
    """Rows per SELECT, partition by partition: ``_PAGE_ROWS`` each, or with
    ``page_bytes`` as many as a fetch of that many bytes per partition takes (the first
    row whole, then those that fit with it)."""
    pages: dict[int, list[int]] = {}
    for partition in sorted({row[0] for row in rows}):
        sizes = [row[6] for row in sorted(r for r in rows if r[0] == partition)]
        counts: list[int] = []
        at = 0
        while at < len(sizes):
            count, taken = 1, sizes[at]
            while at + count < len(sizes) and (
                    taken + sizes[at + count] <= page_bytes if page_bytes is not None
                    else count < _PAGE_ROWS):
                taken += sizes[at + count]
                count += 1
            counts.append(count)
            at += count
        pages[partition] = counts
    return pages


def _select(url: str, pages: dict[int, list[int]]) -> tuple[int, float]:
    """Read every row back by primary key, page by page; (records, seconds)."""
    records = 0
    with psycopg.connect(url, autocommit=True) as conn:
        _beside_me(conn)
        began = time.perf_counter()
        for partition, counts in pages.items():
            offset = 0
            for count in counts:
                page = conn.execute(
                    "SELECT base_offset, last_offset, max_ts, broker_ts, batch FROM raw_entries"
                    " WHERE partition_id = %s AND base_offset >= %s ORDER BY base_offset"
                    " LIMIT %s", (partition, offset, count), binary=True).fetchall()
                for _, last, _, _, _ in page:
                    records += int(last) + 1 - offset
                    offset = int(last) + 1
        return records, time.perf_counter() - began


def _raw(url: str, size: int, group: int) -> dict[str, Any]:
    rows = _stored_batches(url)
    records = sum(row[2] - row[1] + 1 for row in rows)
    one = _insert(url, rows, 1)
    grouped = _insert(url, rows, group)  # the table it leaves is read back
    read, read_s = _select(url, _pages(rows, FETCH_BYTES))
    bulk, bulk_s = _select(url, _pages(rows, None))
    if read != records or bulk != records:
        raise LoadError(f"postgres raw: read {read} and {bulk} of {records} records back")
    mean = sum(row[6] for row in rows) / max(len(rows), 1)
    return {"batches": len(rows), "mean_batch_bytes": mean,
            "produce": _rate(records, grouped, size), "produce_one": _rate(records, one, size),
            "consume": _rate(read, read_s, size), "consume_bulk": _rate(bulk, bulk_s, size)}


def _broker(bench: Bench, url: str) -> dict[str, Any]:
    opts = bench.opts
    count, size = opts.postgres_records, opts.postgres_size
    broker = EdgeBroker({"storageUrl": url})
    broker.start(bench.cpus.broker)
    try:
        create_topic(broker.bootstrap, _TOPIC, opts.postgres_partitions)
        out: dict[str, Any] = {}
        phases: list[tuple[str, str, dict[str, Any]]] = [("produce", "produce", {}),
                                                         ("consume", "consume", {})]
        if bench.c_client is not None:
            phases.append(("consume_c", "cconsume", {"binary": bench.c_client}))
        for phase, mode, extra in phases:
            done = run_worker(bench, broker, mode, _TOPIC, size=size, count=count,
                              partitions=opts.postgres_partitions, **extra)
            if done.load["records"] != count:
                raise LoadError(f"postgres broker: {mode} handled {done.load['records']} "
                                f"of {count}")
            out[phase] = {**_rate(count, float(done.load["seconds"]), size),
                          "broker_cpu_s": done.broker_cpu_s,
                          "client_cpu_s": done.load["client_cpu_s"]}
        return out
    finally:
        broker.stop()


def _ratios(trials: list[dict[str, Any]], phase: str, raw_phase: str) -> list[float]:
    return [t["broker"][phase]["records_per_s"] / t["raw"][raw_phase]["records_per_s"]
            for t in trials if t["raw"][raw_phase]["records_per_s"] > 0]


def consume_phase(pg: dict[str, Any]) -> str:
    """The broker's consume row that decides the target: the C client's when it ran."""
    return "consume_c" if pg["c_client"] else "consume"



def run_postgres(bench: Bench) -> dict[str, Any]:
    """Every trial of the broker and the raw limit; the medians and each trial's figures."""
    opts = bench.opts
    _say("starting a PostgreSQL server")
    # on every CPU, not only the load generators' that this harness is pinned to
    with inherited_affinity(frozenset(range(os.cpu_count() or 1))):
        server = LocalPostgres.running()
    trials: list[dict[str, Any]] = []
    try:
        for trial in range(opts.repeat):
            url = server.new_database_url()
            _say(f"broker, {opts.postgres_records:,} x {opts.postgres_size} B over "
                 f"{opts.postgres_partitions} partition(s), trial {trial + 1}/{opts.repeat}")
            broker = _broker(bench, url)
            _say(f"raw psycopg, the same batches, trial {trial + 1}/{opts.repeat}")
            raw = _raw(url, opts.postgres_size, opts.postgres_raw_group)
            _say(f"broker on memory://, the same load, trial {trial + 1}/{opts.repeat}")
            trials.append({"broker": broker, "raw": raw,
                           "memory": _broker(bench, "memory://")})
    finally:
        try:
            server.stop()
        finally:
            server.remove()
    summary: dict[str, Any] = {
        "records": opts.postgres_records, "size": opts.postgres_size,
        "partitions": opts.postgres_partitions, "raw_group": opts.postgres_raw_group,
        "c_client": bench.c_client is not None, "trials": trials}
    consume = consume_phase(summary)
    summary["consume_decided_by"] = consume
    summary["produce_ratio"] = median(_ratios(trials, "produce", "produce"))
    summary["consume_ratio"] = median(_ratios(trials, consume, "consume"))
    summary["consume_python_ratio"] = median(_ratios(trials, "consume", "consume"))
    ours = ("produce", "consume", *(("consume_c",) if bench.c_client else ()))
    for side, phases in (("broker", ours), ("memory", ours),
                         ("raw", ("produce", "produce_one", "consume", "consume_bulk"))):
        summary[side] = {phase: median([t[side][phase]["records_per_s"] for t in trials])
                         for phase in phases}
    summary["batches"] = median([float(t["raw"]["batches"]) for t in trials])
    summary["mean_batch_bytes"] = median([t["raw"]["mean_batch_bytes"] for t in trials])
    summary["broker_cpu_s"] = median([t["broker"]["produce"]["broker_cpu_s"]
                                      + t["broker"]["consume"]["broker_cpu_s"] for t in trials])
    return summary


def _cell(rate: float, size: int) -> str:
    return f"{rate:,.0f} ({rate * size / MB:,.1f})"


def markdown(pg: dict[str, Any]) -> str:
    """The PostgreSQL table and its target line."""
    size = pg["size"]
    lines = [f"PostgreSQL engine: {pg['records']:,} records of {size} B over "
             f"{pg['partitions']} partition(s), {len(pg['trials'])} trial(s) (medians); "
             f"{pg['batches']:,.0f} batches of {pg['mean_batch_bytes']:,.0f} B on average.",
             "",
             "| metric | this broker, postgres:// | raw psycopg 3 | broker / raw |",
             "|---|--:|--:|--:|"]
    decides = consume_phase(pg)
    fetch_pages = f"raw pages of a fetch ({FETCH_BYTES >> 20} MiB a partition)"
    rows = [("produce", "produce", "produce_ratio", "produce (Python producer): records/s "
             f"(MB/s), raw commits of {pg['raw_group']} batches (decides produce)"),
            ("produce", "produce_one", None, "produce (Python producer): records/s (MB/s), "
             "raw commit per batch")]
    if pg["c_client"]:
        rows.append(("consume_c", "consume", "consume_ratio", "consume (C client, "
                     f"all partitions): records/s (MB/s), {fetch_pages} (decides consume)"))
    python = "" if pg["c_client"] else " (decides consume: no C client)"
    rows += [("consume", "consume", "consume_python_ratio", "consume (Python consumer): "
              f"records/s (MB/s), {fetch_pages}{python}"),
             ("consume", "consume_bulk", None, "consume (Python consumer): records/s "
              f"(MB/s), raw pages of {_PAGE_ROWS} rows")]
    for phase, raw_phase, ratio_key, label in rows:
        ours, raw = pg["broker"][phase], pg["raw"][raw_phase]
        ratio = (f"{pg[ratio_key]:.2f}x" if ratio_key is not None
                 else f"{ours / raw:.2f}x" if raw > 0 else "-")
        lines.append(f"| {label} | {_cell(ours, size)} | {_cell(raw, size)} | {ratio} |")
    for phase, client in (("produce", "Python producer"), ("consume", "Python consumer"),
                          ("consume_c", "C client")):
        if phase in pg["memory"]:
            lines.append(f"| {phase[:7]} ({client}): records/s (MB/s), this broker on "
                         "memory:// (no database: the load's own limit here) | "
                         f"{_cell(pg['memory'][phase], size)} | - | - |")
    lines.append(f"| broker CPU s, produce + consume | {pg['broker_cpu_s']:.2f} | - | - |")
    if decides == "consume":
        lines += ["", "No C client (rdkafka_performance) here: the consume target falls back "
                  "to the Python consumer's row, which is bounded by that client."]
    return "\n".join(lines)


def target(pg: dict[str, Any]) -> dict[str, Any]:
    """The PostgreSQL target: at least 70% of the raw limit, produce (Python producer)
    and consume (the C client; the Python consumer when there is no C client)."""
    produce, consume = pg["produce_ratio"], pg["consume_ratio"]
    by = "C client" if consume_phase(pg) == "consume_c" else "Python consumer: no C client"
    return {"target": f"postgres:// >= {TARGET_SHARE:.0%} of raw PostgreSQL, produce and "
                      "consume",
            "met": produce >= TARGET_SHARE and consume >= TARGET_SHARE,
            "detail": f"produce {produce:.2f}x, consume {consume:.2f}x ({by}; Python "
                      f"consumer {pg['consume_python_ratio']:.2f}x)"}
