"""A faust-streaming app for tests (``tests/compaction/test_compaction_faust.py``), run as its own
worker process: ``python -m faust -A tests.faust_app worker``.

One agent reads the source topic and sets ``latest[key] = value`` in a table kept in
faust's default in-memory store, so the table lives only in its changelog topic (which
faust creates compacted; the extra configs make its segments small so the broker's
cleaner has sealed ledgers to clean). Each time the table has been recovered from its
changelog, before the agent's source partitions resume, the worker prints one stderr line
``faust-app recovered: {json}`` with the table's contents, for the test to read.

Settings come from the environment: ``FAUST_APP_BROKER`` (``host:port``),
``FAUST_APP_ID``, ``FAUST_APP_SOURCE`` (the source topic), ``FAUST_APP_DATADIR``,
``FAUST_APP_GUARANTEE`` (``at_least_once``, the default, or ``exactly_once``).
"""

from __future__ import annotations

import json
import os
import sys

import faust

CHANGELOG_CONFIGS = {"segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01"}
RECOVERED = "faust-app recovered: "

app = faust.App(
    os.environ.get("FAUST_APP_ID", "faust-app"),
    broker=f"kafka://{os.environ.get('FAUST_APP_BROKER', '127.0.0.1:9092')}",
    datadir=os.environ.get("FAUST_APP_DATADIR", "faust-app-data"),
    processing_guarantee=os.environ.get("FAUST_APP_GUARANTEE", "at_least_once"),
    store="memory://",
    topic_partitions=1,
    topic_replication_factor=1,
    web_enabled=False,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=0.5,
    producer_max_batch_size=4096,  # no batch larger than a changelog segment
)

source = app.topic(os.environ.get("FAUST_APP_SOURCE", "updates"),
                   key_type=bytes, value_type=bytes, key_serializer="raw",
                   value_serializer="raw", partitions=1)
latest = app.Table("latest", partitions=1, key_type=str, value_type=str,
                   extra_topic_configs=CHANGELOG_CONFIGS)


@latest.on_recover
async def report_recovered() -> None:
    """Print the table as recovered from its changelog."""
    contents = dict(latest.items())
    print(RECOVERED + json.dumps(contents, sort_keys=True), file=sys.stderr, flush=True)


@app.agent(source)
async def keep_latest(stream: faust.StreamT[bytes]) -> None:
    """Keep each key's latest value."""
    async for event in stream.events():
        assert isinstance(event.key, bytes) and isinstance(event.value, bytes)
        latest[event.key.decode()] = event.value.decode()
